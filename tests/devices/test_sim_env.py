"""Configuration of the simulated backends: the environment variables the simulator
reads when its library starts (so each case runs in a fresh process), library
discovery and ANYCHIP_SIMULATE, and the device listing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import CHILD_SECONDS

from anychip.chips import _adapter as vendor
from anychip.chips.ascend import AscendPlugin
from anychip.chips.hygon import HygonPlugin
from anychip.chips.kunlun import KunlunPlugin
from anychip.runtime._libs import find_library

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = {"ascend": AscendPlugin, "kunlun": KunlunPlugin, "hygon": HygonPlugin}
SIM_LIBS = {"ascend": "libascend_sim", "kunlun": "libkunlun_sim", "hygon": "libhygon_sim"}

_OWN_VARS = ("ANYCHIP_", "ASCEND_", "XPU_", "HIP_", "CUDA_VISIBLE_DEVICES", "ROCM_PATH")


def run_py(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter with ``env`` (and none of the outside's device
    variables); the code prints one JSON object, which is returned."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARS)}
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=CHILD_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _built():
    if any(find_library(lib) is None for lib in SIM_LIBS.values()):
        pytest.skip("the simulator libraries are not built")


def test_out_of_memory_at_capacity_and_recovery():
    out = run_py("""
        import json
        from anychip.chips.ascend import AscendPlugin
        from anychip.chips.kunlun import KunlunPlugin
        from anychip.chips.hygon import HygonPlugin
        from anychip.runtime.errors import OutOfMemoryError
        res = {}
        for cls in (AscendPlugin, KunlunPlugin, HygonPlugin):
            p = cls(); p.available()
            free, total = p._mem_info(0)
            a = p._malloc(0, total // 2); b = p._malloc(0, total // 2)     # exactly full
            try:
                p._malloc(0, 1); err = None
            except OutOfMemoryError as e:
                err = [e.code_name, e.requested, e.free, e.total, str(e)]
            p._free(0, a)
            try:                                  # 1 MiB free, but not in one piece past the middle
                c = p._malloc(0, total // 2 + 512); frag = None
            except OutOfMemoryError as e:
                frag = e.code_name
            c = p._malloc(0, total // 2)          # the freed half is usable again
            p._free(0, b); p._free(0, c)
            res[cls.name] = {"total": total, "free": free, "err": err, "frag": frag,
                             "after": p._mem_info(0), "other": p._mem_info(1)}
        print(json.dumps(res))
    """, ANYCHIP_SIM_MEMORY="1MiB", ANYCHIP_SIM_DEVICES="2")
    codes = {"ascend": "ACL_ERROR_RT_MEMORY_ALLOCATION", "kunlun": "XPUERR_NOMEM", "hygon": "hipErrorOutOfMemory"}
    for name, r in out.items():
        assert r["total"] == r["free"] == 1 << 20, name
        code, requested, free, total, text = r["err"]
        assert (code, requested, free, total) == (codes[name], 1, 0, 1 << 20), name
        assert "out of memory" in text and f"{name}:0" in text
        assert r["frag"] == codes[name]
        assert r["after"] == [1 << 20, 1 << 20] and r["other"] == [1 << 20, 1 << 20]


@pytest.mark.slow
def test_memory_size_units_and_device_count():
    code = """
        import json
        from anychip.chips.ascend import AscendPlugin
        p = AscendPlugin(); p.available()
        print(json.dumps([p.device_count(), p._mem_info(0)[1]]))
    """
    assert run_py(code, ANYCHIP_SIM_MEMORY="3G", ANYCHIP_SIM_DEVICES="3") == [3, 3 << 30]
    assert run_py(code, ANYCHIP_SIM_MEMORY="1048576") == [8, 1 << 20]          # the smallest accepted
    assert run_py(code, ANYCHIP_SIM_MEMORY="1 TiB") == [8, 1 << 40]             # the largest accepted
    assert run_py(code, ANYCHIP_SIM_MEMORY=" 512 mb ") == [8, 512 << 20]
    assert run_py(code, ANYCHIP_SIM_MEMORY="1.5g") == [8, 3 << 29]
    assert run_py(code, ANYCHIP_SIM_MEMORY="1000000.7k") == [8, 1024000512]   # rounded down to 512 bytes
    assert run_py(code) == [8, 16 << 30]


ALL_THREE = """
    import json
    from anychip.chips.ascend import AscendPlugin
    from anychip.chips.kunlun import KunlunPlugin
    from anychip.chips.hygon import HygonPlugin
    out = []
    for cls in (AscendPlugin, KunlunPlugin, HygonPlugin):
        p = cls(); p.available()
        out.append([p.device_count(), p._mem_info(0)[1]])
    print(json.dumps(out))
"""


def run_warned(**env: str) -> tuple[list, list[str]]:
    """ALL_THREE in a fresh process: (each library's [devices, capacity], stderr lines)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARS)}
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(ALL_THREE)], capture_output=True, text=True,
                          env=full, timeout=CHILD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr.splitlines()


MEMORY_RANGE = "want from 1MiB to 1TiB of memory per device"
MEMORY_SYNTAX = "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB (e.g. 16GiB)"


@pytest.mark.parametrize("value,why", [
    ("nan", MEMORY_SYNTAX), ("NaN G", MEMORY_SYNTAX), ("-nan", MEMORY_SYNTAX), ("inf", MEMORY_SYNTAX),
    ("-5G", MEMORY_SYNTAX), ("1e9", MEMORY_SYNTAX), ("16 GiBs", MEMORY_SYNTAX), ("0x10M", MEMORY_SYNTAX),
    ("G", MEMORY_SYNTAX), ("100T", MEMORY_RANGE), ("1024.5G", MEMORY_RANGE), ("0", MEMORY_RANGE),
    ("1048575", MEMORY_RANGE), ("512k", MEMORY_RANGE),
])
@pytest.mark.slow
def test_bad_memory_size_warns_once_per_process_and_uses_the_default(value, why):
    out, err = run_warned(ANYCHIP_SIM_MEMORY=value)
    assert out == [[8, 16 << 30]] * 3                   # all three libraries use the default
    assert err == [f'anychip simulator: ignoring ANYCHIP_SIM_MEMORY="{value}": {why}; using the default, 16GiB']


@pytest.mark.slow
def test_each_bad_setting_warns_once_and_good_ones_are_quiet():
    out, err = run_warned(ANYCHIP_SIM_SPIN_US="fast", ANYCHIP_SIM_DEVICES="3 devices", ANYCHIP_SIM_MEMORY="2G")
    assert out == [[8, 2 << 30]] * 3
    assert err == [
        'anychip simulator: ignoring ANYCHIP_SIM_DEVICES="3 devices": want a whole number of devices from 0 to 64; '
        "using the default, 8",
        'anychip simulator: ignoring ANYCHIP_SIM_SPIN_US="fast": want a whole number of microseconds from 0 to '
        "1000000; using the default, 20",
    ]
    for spin in ("-1", "1000001", "2.5", "20us"):
        assert len(run_warned(ANYCHIP_SIM_SPIN_US=spin)[1]) == 1, spin
    out, err = run_warned(ANYCHIP_SIM_SPIN_US="0", ANYCHIP_SIM_DEVICES=" 64 ", ANYCHIP_SIM_MEMORY="1M")
    assert out == [[64, 1 << 20]] * 3 and err == []
    assert run_warned(ANYCHIP_SIM_DEVICES="65")[0] == [[8, 16 << 30]] * 3


VISIBLE = """
    import json
    from anychip.chips.ascend import AscendPlugin
    from anychip.chips.kunlun import KunlunPlugin
    from anychip.chips.hygon import HygonPlugin
    res = {}
    for cls in (AscendPlugin, KunlunPlugin, HygonPlugin):
        p = cls(); ok, reason = p.available()
        n = p.device_count()
        res[cls.name] = [p.properties(i)["physical_index"] for i in range(n)]
    print(json.dumps(res))
"""


@pytest.mark.slow
def test_visibility_variables_renumber_devices():
    # ACL (CANN): ascending ids; an id past the last device ends the list; out of order rejects all
    # XPU: list order; reading stops at the first invalid or repeated id
    # HIP (clr): list order; a repeated id is skipped; a malformed entry ends the list
    out = run_py(VISIBLE, ASCEND_RT_VISIBLE_DEVICES="3,1", XPU_VISIBLE_DEVICES="3,1",
                 HIP_VISIBLE_DEVICES="6,2,6,1")
    assert out == {"ascend": [], "kunlun": [3, 1], "hygon": [6, 2, 1]}
    out = run_py(VISIBLE, ASCEND_RT_VISIBLE_DEVICES="1,3,8", XPU_VISIBLE_DEVICES="2,x,4",
                 CUDA_VISIBLE_DEVICES="5,4")
    assert out == {"ascend": [1, 3], "kunlun": [2], "hygon": [5, 4]}        # HIP falls back to CUDA's
    out = run_py(VISIBLE, ASCEND_RT_VISIBLE_DEVICES="1, 2,3", HIP_VISIBLE_DEVICES="7",
                 CUDA_VISIBLE_DEVICES="5", ANYCHIP_SIM_DEVICES="8")
    assert out == {"ascend": [1], "kunlun": list(range(8)), "hygon": [7]}   # HIP's own variable wins
    out = run_py(VISIBLE, ASCEND_RT_VISIBLE_DEVICES="2,3", ANYCHIP_SIM_DEVICES="3")
    assert out["ascend"] == [2]                                              # 3 does not exist


def test_no_visible_device_leaves_the_backend_with_none():
    out = run_py("""
        import json
        from anychip.chips.hygon import HygonPlugin
        from anychip.chips.ascend import AscendPlugin
        print(json.dumps([list(HygonPlugin().available()), list(AscendPlugin().available())]))
    """, HIP_VISIBLE_DEVICES="9", ASCEND_RT_VISIBLE_DEVICES="")
    for ok, reason in out:
        assert ok is True and "0 device(s)" in reason       # the registry reports "no devices"
    assert "ASCEND_RT_VISIBLE_DEVICES=\"\" is rejected: it must start with a device id" in out[1][1]


@pytest.mark.slow
def test_visible_devices_through_the_front_end():
    out = run_py("""
        import json, anychip, numpy as np
        d = anychip.device("ascend:1")
        buf = d.alloc(1000)
        buf.copy_from(np.arange(1000, dtype=np.uint16).view(np.uint8)[:1000])
        print(json.dumps([[x.name for x in anychip.devices("ascend")], d.properties["physical_index"],
                          d.simulated]))
    """, ASCEND_RT_VISIBLE_DEVICES="4,6")
    assert out == [["ascend:0", "ascend:1"], 6, True]


@pytest.mark.slow
def test_device_listing_marks_simulated_devices():
    full = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARS)}
    full.update(PYTHONPATH=ROOT, ANYCHIP_DEVICES="ascend:0,1;kunlun:*")
    proc = subprocess.run([sys.executable, "-m", "anychip.cli", "devices"], capture_output=True, text=True,
                          env=full, timeout=CHILD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("ascend:", "kunlun:"))]
    names = [r[0] for r in rows]
    assert names == ["ascend:0", "ascend:1"] + [f"kunlun:{i}" for i in range(8)]
    assert all("simulated" in r for r in rows)


