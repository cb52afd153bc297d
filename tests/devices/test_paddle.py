"""Paddle CustomDevice plugins loaded unchanged (src/anychip/chips/paddle/).

The plugin under test is tests/devices/pdtest/pdtest.c, built here into several variants: the
complete one (xccl on the collective engine), a minimal one (only the entries Paddle
requires, so every fallback runs), one per refusal reason, and one whose
xccl_all_reduce claims success without moving data.
"""
from __future__ import annotations

import glob
import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, cached_compile

import anychip
from anychip.conformance.cases import CASE_NAMES
from anychip.runtime import registry

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(HERE, "pdtest", "pdtest.c")
paddle = importlib.import_module("anychip.chips.paddle")

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the test plugin")

# directory -> [(library, defines)]
VARIANTS = {
    "good": [("libpdtest.so", ['-DPDTEST_TYPE="pdtest"']),
             ("libpdmin.so", ['-DPDTEST_TYPE="pdmin"', "-DPDTEST_MINIMAL"])],
    "broken": [("libpdgood.so", ['-DPDTEST_TYPE="pdgood"']),
               ("libpdnullentry.so", ['-DPDTEST_TYPE="pdnullentry"', "-DPDTEST_NULL_REQUIRED"]),
               ("libpdinitfail.so", ['-DPDTEST_TYPE="pdinitfail"', "-DPDTEST_INIT_FAILS"]),
               ("libpdnulltype.so", ["-DPDTEST_NULL_TYPE"]),
               ("libpdold.so", ['-DPDTEST_TYPE="pdold"', "-DPDTEST_OLD_LAYOUT"]),
               ("libpdoldversion.so", ['-DPDTEST_TYPE="pdoldversion"', "-DPDTEST_OLD_VERSION"])],
    "badccl": [("libpdbadccl.so", ['-DPDTEST_TYPE="pdbadccl"', "-DPDTEST_BROKEN_ALLREDUCE"])],
}


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Build every variant; returns directory name -> path."""
    out = tmp_path_factory.mktemp("paddle_plugins")
    inc = os.path.join(REPO, "csrc", "include")        # anychip/paddle/device_ext.h
    # the collective engine linked in with private symbols, as into the simulator libraries (setup.py)
    engine = sorted(str(p) for p in Path(REPO, "csrc", "ccl").glob("*.c"))
    hidden = '-DCCL_EXPORT=__attribute__((visibility("hidden")))'
    dirs = {}
    for d, libs in VARIANTS.items():
        (out / d).mkdir()
        dirs[d] = str(out / d)
        for name, defines in libs:
            cached_compile([CC, "-O2", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-function", *defines,
                            "-fwrapv", hidden, "-I", str(inc), "-I", os.path.join(REPO, "csrc"),
                            "-I", os.path.join(REPO, "build", "include"), SOURCE, *engine,
                            "-o", str(out / d / name), "-lpthread", "-lrt"], out / d / name, roots=(out,))
    return dirs


@pytest.fixture
def root(plugins, monkeypatch):
    """Point CUSTOM_DEVICE_ROOT at one of the plugin directories (registry rebuilt)."""
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    monkeypatch.delenv("ANYCHIP_PLUGIN_PATH", raising=False)

    def use(name: str) -> str:
        monkeypatch.setenv("CUSTOM_DEVICE_ROOT", plugins[name])
        registry.reset()
        return plugins[name]
    yield use
    monkeypatch.delenv("CUSTOM_DEVICE_ROOT", raising=False)
    registry.reset()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "ANYCHIP_PLUGIN_PATH")}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# loading and refusals
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_anychip_devices_lists_the_plugins_devices(plugins):
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "devices"], capture_output=True, text=True,
                       timeout=CHILD_SECONDS, env=_env(CUSTOM_DEVICE_ROOT=plugins["good"], PDTEST_DEVICES="3"))
    assert p.returncode == 0, p.stderr
    for i in range(3):
        assert f"pdtest:{i}" in p.stdout, p.stdout
    assert "pdtest:3" not in p.stdout
    assert "pdmin:0" in p.stdout


def test_each_refusal_names_the_library_and_the_reason_and_the_others_load(root):
    d = root("broken")
    with pytest.warns(RuntimeWarning):
        infos = {b.name: b for b in anychip.backends()}
    assert infos["pdgood"].available and infos["pdgood"].device_count == 4
    assert infos["pdgood"].source == f"Paddle CustomDevice plugin {d}/libpdgood.so (from CUSTOM_DEVICE_ROOT)"
    # initialize runs when the backend loads: the backend is listed, refused
    lib = os.path.join(d, "libpdinitfail.so")
    assert infos["pdinitfail"].reason == (f"refused (Paddle CustomDevice plugin {lib} (from CUSTOM_DEVICE_ROOT)): "
                                          f"initialize failed: returned C_FAILED (resource exhausted or query "
                                          f"failed)")
    assert not infos["pdinitfail"].available and infos["pdinitfail"].device_count == 0
    # what InitPlugin wrote is checked at discovery: the library is refused with the reason
    refused = dict(registry.refused())

    def why(lib: str) -> str:
        return refused[f"plugin library {os.path.join(d, lib)} (from CUSTOM_DEVICE_ROOT)"]
    assert why("libpdnullentry.so") == "leaves the required entry device_memory_stats NULL"
    assert why("libpdnulltype.so") == ("InitPlugin set no device_type (a sign of a header-version mismatch); "
                                       "the plugin must name its type")
    old = why("libpdold.so")
    assert old.startswith("InitPlugin returned without filling the parameters (device_type NULL, no version)")
    assert "CustomRuntimeParams (96 bytes) and C_DeviceInterface (1128 bytes)" in old
    assert "Paddle 2.6's are 88 and 912 bytes" in old
    assert why("libpdoldversion.so") == ("reports custom runtime version 0.1.0; anychip loads plugins of version "
                                         "0.1.1 or a later 0.x")
    assert len(refused) == 4, refused
    assert not {"pdnullentry", "pdold", "pdoldversion"} & set(infos)


def test_the_plugin_path_dispatches_initplugin_libraries_to_the_paddle_loader(plugins, monkeypatch, tmp_path):
    shutil.copy(os.path.join(plugins["good"], "libpdtest.so"), tmp_path / "libpdtest.so")
    monkeypatch.delenv("CUSTOM_DEVICE_ROOT", raising=False)
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    monkeypatch.setenv("ANYCHIP_PLUGIN_PATH", str(tmp_path))
    registry.reset()
    try:
        info = registry.backend("pdtest")
        assert info is not None and info.available, info
        assert info.source == f"Paddle CustomDevice plugin {tmp_path / 'libpdtest.so'} (from ANYCHIP_PLUGIN_PATH)"
    finally:
        monkeypatch.delenv("ANYCHIP_PLUGIN_PATH")
        registry.reset()


# ---------------------------------------------------------------------------------------------
# the device API through the plugin
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["pdtest", "pdmin"])
def test_device_api_round_trip(root, variant):
    root("good")
    dev = anychip.device(f"{variant}:1")
    props = dev.properties
    assert props["physical_id"] == 1 and props["total_memory"] == 256 << 20 and props["min_chunk_size"] == 512
    assert props["collectives"] == ("xccl" if variant == "pdtest" else "host transport")
    data = np.arange(1000, dtype=np.int32)
    a, b = dev.alloc(8000), dev.alloc(8000)
    s = anychip.Stream(dev)
    a.copy_from(data, stream=s)
    dev.memset(b, 7, 8000, stream=s)
    anychip.copy(b, a, 4000, dst_offset=1000, stream=s)
    s.synchronize()
    got = b.to_numpy(np.uint8)
    assert (got[:1000] == 7).all() and (got[5000:] == 7).all()
    assert np.array_equal(got[1000:5000].view(np.int32), data[:1000])
    free, total = dev.mem_info()
    assert total == 256 << 20 and free <= total - 16000


def test_events_time_work_and_order_streams(root):
    root("good")
    dev = anychip.device("pdtest:0")
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    n = 1 << 22
    a, b, c = dev.alloc(n), dev.alloc(n), dev.alloc(n)
    a.copy_from(np.full(n, 3, dtype=np.uint8), stream=s1)
    start, end = anychip.Event(dev), anychip.Event(dev)
    start.record(s1)
    for _ in range(8):
        anychip.copy(b, a, n, stream=s1)
    end.record(s1)
    s2.wait_event(end)
    anychip.copy(c, b, n, stream=s2)
    s2.synchronize()
    assert (c.to_numpy(np.uint8) == 3).all()
    assert end.query() and end.elapsed_ms(end) == 0.0
    assert start.elapsed_ms(end) > 0.0


def test_minimal_plugin_times_events_by_draining_the_stream(root):
    root("good")
    dev = anychip.device("pdmin:0")
    s = anychip.Stream(dev)
    n = 1 << 22
    a, b = dev.alloc(n), dev.alloc(n)
    e1, e2 = anychip.Event(dev), anychip.Event(dev)
    e1.record(s)
    for _ in range(4):
        anychip.copy(b, a, n, stream=s)
    e2.record(s)                                    # no stream_add_callback: drains s, then stamps
    assert e2.query() and s.query()
    assert e1.elapsed_ms(e2) > 0.0


def test_out_of_memory_and_bad_free_are_reported(root, monkeypatch):
    root("good")
    dev = anychip.device("pdtest:2")
    with pytest.raises(anychip.OutOfMemoryError) as info:
        dev.alloc(300 << 20)                        # the plugin's devices hold 256 MiB
    assert info.value.total == 256 << 20 and info.value.code_name == "C_FAILED"
    buf = dev.alloc(1 << 19)
    plugin = dev.plugin
    with pytest.raises(anychip.DeviceError, match=r"device_memory_deallocate failed: returned C_ERROR "
                                                  r"\(invalid argument, wrong usage or uninitialized\)"):
        plugin._free(2, buf.ptr + 256)
    del buf


@pytest.mark.slow
def test_generic_device_suite_passes_on_the_plugin(plugins):
    """The backend-agnostic device tests (tests/runtime/test_device_api.py), on both variants."""
    for variant in ("pdtest", "pdmin"):
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                            os.path.join(REPO, "tests", "runtime", "test_device_api.py")],
                           capture_output=True, text=True, timeout=CHILD_SECONDS,
                           env=_env(CUSTOM_DEVICE_ROOT=plugins["good"], ANYCHIP_DEVICES=f"{variant}:*"), cwd=REPO)
        assert p.returncode == 0, f"{variant}\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}"
        assert " passed" in p.stdout and " failed" not in p.stdout


# ---------------------------------------------------------------------------------------------
# xccl as the native collective library
# ---------------------------------------------------------------------------------------------

def _launch(plugins, directory: str, backend: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "anychip.cli", "launch", "-n", "2", "--device", backend,
           os.path.join(REPO, "tests", "collectives", "native_ccl_worker.py"), *args]
    env = _env(CUSTOM_DEVICE_ROOT=plugins[directory], ANYCHIP_COLLECTIVE_TRANSPORT="native")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_SECONDS, env=env)
    if check:
        assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.mark.slow
def test_two_ranks_run_every_collective_through_xccl(plugins):
    out = _launch(plugins, "good", "pdtest", "matrix", "0,1,7,1000", "70001").stdout
    assert out.count("via native/xccl") == 2, out


def _conformance(plugins, directory: str, backend: str, tmp_path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / f"{backend}.json"
    cmd = [sys.executable, "-m", "anychip.cli", "conformance", "--device", backend, "-n", "2", "--no-progress",
           "--json", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_SECONDS,
                       env=_env(CUSTOM_DEVICE_ROOT=plugins[directory]))
    import json
    return p.returncode, json.loads(out.read_text()), p.stdout + p.stderr


@pytest.mark.slow
def test_conformance_suite_passes_on_the_plugin(plugins, tmp_path):
    rc, report, text = _conformance(plugins, "good", "pdtest", tmp_path)
    assert rc == 0, text[-4000:]
    (b,) = report["backends"]
    assert b["transport"] == "native/xccl" and b["kind"] == "real"
    names = {c["name"]: c["status"] for c in b["cases"]}
    assert set(names) == set(CASE_NAMES), names
    assert names.pop("kernels") == "skipped"             # a Paddle device plugin has no kernel set
    # its memset is synchronous (device_memory_set): no record can be pending behind held work
    assert names.pop("wait_binding") == "skipped"
    assert set(names.values()) == {"passed"}, names
    assert b["rows"] and all(r["oop"]["wrong"] == 0 and (r.get("ip") or {}).get("wrong", 0) == 0 for r in b["rows"])


@pytest.mark.slow
def test_xccl_all_reduce_that_moves_nothing_fails_the_suite(plugins, tmp_path):
    rc, report, text = _conformance(plugins, "badccl", "pdbadccl", tmp_path, "-c", "all_reduce", "--no-faults")
    assert rc == 1
    (b,) = report["backends"]
    assert b["transport"] == "native/xccl" and b["verdict"] == "FAIL"
    rows = b["rows"]
    assert rows and all(r["op"] == "all_reduce" for r in rows)
    assert sum(r["oop"]["wrong"] for r in rows) > 0 and all(r["status"] == "failed" for r in rows if r["count"])
    assert {c["name"]: c["status"] for c in b["cases"]}["all_reduce"] == "failed"
    assert "conformance: FAIL" in text


def test_minimal_plugin_collectives_run_on_the_host_transport(root):
    root("good")
    dev = anychip.device("pdmin:0")
    assert dev.plugin.native_ccl() is None
    assert anychip.device("pdtest:0").plugin.native_ccl().supports.__self__.entries == frozenset(
        {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv"})


# ---------------------------------------------------------------------------------------------
# the mirror against Paddle's own header
# ---------------------------------------------------------------------------------------------

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "anychip", "wheels")


def _paddle_header() -> str:
    wheels = sorted(glob.glob(os.path.join(CACHE, "paddlepaddle-3.3.1-*.whl")))
    if not wheels:
        try:
            p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "paddlepaddle==3.3.1",
                                "-d", CACHE], capture_output=True, text=True, timeout=LONG_CHILD_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"the paddlepaddle 3.3.1 wheel could not be downloaded: {exc}")
        wheels = sorted(glob.glob(os.path.join(CACHE, "paddlepaddle-3.3.1-*.whl")))
        if p.returncode or not wheels:
            pytest.skip(f"the paddlepaddle 3.3.1 wheel could not be downloaded: {p.stderr.strip()[-300:]}")
    header = os.path.join(CACHE, "device_ext-3.3.1.h")
    if not os.path.exists(header):
        with zipfile.ZipFile(wheels[-1]) as z:
            data = z.read("paddle/include/paddle/phi/backends/device_ext.h")
        with open(header + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(header + ".tmp", header)
    return header


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (Paddle's header is C++)")
def test_mirror_matches_paddles_header_member_by_member(tmp_path):
    header = _paddle_header()
    ffi = paddle.ffi()
    lines = []
    for struct in ("C_DeviceInterface", "CustomRuntimeParams"):
        lines.append(f'printf("{struct} sizeof %zu\\n", sizeof({struct}));')
        for field, _ in ffi.typeof(f"struct {struct}").fields:
            lines.append(f'printf("{struct} {field} %zu\\n", offsetof({struct}, {field}));')
    prog = tmp_path / "offsets.cc"
    prog.write_text(f'#include <cstdint>\n#include <cstdio>\n#include "{header}"\nint main() {{\n'
                    + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "offsets"
    subprocess.run(["g++", "-o", str(exe), str(prog)], check=True)
    real = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    mine = []
    for struct in ("C_DeviceInterface", "CustomRuntimeParams"):
        mine.append(f"{struct} sizeof {ffi.sizeof('struct ' + struct)}")
        fields = ffi.typeof(f"struct {struct}").fields
        mine += [f"{struct} {f} {ffi.offsetof('struct ' + struct, f)}" for f, _ in fields]
    assert real == mine
