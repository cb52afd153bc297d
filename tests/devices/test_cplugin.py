"""C plugins (anychip/plugin.h): loading, refusals, the core's fallbacks, collectives routing.

The plugins are the device `anychip plugin new --lang c` generates, compiled from
tests/c/plugin_variants.c with one change each (see there).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import CHILD_SECONDS, build_template_wrapper, cached_compile

import anychip
from anychip.chips import cplugin
from anychip.runtime import registry
from anychip.scaffold import new_plugin

HERE = Path(__file__).parent
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build the test plugins")

VARIANTS = {  # variant -> backend name it declares
    "GOOD": "tgood", "NO_INIT": "tnoinit", "MAJOR2": "tmajor", "MISSING": "tmissing", "INIT_FAIL": "tfail",
    "EVENTS_PARTIAL": "tevents", "MINIMAL": "tminimal", "CCL_SELF": "tself", "CCL_NOOP": "tnoop",
    "CCL_SHM": "tshm", "CCL_HANG": "thang", "CCL_PARTIAL": "tpartial", "TAKEN": "cpu",
}
ANYCHIP = [sys.executable, "-m", "anychip.cli"]


def _build(project: Path, variant: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"lib{VARIANTS[variant].lower()}_{variant.lower()}.so"
    flag = "GOOD" if variant == "TAKEN" else variant
    return build_template_wrapper(CC, project, HERE.parent / "c" / "plugin_variants.c", lib,
                                  f'-DNAME="{VARIANTS[variant]}"', f"-DVARIANT_{flag}", roots=(project.parent,))


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cplugins")
    project = new_plugin("tmpl", "c", root)
    return {v: _build(project, v, root / v.lower()) for v in VARIANTS}


@pytest.fixture
def plugin_path(monkeypatch: pytest.MonkeyPatch):
    """Set ANYCHIP_PLUGIN_PATH to the given paths and rediscover; forget it afterwards."""
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)

    def use(*paths: Path) -> None:
        monkeypatch.setenv("ANYCHIP_PLUGIN_PATH", os.pathsep.join(str(p) for p in paths))
        registry.reset()
    yield use
    monkeypatch.delenv("ANYCHIP_PLUGIN_PATH", raising=False)
    registry.reset()


def _refusals(*paths: Path) -> dict[str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused = registry.refused()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == len(refused)          # each refusal warned once
    return dict(refused)


def test_header_and_loader_agree() -> None:
    ffi, version = cplugin.abi()
    assert version == (1, 3)
    assert anychip.get_include() == str(Path(anychip.__file__).resolve().parents[2] / "csrc" / "include")
    assert (Path(anychip.get_include()) / "anychip" / "plugin.h").is_file()
    # the header's reserved slots keep room for growth; the table is what anychip allocates. Minor 1
    # took the first slot for `kernels`, minor 2 the next for `ccl_op_dtype_masks`, minor 3 the next
    # for `comm_init_rank_timeout`, so the table's size and every earlier offset stayed.
    kernels_at = ffi.offsetof("anychip_plugin", "kernels")
    assert ffi.offsetof("anychip_plugin", "ccl_op_dtype_masks") == kernels_at + ffi.sizeof("void *")
    assert ffi.offsetof("anychip_plugin", "comm_init_rank_timeout") == kernels_at + 2 * ffi.sizeof("void *")
    assert ffi.offsetof("anychip_plugin", "reserved") == kernels_at + 3 * ffi.sizeof("void *")
    assert ffi.sizeof("anychip_plugin") == ffi.offsetof("anychip_plugin", "kernels") + 32 * ffi.sizeof("void *")
    assert ffi.sizeof("anychip_unique_id") == 128
    out = subprocess.run([*ANYCHIP, "plugin", "cflags"], capture_output=True, text=True, check=True).stdout
    assert out == f"-I{anychip.get_include()}\n"


REDUCES = r"""
#include <stdio.h>
#include <string.h>
#include "anychip/plugin.h"
int main(void) {
    static const uint32_t per_op[ANYCHIP_REDOP_COUNT] = {0xFF, 0xFF & ~(1u << ANYCHIP_BFLOAT16), 0xFF, 0xFF, 0};
    anychip_plugin p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.ccl_redop_mask = 0xF;                    /* no avg */
    p.ccl_op_dtype_masks = per_op;
    for (unsigned minor = 1; minor <= 2; minor++) {
        p.minor = minor;
        printf("%d%d%d%d%d|", anychip_plugin_reduces(&p, ANYCHIP_BFLOAT16, ANYCHIP_PROD),
               anychip_plugin_reduces(&p, ANYCHIP_BFLOAT16, ANYCHIP_SUM),
               anychip_plugin_reduces(&p, ANYCHIP_FLOAT32, ANYCHIP_PROD),
               anychip_plugin_reduces(&p, ANYCHIP_FLOAT32, ANYCHIP_AVG),
               anychip_plugin_reduces(&p, (anychip_dtype)ANYCHIP_BOOL, ANYCHIP_SUM));
    }
    p.minor = 2;
    p.struct_size = offsetof(anychip_plugin, ccl_op_dtype_masks);   /* an older core's table */
    printf("%d\n", anychip_plugin_reduces(&p, ANYCHIP_BFLOAT16, ANYCHIP_PROD));
    return 0;
}
"""


def test_the_reduce_rule_of_the_header(tmp_path: Path) -> None:
    """plugin.h's anychip_plugin_reduces, the rule the Paddle bridge and the PyTorch c10d path use:
    both masks, and from minor 2 (inside the table the core passed) the op's own dtype mask."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "reduces.c").write_text(REDUCES)
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{anychip.get_include()}", "-o",
                    str(tmp_path / "reduces"), str(tmp_path / "reduces.c")], check=True, timeout=CHILD_SECONDS)
    out = subprocess.run([str(tmp_path / "reduces")], capture_output=True, text=True, check=True).stdout
    # minor 1 ignores the per-op table (bf16 prod reduced); minor 2 refuses it; avg is out of the
    # redop mask; bool is not a collective type; a core whose table ends before the field ignores it
    assert out == "11100|01100|1\n"