@pytest.mark.slow
def test_fork_child_starts_with_fresh_devices():
    out = run_py("""
        import json, os
        from anychip.chips.ascend import AscendPlugin
        from anychip.runtime.errors import DeviceError
        import numpy as np
        p = AscendPlugin(); p.available()
        h = p._malloc(0, 4096)
        nines = np.full(4096, 9, np.uint8)             # host memory must outlive the async copy
        p._copy(0, h, 0, nines, 0, 4096, "h2d", p._default_stream(0))
        p._stream_synchronize(0, p._default_stream(0))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                try:
                    p._free(0, h); msg = "freed the parent's buffer"
                except DeviceError as e:
                    msg = e.code_name
                h2 = p._malloc(0, 4096)              # the child has devices of its own
                out = np.zeros(4096, np.uint8)
                p._copy(0, out, 0, h2, 0, 4096, "d2h", p._default_stream(0))
                p._stream_synchronize(0, p._default_stream(0))
                os.write(w, json.dumps([msg, int(out.sum())]).encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(r, 1000))
        out = np.zeros(4096, np.uint8)               # the parent's memory is untouched
        p._copy(0, out, 0, h, 0, 4096, "d2h", p._default_stream(0))
        p._stream_synchronize(0, p._default_stream(0))
        print(json.dumps(child + [int(out[0])]))
    """)
    assert out == ["ACL_ERROR_RT_PARAM_INVALID", 0, 9]


