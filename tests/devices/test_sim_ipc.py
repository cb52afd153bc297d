"""Simulated device memory shared between processes, as CUDA IPC handles share an
allocation: another process maps the same pages and uses them as device memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import CHILD_SECONDS

from anychip.chips.ascend import AscendPlugin
from anychip.chips.hygon import HygonPlugin
from anychip.chips.kunlun import KunlunPlugin
from anychip.runtime.errors import DeviceError
from anychip.runtime.plugin import D2H, H2D

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = {"ascend": AscendPlugin, "kunlun": KunlunPlugin, "hygon": HygonPlugin}

CHILD = """
    import json, sys
    import numpy as np
    from anychip.chips.{module} import {cls}
    from anychip.runtime.errors import DeviceError
    p = {cls}(); p.available()
    addr = p.sim_ipc_open(bytes.fromhex(sys.argv[1]))
    n = int(sys.argv[2])
    s = p._default_stream(0)
    seen = np.zeros(n, np.uint8)
    p._copy(0, seen, 0, addr, 0, n, "d2h", s)          # the parent's bytes, read in place
    reply = np.full(n, 0x77, np.uint8)
    p._copy(0, addr, 0, reply, 0, n // 2, "h2d", s)    # and written back
    p._stream_synchronize(0, s)
    try:
        p._copy(0, seen, 0, addr, 1, n, "d2h", s); past = None
    except DeviceError as e:
        past = e.code_name
    p.sim_ipc_close(addr)
    try:
        p._copy(0, seen, 0, addr, 0, 1, "d2h", s); closed = None
    except DeviceError as e:
        closed = e.code_name
    print(json.dumps({{"sum": int(seen.astype(np.int64).sum()), "first": seen[:4].tolist(),
                       "past": past, "closed": closed}}))
"""


@pytest.mark.parametrize("name", sorted(PLUGINS))
@pytest.mark.slow
def test_another_process_maps_the_allocation(name):
    cls = PLUGINS[name]
    p = cls()
    ok, _ = p.available()
    if not ok or not p.simulated:
        pytest.skip(f"{name}: needs the simulator")
    n = 3 * 4096 + 100
    h = p._malloc(0, n)
    data = (np.arange(n) % 251).astype(np.uint8)
    s = p._default_stream(0)
    p._copy(0, h, 0, data, 0, n, H2D, s)
    p._stream_synchronize(0, s)
    blob = p.sim_ipc_handle(h + 10)                # any address inside names the whole allocation
    assert len(blob) == 64

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANYCHIP_", "ASCEND_", "XPU_", "HIP_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = textwrap.dedent(CHILD.format(module=name, cls=cls.__name__))
    proc = subprocess.run([sys.executable, "-c", code, blob.hex(), str(n)], capture_output=True, text=True,
                          env=env, timeout=CHILD_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["sum"] == int(data.astype(np.int64).sum()) and child["first"] == [0, 1, 2, 3]
    assert child["past"] is not None and child["closed"] is not None   # still checked like device memory

    out = np.zeros(n, np.uint8)
    p._copy(0, out, 0, h, 0, n, D2H, s)
    p._stream_synchronize(0, s)
    assert (out[: n // 2] == 0x77).all() and np.array_equal(out[n // 2:], data[n // 2:])
    p._free(0, h)


def test_handle_of_host_memory_is_refused():
    p = AscendPlugin()
    if not p.available()[0] or not p.simulated:
        pytest.skip("needs the simulator")
    host = np.zeros(64, np.uint8)
    with pytest.raises(DeviceError):
        p.sim_ipc_handle(host.ctypes.data)
    with pytest.raises(DeviceError):
        p.sim_ipc_open(b"\0" * 64)


def test_first_export_keeps_every_allocation_of_the_device():
    """The first export moves the device's memory into shared pages at the same addresses."""
    p = KunlunPlugin()
    if not p.available()[0] or not p.simulated or p.device_count() < 3:
        pytest.skip("needs the simulator with three devices")
    dev = 2
    s = p._default_stream(dev)
    sizes = [1000, 3 << 20, 5000]
    bufs = [p._malloc(dev, n) for n in sizes]
    datas = [(np.arange(n) * (i + 3) % 253).astype(np.uint8) for i, n in enumerate(sizes)]
    for h, d in zip(bufs, datas, strict=True):
        p._copy(dev, h, 0, d, 0, d.nbytes, H2D, s)
    p._stream_synchronize(dev, s)
    p.sim_ipc_handle(bufs[1])
    for h, d in zip(bufs, datas, strict=True):
        out = np.zeros_like(d)
        p._copy(dev, out, 0, h, 0, d.nbytes, D2H, s)
        p._stream_synchronize(dev, s)
        assert np.array_equal(out, d)
    for h in bufs:
        p._free(dev, h)
    again = p._malloc(dev, 3 << 20)                   # freed shared pages come back as zeros
    out = np.ones(3 << 20, np.uint8)
    p._copy(dev, out, 0, again, 0, out.nbytes, D2H, s)
    p._stream_synchronize(dev, s)
    assert not out[4096:-4096].any()
    p._free(dev, again)