COMM_TIMEOUT = r"""
#include <stdio.h>
#include <string.h>
#include "anychip/plugin.h"
static anychip_status init(int d, int n, const anychip_unique_id *id, int r, double s, anychip_comm *c) {
    (void)d; (void)n; (void)id; (void)r; (void)s; (void)c;
    return 0;
}
int main(void) {
    anychip_plugin p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.comm_init_rank_timeout = init;           /* (a minor-2 plugin's slot would be zero, or anything) */
    for (unsigned minor = 2; minor <= 3; minor++) {
        p.minor = minor;
        printf("%d", anychip_plugin_comm_init_timeout(&p) == init);
    }
    p.struct_size = offsetof(anychip_plugin, comm_init_rank_timeout);   /* an older core's table */
    printf("%d\n", anychip_plugin_comm_init_timeout(&p) == init);
    return 0;
}
"""


def test_the_comm_timeout_rule_of_the_header(tmp_path: Path) -> None:
    """plugin.h's anychip_plugin_comm_init_timeout: the entry from minor 3 inside the core's table,
    else NULL (a minor-2 plugin's slot is reserved, whatever it holds)."""
    if CC is None:
        pytest.skip("no C compiler")
    (tmp_path / "timeout.c").write_text(COMM_TIMEOUT)
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{anychip.get_include()}", "-o",
                    str(tmp_path / "timeout"), str(tmp_path / "timeout.c")], check=True, timeout=CHILD_SECONDS)
    out = subprocess.run([str(tmp_path / "timeout")], capture_output=True, text=True, check=True).stdout
    assert out == "010\n"


@pytest.mark.parametrize("backend, minor, want", [("ascend", None, 5.0), ("ascend", 2, None), ("tshm", None, None)])
@pytest.mark.slow
def test_the_loader_gives_a_communicator_its_timeout_only_through_a_minor_3_entry(libs, plugin_path, monkeypatch,
                                                                                   backend, minor, want):
    """PluginCollectives.init_with_timeout (what the native transport calls) passes the group's
    timeout to comm_init_rank_timeout when the plugin's minor is 3 or more and the entry is set
    (the simulated Ascend's adapter); otherwise (the same table read as a minor-2 plugin's, or
    the test plugin, which sets no such entry) it makes the communicator with comm_init_rank and
    the watchdog applies the timeout."""
    plugin_path(libs["CCL_SHM"].parent)
    plugin = anychip.device(f"{backend}:0").plugin
    assert plugin.abi == (1, 3) and (plugin.t.comm_init_rank_timeout != plugin.ffi.NULL) == (backend == "ascend")
    if minor is not None:
        monkeypatch.setattr(plugin, "abi", (1, minor))
    lib = plugin.native_ccl()
    seen = []
    monkeypatch.setattr(lib, "_init_comm", lambda n, uid, r, timeout: seen.append(timeout))
    lib.init_with_timeout(1, bytes(128), 0, 5.0)
    assert seen == [want]