# -- discovery: in this process, with fresh plugin objects ------------------------------

@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_simulate_never_names_the_paths_searched(monkeypatch, tmp_path, name):
    monkeypatch.setenv("ANYCHIP_SIMULATE", "never")
    for var in ("ASCEND_HOME_PATH", "XPU_HOME", "ROCM_PATH"):
        monkeypatch.setenv(var, str(tmp_path / "nowhere"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "ldpath"))
    ok, reason = PLUGINS[name]().available()
    assert ok is False
    assert "ANYCHIP_SIMULATE=never" in reason and str(tmp_path / "nowhere") in reason
    assert str(tmp_path / "ldpath") in reason
    assert PLUGINS[name].vendor_libraries[0] in reason


def test_bad_simulate_value(monkeypatch):
    monkeypatch.setenv("ANYCHIP_SIMULATE", "sometimes")
    ok, reason = AscendPlugin().available()
    assert not ok and "ANYCHIP_SIMULATE" in reason and "auto" in reason


def test_simulator_not_built(monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    monkeypatch.setattr(vendor, "find_library", lambda name: None)
    ok, reason = AscendPlugin().available()
    assert not ok and "libascend_sim" in reason and "not built" in reason


def test_available_never_raises(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(vendor, "find_vendor_library", boom)
    ok, reason = KunlunPlugin().available()
    assert not ok and "disk on fire" in reason


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_vendor_library_is_preferred_and_takes_the_same_path(monkeypatch, tmp_path, name):
    """A library with the vendor's file name in the vendor's install path is loaded as the
    real thing (here: a copy of the simulator, which has the same symbols); the backend code
    does not change, only ``simulated`` does. ``ANYCHIP_SIMULATE=always`` still picks the
    simulator."""
    cls = PLUGINS[name]
    root = tmp_path / "vendor"
    sub = {"ascend": "lib64", "kunlun": "lib64", "hygon": "lib"}[name]
    (root / sub).mkdir(parents=True)
    fake = root / sub / cls.vendor_libraries[0]
    shutil.copy(find_library(SIM_LIBS[name]), fake)
    for var in ("ASCEND_HOME_PATH", "XPU_HOME", "ROCM_PATH"):
        monkeypatch.setenv(var, str(root))
    p = cls()
    ok, reason = p.available()
    assert ok and not p.simulated and p.library_path == str(fake) and str(fake) in reason
    import numpy as np
    h = p._malloc(0, 64)
    data = np.arange(64, dtype=np.uint8)
    out = np.zeros(64, np.uint8)
    s = p._default_stream(0)
    p._copy(0, h, 0, data, 0, 64, "h2d", s)
    p._copy(0, out, 0, h, 0, 64, "d2h", s)
    p._stream_synchronize(0, s)
    assert np.array_equal(out, data)
    p._free(0, h)
    monkeypatch.setenv("ANYCHIP_SIMULATE", "always")
    q = cls()
    assert q.available()[0] and q.simulated and q.library_path != str(fake)


def test_a_vendor_library_that_fails_to_start_is_reported(monkeypatch, tmp_path):
    root = tmp_path / "Ascend"
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "libascendcl.so").write_bytes(b"not an ELF file")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(root))
    monkeypatch.setenv("ANYCHIP_SIMULATE", "never")
    ok, reason = AscendPlugin().available()
    assert not ok and str(root / "lib64" / "libascendcl.so") in reason
    monkeypatch.setenv("ANYCHIP_SIMULATE", "auto")     # unloadable: the simulator stands in, and says why
    p = AscendPlugin()
    ok, reason = p.available()
    assert ok and p.simulated and "could not be loaded" in reason
