"""The vendors' visibility variables, as the real runtimes read them, each case in a fresh
process (the simulator reads the variable once, at its first call).

- ``ASCEND_RT_VISIBLE_DEVICES`` (CANN's Runtime::GetVisibleDevices): runs of digits split by
  single commas; any other character, a second comma or an id past the last device ends the
  list; a value that repeats an id, is not ascending, is empty, does not start with a digit
  or lists no device leaves no usable device (aclrtGetDeviceCount: ACL_ERROR_RT_NO_DEVICE).
- ``HIP_VISIBLE_DEVICES`` (ROCm clr's rocdevice.cpp): unset or empty falls back to
  ``CUDA_VISIBLE_DEVICES``, then all devices; entries must be exact decimal indices; the first
  entry that is not ends the list; repeated indices are skipped; list order.
- ``XPU_VISIBLE_DEVICES``: CUDA's rule; ``xpu_device_list`` gives the physical numbers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from anychip.runtime._libs import find_library

ACL_ERROR_RT_NO_DEVICE = 207004
HIP_ERROR_NO_DEVICE = 100

# The child loads the library with ctypes and reports (status, visible count, physical ids).
CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
vendor = sys.argv[2]
n = ctypes.c_int(-1)
if vendor == "acl":
    rc = lib.aclrtGetDeviceCount(ctypes.byref(n))
    msg = lib.aclGetRecentErrMsg
    msg.restype = ctypes.c_char_p
    detail = (msg() or b"").decode()
elif vendor == "hip":
    rc = lib.hipGetDeviceCount(ctypes.byref(n))
    detail = ""
else:
    rc = lib.xpu_device_count(ctypes.byref(n))
    ids = (ctypes.c_int * 64)()
    assert lib.xpu_device_list(ids) == 0
    detail = list(ids[: max(n.value, 0)])
count = n.value if rc == 0 else 0
phys = [lib.anychip_sim_physical_device(i) for i in range(count)]
print(json.dumps([rc, phys, detail]))
"""

LIBS = {"acl": "libascend_sim", "hip": "libhygon_sim", "xpu": "libkunlun_sim"}


def visible(vendor: str, **env: str) -> list:
    path = find_library(LIBS[vendor])
    if path is None:
        pytest.skip(f"{LIBS[vendor]} is not built")
    full = {k: v for k, v in os.environ.items()
            if not k.endswith("VISIBLE_DEVICES") and not k.startswith("ANYCHIP_SIM")}
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", CHILD, path, vendor], capture_output=True, text=True, env=full,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("value,devices", [
    ("0,2,5", [0, 2, 5]),
    ("1,3,8", [1, 3]),            # 8 is past the last of 8 devices: the list ends there
    ("1, 2,3", [1]),              # a blank ends the list
    ("1,,2", [1]),                # so does a second comma
    ("4,x", [4]),
    ("7", [7]),
])
def test_ascend_visible_devices_accepted(value, devices):
    rc, phys, _ = visible("acl", ASCEND_RT_VISIBLE_DEVICES=value)
    assert rc == 0 and phys == devices


@pytest.mark.parametrize("value,why", [
    ("3,1", "the ids must be in ascending order"),
    ("1,1", "an id is repeated"),
    ("2,5,5", "an id is repeated"),
    ("", "it must start with a device id"),
    (" 1", "it must start with a device id"),
    ("x1", "it must start with a device id"),
    ("9", "no listed id is a device"),
])
def test_ascend_visible_devices_rejected(value, why):
    rc, phys, detail = visible("acl", ASCEND_RT_VISIBLE_DEVICES=value)
    assert rc == ACL_ERROR_RT_NO_DEVICE and phys == []
    assert detail == (f'aclrtGetDeviceCount: ASCEND_RT_VISIBLE_DEVICES="{value}" is rejected: {why} '
                      "(ascending device ids from 0 to 7, separated by commas)")


def test_ascend_unset_lists_every_device_and_sim_devices_zero_is_not_an_error():
    assert visible("acl") == [0, list(range(8)), ""]
    assert visible("acl", ANYCHIP_SIM_DEVICES="0") == [0, [], ""]


@pytest.mark.parametrize("env,devices", [
    ({"HIP_VISIBLE_DEVICES": "6,2,6,1"}, [6, 2, 1]),            # repeats skipped, list order
    ({"HIP_VISIBLE_DEVICES": "3,x,1"}, [3]),                    # a malformed entry ends the list
    ({"HIP_VISIBLE_DEVICES": "2, 1"}, [2]),                     # " 1" is not exactly an index
    ({"HIP_VISIBLE_DEVICES": "01,2"}, []),                      # neither is "01"
    ({"HIP_VISIBLE_DEVICES": "4,9,1"}, [4]),                    # nor one past the last device
    ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "5,4"}, [5, 4]),   # empty: CUDA's variable
    ({"CUDA_VISIBLE_DEVICES": "3"}, [3]),
    ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}, list(range(8))),  # both empty: all
    ({"HIP_VISIBLE_DEVICES": "7", "CUDA_VISIBLE_DEVICES": "5"}, [7]),
])
def test_hip_visible_devices(env, devices):
    rc, phys, _ = visible("hip", **env)
    assert phys == devices
    assert rc == (0 if devices else HIP_ERROR_NO_DEVICE)


def test_xpu_device_list_gives_physical_numbers():
    assert visible("xpu", XPU_VISIBLE_DEVICES="5,2,7") == [0, [5, 2, 7], [5, 2, 7]]
    assert visible("xpu", XPU_VISIBLE_DEVICES="3,3,1") == [0, [3], [3]]
    assert visible("xpu") == [0, list(range(8)), list(range(8))]
