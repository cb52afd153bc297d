"""The simulator libraries are real C libraries with the vendors' ABI.

C programs in tests/c/ include the shipped vendor headers (csrc/include, installed as
anychip/_include: acl/acl.h, xpu/runtime.h, hip/hip_runtime_api.h, anychip/sim.h) exactly
as code written for the vendor's headers does, are linked against a simulator library with
gcc and run. ``nm -D`` shows the vendor's symbol names in each library.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from anychip.chips._headers import include_dir
from anychip.runtime._libs import find_library

HERE = os.path.dirname(os.path.abspath(__file__))

# program, simulator library, line printed on success, environment
PROGRAMS = [
    ("acl_abi.c", "libascend_sim", "acl ok", {}),
    ("xpu_abi.c", "libkunlun_sim", "xpu ok", {}),
    ("hip_abi.c", "libhygon_sim", "hip ok", {}),
    ("acl_fidelity.c", "libascend_sim", "acl fidelity ok", {}),
    ("acl_stream_context.c", "libascend_sim", "acl stream context ok", {}),
    ("acl_runtime_calls.c", "libascend_sim", "acl runtime calls ok", {}),
    ("acl_event_stream_order.c", "libascend_sim", "acl event stream order ok", {}),
    ("hip_fidelity.c", "libhygon_sim", "hip fidelity ok", {}),
    ("hip_stream_ordered.c", "libhygon_sim", "hip stream-ordered ok", {}),
    ("hip_null_stream.c", "libhygon_sim", "hip null stream ok", {}),
    ("xpu_fidelity.c", "libkunlun_sim", "xpu fidelity ok", {"XPU_VISIBLE_DEVICES": "5,2,7"}),
]

SYMBOLS = {
    "libascend_sim": """aclInit aclFinalize aclrtCreateContext aclrtDestroyContext aclrtSetCurrentContext
        aclrtGetCurrentContext aclrtResetEvent aclrtQueryEventWaitStatus aclrtSubscribeReport aclrtProcessReport
        aclrtUnSubscribeReport aclprofInit aclprofFinalize aclprofCreateConfig aclprofDestroyConfig aclprofStart
        aclprofStop aclprofCreateStepInfo aclprofDestroyStepInfo aclprofGetStepTimestamp aclrtSetDevice aclrtResetDevice
        aclrtGetDevice aclrtGetDeviceCount
        aclrtMalloc aclrtFree aclrtMallocHost aclrtFreeHost aclrtMemcpy aclrtMemcpyAsync aclrtMemset
        aclrtMemsetAsync aclrtCreateStream aclrtDestroyStream aclrtSynchronizeStream aclrtSynchronizeDevice
        aclrtCreateEvent aclrtDestroyEvent aclrtRecordEvent aclrtStreamWaitEvent aclrtSynchronizeEvent
        aclrtQueryEventStatus aclrtEventElapsedTime aclrtGetMemInfo aclGetRecentErrMsg aclrtLaunchHostFunc
        aclrtGetDeviceInfo aclrtGetLastError aclrtPeekAtLastError""",
    "libkunlun_sim": """xpu_get_driver_version xpu_device_list xpu_set_device xpu_current_device xpu_device_count
        xpu_malloc
        xpu_free xpu_host_alloc
        xpu_host_free xpu_memcpy xpu_memcpy_async xpu_memcpy_peer xpu_stream_create xpu_stream_destroy xpu_wait
        xpu_event_create xpu_event_record xpu_event_destroy xpu_event_wait xpu_stream_wait_event""",
    "libhygon_sim": """hipGetDevicePropertiesR0600 hipDeviceGetAttribute hipMalloc hipFree hipHostMalloc hipHostFree
        hipMemcpy
        hipMemcpyAsync hipMemset hipMemsetAsync
        hipSetDevice hipGetDevice hipGetDeviceCount hipStreamCreate hipStreamDestroy hipStreamSynchronize
        hipStreamQuery hipStreamGetFlags hipEventCreate hipEventDestroy hipEventRecord hipEventSynchronize hipEventQuery
        hipEventElapsedTime hipStreamWaitEvent hipMemGetInfo hipDeviceSynchronize hipGetErrorString
        hipExtHostAlloc hipFreeHost hipMallocAsync hipFreeAsync hipMallocFromPoolAsync hipDeviceGetDefaultMemPool
        hipDeviceGetMemPool hipDeviceSetMemPool hipMemPoolSetAttribute hipMemPoolGetAttribute hipMemPoolTrimTo""",
}
CONTROLS = "anychip_sim_stream_hold anychip_sim_stream_release anychip_sim_ipc_get_handle anychip_sim_ipc_open"


def _library(name: str) -> str:
    path = find_library(name)
    if path is None:
        pytest.skip(f"{name} is not built (python setup.py build_ext --inplace)")
    return path


@pytest.mark.parametrize("source,libname,expected,extra_env", PROGRAMS, ids=[p[0][:-2] for p in PROGRAMS])
def test_c_program_through_vendor_names(tmp_path, source, libname, expected, extra_env):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    lib = _library(libname)
    exe = tmp_path / source.replace(".c", "")
    libdir, libfile = os.path.split(lib)
    build = subprocess.run(
        [gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Werror=implicit-function-declaration", f"-I{include_dir()}",
         "-o", str(exe),
         os.path.join(os.path.dirname(HERE), "c", source),
         f"-L{libdir}", f"-l:{libfile}", f"-Wl,-rpath,{libdir}", "-lpthread"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith("ANYCHIP_SIM")}
    env.update(extra_env)
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert expected in run.stdout


@pytest.mark.parametrize("libname", sorted(SYMBOLS))
def test_nm_shows_vendor_symbols(libname):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    lib = _library(libname)
    out = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    missing = [s for s in (SYMBOLS[libname] + " " + CONTROLS).split() if s not in exported]
    assert not missing, f"{libname} does not export {missing}"
    # the core stays private: nothing but vendor names and the documented anychip_sim_* controls
    private = sorted(s for s in exported if s.startswith("sim_"))
    assert not private, private