def test_good_plugin_is_a_backend(libs: dict[str, Path], plugin_path) -> None:
    plugin_path(libs["GOOD"].parent)
    info = registry.backend("tgood")
    assert info is not None and info.available, info and info.reason
    assert info.device_count == 4 and info.simulated
    assert info.source == f"C library {libs['GOOD']} (from ANYCHIP_PLUGIN_PATH)"
    assert info.reason == f"C plugin {libs['GOOD']} (ABI 1.3, tmpl 0.1.0 (host memory)); 4 device(s)"
    assert registry.refused() == []
    dev = anychip.device("tgood:2")
    assert dev.properties["name"] == "tmpl device 2 (host memory)"
    assert dev.properties["total_memory"] == 1 << 30
    assert dev.plugin.native_ccl() is None          # no collective entries: the host transport serves


@pytest.mark.parametrize("variant", ["GOOD", "MINIMAL"])
def test_device_api(libs: dict[str, Path], plugin_path, variant: str) -> None:
    """Every device call, with the plugin's own entries (GOOD) and with the core's fallbacks
    for every optional entry (MINIMAL: synchronous copies, host events, host fills)."""
    plugin_path(libs[variant])
    name = VARIANTS[variant]
    dev = anychip.device(f"{name}:1")
    data = np.arange(1000, dtype=np.int32)
    a = dev.alloc(data.nbytes)
    b = dev.alloc(data.nbytes + 64)
    a.copy_from(data)
    b.copy_from(a, offset=64)                                       # device to device, at an offset
    assert np.array_equal(b.to_numpy(np.int32, offset=64), data)
    s = anychip.Stream(dev)
    start, end = anychip.Event(dev), anychip.Event(dev)
    start.record(s)
    a.memset(0xAB, stream=s)
    host = np.zeros(data.nbytes, dtype=np.uint8)
    anychip.copy(host, a, stream=s)                                 # stream order: after the fill
    end.record(s)
    end.synchronize()
    assert end.query() and (host == 0xAB).all()
    assert start.elapsed_ms(end) >= 0.0
    other = anychip.Stream(dev)
    other.wait_event(end)
    anychip.copy(host, b, nbytes=64, stream=other)
    other.synchronize()
    assert (host[:64] == b.to_numpy()[:64]).all()
    free, total = dev.mem_info()
    assert total == 1 << 30 and free <= total - 2 * 4096


@pytest.mark.parametrize("variant", ["GOOD", "MINIMAL"])
@pytest.mark.slow
def test_generic_device_suite_passes_on_the_plugin(libs: dict[str, Path], variant: str) -> None:
    """The backend-agnostic device tests (tests/runtime/test_device_api.py, the body every
    backend runs) on the plugin's devices, with its own entries and with the core's fallbacks."""
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(libs[variant]), "ANYCHIP_DEVICES": f"{VARIANTS[variant]}:*"}
    root = HERE.parent.parent
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        str(root / "tests" / "runtime" / "test_device_api.py")],
                       capture_output=True, text=True, timeout=CHILD_SECONDS, env=env, cwd=root)
    assert p.returncode == 0, f"{variant}\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}"
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed and int(passed.group(1)) >= 27, p.stdout[-2000:]            # two devices: nothing skipped
    assert " failed" not in p.stdout and "skipped" not in p.stdout, p.stdout[-2000:]


def test_out_of_memory_then_recovery_and_bad_free(libs: dict[str, Path], plugin_path) -> None:
    plugin_path(libs["GOOD"])
    dev = anychip.device("tgood:0")
    with pytest.raises(anychip.OutOfMemoryError) as err:
        dev.alloc(2 << 30)
    assert err.value.requested == 2 << 30 and err.value.total == 1 << 30
    assert str(err.value).startswith("out of memory on tgood:0: tried to allocate 2048.00 MiB (1024.00 MiB free of "
                                     "1024.00 MiB total;")
    assert err.value.code == 2 and str(err.value).endswith(" (status = 2)")
    buf = dev.alloc(1 << 20)                                         # the device still works
    buf.memset(1)
    assert buf.to_numpy().sum() == 1 << 20
    with pytest.raises(anychip.DeviceError) as bad:
        dev.plugin._free(0, 0x1234)
    assert str(bad.value) == ("[tgood] mem_free failed: not a valid device pointer: free of 0x1234, which is not "
                              "a live allocation of device 0 (status = 3)")
    assert bad.value.code == 3


def test_minimal_plugin_messages_have_codes_only(libs: dict[str, Path], plugin_path) -> None:
    plugin_path(libs["MINIMAL"])
    dev = anychip.device("tminimal:0")
    assert dev.properties["name"] == "tminimal 0"
    with pytest.raises(anychip.DeviceError) as bad:
        dev.plugin._free(0, 0x1234)
    assert str(bad.value) == "[tminimal] mem_free failed: no detail available (status = 3)"


def test_refusals_name_the_library_and_the_reason(libs: dict[str, Path], plugin_path) -> None:
    broken = ["NO_INIT", "MAJOR2", "MISSING", "INIT_FAIL", "EVENTS_PARTIAL", "TAKEN"]
    junk = libs["GOOD"].parent.parent / "junk"
    junk.mkdir(exist_ok=True)
    (junk / "libjunk.so").write_bytes(b"not an ELF file")
    plugin_path(*(libs[v] for v in broken), libs["GOOD"], junk, junk / "missing")
    refused = _refusals()
    src = "(from ANYCHIP_PLUGIN_PATH)"
    assert refused == {
        f"plugin library {libs['NO_INIT']} {src}":
            "exports none of the init symbols anychip_plugin_init, InitPlugin (not an anychip plugin, or a plugin "
            "for another ABI)",
        f"plugin library {libs['MAJOR2']} {src}":
            "is built for plugin ABI 2.3, a newer major version; this anychip implements 1.3 and loads only plugins "
            "of major version 1 (upgrade anychip)",
        f"plugin library {libs['MISSING']} {src}":
            "tmissing: the required entries mem_alloc, copy are not set (plugin ABI 1.3)",
        f"plugin library {libs['INIT_FAIL']} {src}":
            "anychip_plugin_init failed with status 6 (system error: no tfail driver: /dev/tfail0 does not exist)",
        f"plugin library {libs['EVENTS_PARTIAL']} {src}":
            "tevents: events need all of event_create, event_destroy, event_record, event_synchronize; event_record "
            "not set (set all four, or none for the stream-synchronize fallback)",
        f"backend 'cpu' from C library {libs['TAKEN']} {src}":
            "the name is already taken by built-in (anychip.chips.cpu)",
        f"plugin library {junk / 'libjunk.so'} {src}": refused[f"plugin library {junk / 'libjunk.so'} {src}"],
        f"ANYCHIP_PLUGIN_PATH entry {junk / 'missing'}": "no such file or directory",
    }
    assert refused[f"plugin library {junk / 'libjunk.so'} {src}"].startswith("cannot be loaded: ")
    # the others still load
    good = registry.backend("tgood")
    assert good is not None and good.available
    assert registry.backend("cpu").source == "built-in (anychip.chips.cpu)"
    for name in ("tnoinit", "tmajor", "tmissing", "tfail", "tevents"):
        assert registry.backend(name) is None


@pytest.mark.slow
def test_refusals_in_the_devices_command(libs: dict[str, Path]) -> None:
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": f"{libs['MAJOR2']}{os.pathsep}{libs['GOOD']}"}
    env.pop("ANYCHIP_DEVICES", None)
    r = subprocess.run([*ANYCHIP, "devices", "--all"], capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^tgood:3 +simulated +tmpl device 3 \(host memory\) +1\.0 GiB", r.stdout, re.M)
    assert (f"refused: plugin library {libs['MAJOR2']} (from ANYCHIP_PLUGIN_PATH): is built for plugin ABI 2.3"
            in r.stdout)
    assert f"anychip: plugin library {libs['MAJOR2']} (from ANYCHIP_PLUGIN_PATH) refused: is built" in r.stderr


@pytest.mark.slow
def test_plugin_check_command(libs: dict[str, Path]) -> None:
    r = subprocess.run([*ANYCHIP, "plugin", "check", str(libs["CCL_SELF"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "backend:     tself (simulated)\n" in r.stdout
    assert "optional entries not set (anychip falls back): set_device, copy_peer, fill\n" in r.stdout
    assert ("collectives: native (all_gather, all_reduce, broadcast); the host transport runs the rest"
            in r.stdout)
    r = subprocess.run([*ANYCHIP, "plugin", "check", str(libs["MISSING"])], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr == (f"anychip plugin check: {libs['MISSING']} refused: tmissing: the required entries "
                        "mem_alloc, copy are not set (plugin ABI 1.3)\n")


def test_too_few_collective_entries_are_not_used(libs: dict[str, Path], plugin_path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    plugin_path(libs["CCL_PARTIAL"])
    with caplog.at_level("WARNING", logger="anychip"):
        info = registry.backend("tpartial")
    assert info is not None and info.available
    assert info.plugin.native_ccl() is None
    assert [r.getMessage() for r in caplog.records] == [
        f"anychip: {libs['CCL_PARTIAL']}: its collective entries are not used (the host transport serves): "
        "tpartial's collectives lack comm_init_rank, comm_destroy"]


def _launch(n: int, backend: str, lib: Path, body: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(lib), "ANYCHIP_COLLECTIVE_TIMEOUT": "60", **extra}
    env.pop("ANYCHIP_DEVICES", None)
    return subprocess.run([*ANYCHIP, "launch", "-n", str(n), "--device", backend, str(prog)],
                          capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)


@pytest.mark.slow
def test_the_templates_collectives_give_each_communicator_its_own_timeout(tmp_path: Path) -> None:
    """`anychip plugin new --collectives` sets comm_init_rank_timeout (plugin.h minor 3): of two
    communicators of one process, made with 60 s and 0.5 s, an op the peer skips on the short one
    fails after 0.5 s with the plugin's detail naming that peer, and the long one still works
    (tests/collectives/native_ccl_worker.py's `two`). With comm_init_rank alone its stand-in
    library took ANYCHIP_COLLECTIVE_TIMEOUT, the process's."""
    project = new_plugin("tcoll", "c", tmp_path, collectives=True)
    lib = cached_compile([CC, "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                          "-fvisibility=hidden", f"-I{project / 'include'}", f"-I{anychip.get_include()}", "-o",
                          str(tmp_path / "libtcoll.so"), *(str(p) for p in sorted((project / "src").glob("*.c"))),
                          "-lpthread", "-lm"], tmp_path / "libtcoll.so", roots=(tmp_path,))
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(lib), "ANYCHIP_COLLECTIVE_TRANSPORT": "native"}
    for k in ("ANYCHIP_DEVICES", "ANYCHIP_COLLECTIVE_TIMEOUT"):
        env.pop(k, None)
    worker = HERE.parent / "collectives" / "native_ccl_worker.py"
    r = subprocess.run([*ANYCHIP, "launch", "-n", "2", "--device", "tcoll", str(worker), "two", "0.5"],
                       capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert f"[{rank}] ENV unset native/tcoll collectives (simulated)\n" in r.stdout, r.stdout
        assert f"[{rank}] LONG [3.0, 3.0, 3.0, 3.0]\n" in r.stdout, r.stdout
    kind, secs, msg = next(ln for ln in r.stdout.splitlines() if ln.startswith("[0] RESULT "))[11:].split("|", 2)
    assert kind == "CollectiveTimeout", msg
    assert 0.4 < float(secs) < 10, secs
    assert "rank 0: timed out after 0.5 s waiting for rank 1" in msg, msg


ALL_REDUCE = """
    import numpy as np, anychip
    from anychip import collectives
    comm = collectives.init()
    t = comm.transport
    dev = anychip.device(f"{BACKEND}:{t.rank}")
    x = dev.alloc(4096).copy_from(np.arange(1024, dtype=np.int32) * (t.rank + 1))
    y = dev.alloc(4096).copy_from(np.full(1024, -7, dtype=np.int32))
    comm.all_reduce(x, y, op="sum", dtype="int32").wait()
    got = y.to_numpy(np.int32)
    want = np.arange(1024, dtype=np.int32) * sum(r + 1 for r in range(t.size))
    print("transport", t.name, "correct" if np.array_equal(got, want) else f"WRONG {got[:4].tolist()}", flush=True)
"""


@pytest.mark.slow
def test_collectives_route_to_the_plugin(libs: dict[str, Path], tmp_path: Path) -> None:
    r = _launch(1, "tself", libs["CCL_SELF"], ALL_REDUCE.replace("{BACKEND}", "tself"), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["[0] transport native/tself collectives (simulated) correct"]


@pytest.mark.slow
def test_collectives_plugin_refusing_a_group_size_fails_every_rank(libs: dict[str, Path], tmp_path: Path) -> None:
    r = _launch(2, "tself", libs["CCL_SELF"], ALL_REDUCE.replace("{BACKEND}", "tself"), tmp_path)
    assert r.returncode != 0
    assert ("tself collectives: comm_init_rank (rank 0 of 2) failed: tself collectives returned status 1: invalid "
            "argument: these test collectives serve groups of one rank, not 2") in r.stdout + r.stderr


@pytest.mark.slow
def test_collectives_that_move_no_data_give_wrong_results(libs: dict[str, Path], tmp_path: Path) -> None:
    r = _launch(2, "tnoop", libs["CCL_NOOP"], ALL_REDUCE.replace("{BACKEND}", "tnoop"), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == [
        "[0] transport native/tnoop collectives (simulated) WRONG [-7, -7, -7, -7]",
        "[1] transport native/tnoop collectives (simulated) WRONG [-7, -7, -7, -7]",
    ]


@pytest.mark.slow
def test_shared_memory_collectives_of_a_plugin_serve_two_ranks(libs: dict[str, Path], tmp_path: Path) -> None:
    r = _launch(2, "tshm", libs["CCL_SHM"], ALL_REDUCE.replace("{BACKEND}", "tshm"), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == ["[0] transport native/tshm collectives (simulated) correct",
                                             "[1] transport native/tshm collectives (simulated) correct"]


@pytest.mark.slow
def test_plugin_collectives_pass_the_conformance_suite(libs: dict[str, Path], tmp_path: Path) -> None:
    """Its all_reduce (int32, int64, float32, float64; sum, min, max), all_gather and broadcast
    run in the plugin; other types, ops and collectives on the host transport; the faults too."""
    out = tmp_path / "out.json"
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(libs["CCL_SHM"]), "ANYCHIP_LOG_LEVEL": "ERROR"}
    env.pop("ANYCHIP_DEVICES", None)
    r = subprocess.run([*ANYCHIP, "conformance", "--device", "tshm", "-n", "2", "--json", str(out), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    backend = json.loads(out.read_text())["backends"][0]
    assert backend["transport"] == "native/tshm collectives (simulated)"
    counts = backend["counts"]
    assert counts["failed"] == 0 and counts["skipped"] == 0 and counts["passed"] == counts["run"] >= 19


HANG = """
    import time, numpy as np, anychip
    from anychip import collectives
    comm = collectives.init()
    x = comm.device.alloc(4096).copy_from(np.ones(1024, dtype=np.int32))
    t = time.monotonic()
    try:
        w = comm.all_reduce(x, dtype="int32")
        if comm.rank == 0 or not SYNC:
            w.wait()
        else:
            x.to_numpy(np.int32)      # waits for the stream, whose work never ends
    except anychip.CollectiveTimeout as exc:
        print(f"after {time.monotonic() - t:.1f} s: {exc}", flush=True)
"""


@pytest.mark.slow
def test_a_native_collective_that_never_completes_times_out(libs: dict[str, Path], tmp_path: Path) -> None:
    """Every rank's all_reduce enqueues work that never ends (the plugin reports success).
    Rank 0 waits for its Work: the watchdog fails it after ANYCHIP_COLLECTIVE_TIMEOUT (plus a
    second), naming the op and the rank, and aborts the communicator. Ranks 1 and 2 wait for the
    stream instead, which nothing can end: 10 s after the abort the watchdog ends them, saying
    why, and the launcher ends the job. Before, every rank waited for ever."""
    t = time.monotonic()
    r = _launch(3, "thang", libs["CCL_HANG"], HANG.replace("SYNC", "True"), tmp_path,
                ANYCHIP_COLLECTIVE_TIMEOUT="2", CCL_HANG_RANKS="all")
    took = time.monotonic() - t
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[0] after "), r.stdout + r.stderr
    waited = float(lines[0].split()[2])
    assert 2.9 <= waited < 10, lines
    assert lines[0].endswith(" s: all_reduce (group world) did not complete within 2 s on rank 0 "
                             "(ANYCHIP_COLLECTIVE_TIMEOUT=2); the communicator was aborted"), lines
    # the first of ranks 1 and 2 to end says why; the launcher may end the other one first
    ended = [rank for rank in (1, 2) if (
        f"[{rank}] anychip: rank {rank}: all_reduce (group world) did not complete within 2 s "
        f"(ANYCHIP_COLLECTIVE_TIMEOUT=2), and its work on thang:{rank} still runs 10 s after the abort: "
        "nothing can end it; ending the process\n") in r.stderr]
    assert ended, r.stderr
    assert took < 60, took


@pytest.mark.slow
def test_one_rank_whose_collective_never_completes_ends_the_job(libs: dict[str, Path], tmp_path: Path) -> None:
    """Only rank 2's all_reduce never ends: ranks 0 and 1 time out in the plugin's barrier,
    rank 2 through the watchdog, and the job ends."""
    t = time.monotonic()
    r = _launch(3, "thang", libs["CCL_HANG"], HANG.replace("SYNC", "False"), tmp_path,
                ANYCHIP_COLLECTIVE_TIMEOUT="2", CCL_HANG_RANKS="2")
    took = time.monotonic() - t
    for rank in (0, 1):
        assert (f"all_reduce (thang collectives, group world) failed: thang collectives returned status 7: "
                f"unknown status: rank {rank}: timed out after 2 s waiting for rank 2") in r.stdout, r.stdout + r.stderr
    assert ("s: all_reduce (group world) did not complete within 2 s on rank 2 (ANYCHIP_COLLECTIVE_TIMEOUT=2); "
            "the communicator was aborted") in r.stdout, r.stdout
    assert r.returncode == 0 and took < 60, (took, r.stdout + r.stderr)


@pytest.mark.slow
def test_without_collectives_the_host_transport_serves(libs: dict[str, Path], tmp_path: Path) -> None:
    r = _launch(2, "tgood", libs["GOOD"], ALL_REDUCE.replace("{BACKEND}", "tgood"), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == ["[0] transport shm/staged correct", "[1] transport shm/staged correct"]


@pytest.mark.slow
def test_conformance_suite_fails_collectives_that_move_no_data(libs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(libs["CCL_NOOP"]), "ANYCHIP_LOG_LEVEL": "ERROR"}
    env.pop("ANYCHIP_DEVICES", None)
    r = subprocess.run([*ANYCHIP, "conformance", "--device", "tnoop", "-n", "2", "--no-faults", "-c",
                        "all_reduce,all_gather,reduce", "--json", str(out), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode != 0
    assert "conformance: FAIL on tnoop" in r.stdout
    cases = {c["name"]: c for c in json.loads(out.read_text())["backends"][0]["cases"]}
    for op in ("all_reduce", "all_gather"):           # the plugin's (broken) entries
        assert cases[op]["status"] == "failed"
        assert cases[op]["extra"]["wrong"] > 0
        assert cases[op]["expected"] == "#wrong 0"
    assert cases["reduce"]["status"] == "passed"      # not set by the plugin: the host transport runs it
    assert cases["copy_d2d"]["status"] == "passed"


def test_forked_child_is_told_the_plugin_streams_stayed_in_the_parent(libs: dict[str, Path], plugin_path) -> None:
    plugin_path(libs["GOOD"])
    dev = anychip.device("tgood:0")
    dev.alloc(64).memset(1)                  # the default stream (a worker thread) exists now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                             # child: report what the registry says, then leave at once
        try:
            info = registry.backend("tgood")
            os.write(w, f"{info.available}|{info.reason}".encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == (f"False|C plugin {libs['GOOD']}: its streams did not survive fork(); use it in a process "
                   "started fresh (anychip launch, multiprocessing's spawn)")
    assert registry.backend("tgood").available          # the parent is unaffected
