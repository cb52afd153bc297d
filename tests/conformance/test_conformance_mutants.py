"""The conformance suite's own power, measured as mutation testing measures a test suite.

One chip plugin, built once from the C scaffold (`anychip plugin new --lang c`) plus complete
shared-memory collectives of its own (tests/c/conformance_mutants.c), is correct unless
MUTANT_DEFECT plants one defect. The suite must pass it as it is and fail it with every defect,
in the case that owns the defect's class: a suite that lets one through has lost power.

Each run certifies the one collective the defect is easiest to see in (``-c``; the rows of that
collective are the default quick ones, so the default command catches it too) without the fault
cases, to keep the runs short; defects of the device API, of point-to-point matching and of the
communicator cases (split, groups, streams), which the named cases catch whatever the rows, run
with a single small row; the abort defect runs with the fault cases.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS, build_template_wrapper

from anychip.conformance.cases import CASE_NAMES
from anychip.scaffold import new_plugin

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = [pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build the test plugin"),
              pytest.mark.timeout(LONG_TEST_SECONDS)]
NAME = "mutchip"
CASE_ORDER = list(CASE_NAMES)

#: defect -> (the collective certified, the cases that must fail); by class ("sendrecv": with one row)
MUTANTS = {
    # rounding and overflow
    "bf16_truncate": ("all_reduce", {"all_reduce"}),
    "fp16_truncate": ("reduce_scatter", {"reduce_scatter"}),
    "int8_saturate": ("reduce", {"reduce"}),
    # tails and chunk boundaries
    "tail8": ("all_reduce", {"all_reduce"}),
    "tail4": ("reduce_scatter", {"reduce_scatter"}),
    "last_chunk": ("all_gather", {"all_gather"}),
    # stale results
    "skip_repeat": ("all_reduce", {"all_reduce"}),
    "skip_same_recv": ("broadcast", {"broadcast"}),
    # stream order of collectives
    "no_stream_wait": ("all_to_all", {"stream_order_ccl"}),
    # rooted and point-to-point
    "reduce_inplace_clobber": ("reduce", {"reduce"}),
    "recv_any_source": ("sendrecv", {"p2p_matching"}),
    # device API semantics
    "query_always_done": ("sendrecv", {"stream_order"}),
    "event_query_always_done": ("sendrecv", {"stream_order"}),
    "elapsed_zero": ("sendrecv", {"events_timing"}),
    "elapsed_seconds": ("sendrecv", {"events_timing"}),
    "wait_event_ignored": ("sendrecv", {"events_timing"}),
    "free_leaks": ("sendrecv", {"alloc_free"}),
    "mem_info_always_free": ("sendrecv", {"alloc_free"}),
    "mem_info_double_total": ("sendrecv", {"alloc_free"}),
    "bad_free_ok": ("sendrecv", {"bad_free"}),
    "copy_large_short": ("sendrecv", {"copy_h2d_d2h"}),
    # the kernel table
    "add_one": ("sendrecv", {"kernels"}),
    "gemm_drop_last": ("sendrecv", {"kernels"}),
    "reduce_remainder": ("sendrecv", {"kernels"}),
    "broadcast_fast_path": ("sendrecv", {"kernels"}),
    "subnormal_flush": ("sendrecv", {"kernels"}),
    "bool_ff": ("sendrecv", {"kernels"}),
    "kernels_at_once": ("sendrecv", {"kernels"}),
    # device semantics (CUDA's documented behaviour)
    "query_last_item": ("sendrecv", {"stream_query"}),
    "query_ignores_kernels": ("sendrecv", {"stream_query"}),
    "event_first_record": ("sendrecv", {"event_rerecord"}),
    "elapsed_first_record": ("sendrecv", {"elapsed_time"}),
    "elapsed_clock": ("sendrecv", {"elapsed_time"}),
    "wait_latest_record": ("sendrecv", {"wait_binding"}),
    "mem_info_peak": ("sendrecv", {"mem_info"}),
    "mem_info_drift": ("sendrecv", {"mem_info"}),
    "peer_at_once": ("sendrecv", {"copy_peer"}),
    "peer_burst": ("sendrecv", {"copy_peer"}),
    # collective semantics (NCCL's documented behaviour)
    "avg_float32": ("all_reduce", {"all_reduce"}),
    "nan_identity": ("all_reduce", {"all_reduce"}),
    "split_world_size": ("sendrecv", {"split"}),
    "group_last_only": ("sendrecv", {"group_collectives"}),
    "first_op_stream": ("sendrecv", {"op_streams"}),
    "abort_silent": ("sendrecv", {"abort"}),
    # past the first chunk (1 MiB), and two messages to one peer: only the rows and messages added for them
    "late_root": ("broadcast", {"broadcast"}),
    "late_redop": ("all_reduce", {"all_reduce"}),
    "swap_same_peer": ("sendrecv", {"p2p_matching"}),
}

#: defects of the fault cases: certified with the faults
FAULT_MUTANTS = {"abort_silent"}


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mutants")
    project = new_plugin(NAME, "c", root)
    return build_template_wrapper(CC, project, HERE.parent / "c" / "conformance_mutants.c", root / f"lib{NAME}.so",
                                  f'-DNAME="{NAME}"', opt="-O2", includes=(ROOT / "csrc" / "common",),
                                  roots=(root,))


def _certify(library: Path, tmp_path: Path, defect: str | None, *args: str) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "MUTANT_DEFECT")}
    env.update(ANYCHIP_PLUGIN_PATH=str(library), ANYCHIP_LOG_LEVEL="ERROR")
    if defect:
        env["MUTANT_DEFECT"] = defect
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "conformance", "--device", NAME, "--json", str(out),
                        "--no-progress", "--no-tables", *args], capture_output=True, text=True, env=env,
                       timeout=LONG_CHILD_SECONDS)
    return r.returncode, json.loads(out.read_text())["backends"][0], r.stdout + r.stderr


@pytest.mark.slow
def test_the_plugin_without_a_defect_passes_every_case(library: Path, tmp_path: Path) -> None:
    """The control: the default quick run (3 ranks, the faults too), every case passed, its
    collectives the plugin's own."""
    rc, b, text = _certify(library, tmp_path, None)
    assert rc == 0, text[-4000:]
    assert b["transport"] == f"native/{NAME} collectives (simulated)" and b["ranks"] == 3
    assert {c["status"] for c in b["cases"]} == {"passed"}, [c for c in b["cases"] if c["status"] != "passed"]


@pytest.mark.parametrize("defect", sorted(MUTANTS))
@pytest.mark.slow
def test_each_planted_defect_fails_the_case_of_its_class(library: Path, tmp_path: Path, defect: str) -> None:
    op, cases = MUTANTS[defect]
    rows = ("-d", "int8", "-b", "8", "-e", "8") if op == "sendrecv" else ()
    faults = () if defect in FAULT_MUTANTS else ("--no-faults",)
    rc, b, text = _certify(library, tmp_path, defect, "-c", op, *faults, *rows)
    assert rc == 1, f"{defect} passed the suite:\n{text[-3000:]}"
    failed = {c["name"] for c in b["cases"] if c["status"] == "failed"}
    assert cases <= failed, (defect, failed, text[-3000:])
    for c in b["cases"]:
        if c["name"] in cases:
            assert c["detail"].startswith("rank ") or "rows" in c["detail"], c
            assert c["expected"] and c["got"], c


def test_an_unknown_defect_is_refused_with_the_reason(library: Path) -> None:
    env = {**os.environ, "ANYCHIP_PLUGIN_PATH": str(library), "MUTANT_DEFECT": "banana"}
    env.pop("ANYCHIP_DEVICES", None)
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "plugin", "check", str(library)], capture_output=True,
                       text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode != 0
    assert "MUTANT_DEFECT=banana is not a defect this library knows" in r.stdout + r.stderr


# -- --framework torch|paddle: the frameworks compute on the plugin's kernels -----------------------------

#: (framework, defect) -> the compute checks it must fail (on every rank), and pass without it
FRAMEWORK_MUTANTS = {
    ("torch", "add_one"): {"torch.add.ones", "torch.add_mul.int64", "torch.add_mul.float16"},
    ("paddle", "gemm_drop_last"): {"paddle.matmul.contiguous", "paddle.matmul.5x7x3"},
}


def _framework(library: Path, framework: str, defect: str | None) -> tuple[int, dict[str, str], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "MUTANT_DEFECT", "ANYCHIP_TORCH")}
    env.update(ANYCHIP_PLUGIN_PATH=str(library), ANYCHIP_LOG_LEVEL="ERROR")
    if defect:
        env["MUTANT_DEFECT"] = defect
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "conformance", "--framework", framework, "--device", NAME,
                        "-n", "2", "-e", "64"], capture_output=True, text=True, env=env, timeout=LONG_CHILD_SECONDS)
    failed = dict(re.findall(r"^#   FAIL (\S+) \((ranks? [\d,]+)\)", r.stdout, flags=re.M))
    return r.returncode, failed, r.stdout + r.stderr


@pytest.mark.parametrize("framework, defect", sorted(FRAMEWORK_MUTANTS))
@pytest.mark.slow
def test_a_wrong_kernel_fails_the_framework_certification(library: Path, framework: str, defect: str) -> None:
    """The plugin's kernels, through the framework's ops against its CPU: the checks a defect
    breaks pass on the correct plugin (which passes every check) and fail with it, on every
    rank, and the command fails."""
    rc, failed, text = _framework(library, framework, None)
    assert failed == {}, text[-4000:]
    assert rc == 0, text[-4000:]
    assert re.search(r"^# (\d+) value checks, 0 failed$", text, flags=re.M), text[-4000:]
    assert f"conformance ({framework}): PASS" in text, text[-4000:]
    rc, failed, text = _framework(library, framework, defect)
    assert rc == 1, f"{defect} passed --framework {framework}:\n{text[-3000:]}"
    for check in FRAMEWORK_MUTANTS[framework, defect]:
        assert failed.get(check) == "ranks 0,1", (check, failed, text[-3000:])
    assert f"conformance ({framework}): FAIL on {NAME}" in text


# -- the same device-API defects in a Python plugin (the Python scaffold) -------------------------------

PY_NAME = "mutpy"

PY_MUTANTS_MODULE = '''
"""The Python scaffold's plugin with the defect MUTANT_DEFECT names (none: as generated)."""
import os

from anychip_mutpy import MutpyPlugin

DEFECT = os.environ.get("MUTANT_DEFECT", "")


class MutantPlugin(MutpyPlugin):
    def _stream_query(self, index, stream):
        if DEFECT == "query_last_item":          # the running item counts as done
            with stream._cond:
                return stream._enqueued - stream._completed <= 1
        return True if DEFECT == "query_always_done" else super()._stream_query(index, stream)

    def _event_query(self, index, event):
        if DEFECT == "event_first_record":       # complete once any record completed
            with event.cond:
                return event.completed >= 1
        return True if DEFECT == "event_query_always_done" else super()._event_query(index, event)

    def _event_elapsed_ms(self, index, start, end):
        ms = super()._event_elapsed_ms(index, start, end)
        if DEFECT == "elapsed_first_record" and hasattr(start, "first_ns"):
            ms = (end.when_ns - start.first_ns) / 1e6
        return {"elapsed_zero": 0.0, "elapsed_seconds": ms / 1000, "elapsed_clock": ms * 1.25}.get(DEFECT, ms)

    def _stream_wait_event(self, index, stream, event):
        if DEFECT == "wait_latest_record":       # bound when the stream reaches it
            stream.enqueue(lambda: event.wait(event.recorded))
        elif DEFECT != "wait_event_ignored":
            super()._stream_wait_event(index, stream, event)

    def _free(self, index, handle):
        mem = self._mem[index]
        if DEFECT == "bad_free_ok" and handle not in mem.live:
            return
        size = mem.live[handle].size if handle in mem.live else 0
        super()._free(index, handle)
        if DEFECT == "free_leaks":
            with mem.lock:
                mem.used += size

    def _mem_info(self, index):
        free, total = super()._mem_info(index)
        if DEFECT == "mem_info_always_free":
            return total, total
        if DEFECT == "mem_info_double_total":
            return free + total, 2 * total
        if DEFECT == "mem_info_peak":
            mem = self._mem[index]
            mem.peak = max(getattr(mem, "peak", 0), total - free)
            return total - mem.peak, total
        return free, total

    def _malloc(self, index, nbytes):
        handle = super()._malloc(index, nbytes)
        if DEFECT == "mem_info_drift":           # the padding to 256 bytes counted twice, given back once
            mem = self._mem[index]
            with mem.lock:
                mem.used += max(256, (nbytes + 255) & ~255) - nbytes
        return handle

    def _event_record(self, index, event, stream):
        if DEFECT == "elapsed_first_record" and event.completed and not hasattr(event, "first_ns"):
            event.first_ns = event.when_ns
        super()._event_record(index, event, stream)

    def _synchronize(self, index):
        if DEFECT != "sync_one_stream":
            return super()._synchronize(index)
        self._default_stream(index).synchronize()

    def _copy_peer(self, dst_index, dst, dst_off, src_index, src, src_off, nbytes, stream):
        d, s = self._array(dst_index, dst), self._array(src_index, src)
        n = nbytes & ~63 if DEFECT == "peer_burst" else nbytes

        def run():
            d[dst_off:dst_off + n] = s[src_off:src_off + n]
        if DEFECT == "peer_at_once":
            run()
        else:
            stream.enqueue(run)
'''

#: the device API's defects: the case that must fail
PY_MUTANTS = {d: MUTANTS[d][1] for d in ("query_always_done", "event_query_always_done", "elapsed_zero",
                                         "elapsed_seconds", "wait_event_ignored", "free_leaks",
                                         "mem_info_always_free", "mem_info_double_total", "bad_free_ok",
                                         "query_last_item", "event_first_record", "elapsed_first_record",
                                         "elapsed_clock", "wait_latest_record", "mem_info_peak", "mem_info_drift",
                                         "peer_at_once", "peer_burst")}
#: a Python plugin's device synchronize is its own (a C plugin's is preceded by anychip's synchronize of
#: every stream it made, so a C plugin's one-stream device synchronize cannot be seen, nor do harm)
PY_MUTANTS["sync_one_stream"] = {"device_synchronize"}


@pytest.fixture(scope="module")
def python_plugin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PYTHONPATH for the rendered project and the mutant module, with a dist-info naming it
    under anychip.plugins: every rank finds it through the registry, as an installed plugin."""
    root = tmp_path_factory.mktemp("pymutants")
    project = new_plugin(PY_NAME, "python", root / "project")
    (root / "mutpy_defects.py").write_text(PY_MUTANTS_MODULE)
    dist = root / "mutpy_defects-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mutpy-defects\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[anychip.plugins]\n{PY_NAME} = mutpy_defects:MutantPlugin\n")
    return {"PYTHONPATH": os.pathsep.join([str(root), str(project), str(ROOT)])}


def _certify_py(env_extra: dict[str, str], tmp_path: Path, defect: str | None) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "MUTANT_DEFECT", "ANYCHIP_PLUGIN_PATH")}
    env.update(env_extra, ANYCHIP_LOG_LEVEL="ERROR")
    if defect:
        env["MUTANT_DEFECT"] = defect
    out = tmp_path / "out.json"
    # the device cases do not depend on the rows: one small row keeps the run short
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "conformance", "--device", PY_NAME, "--json", str(out),
                        "--no-progress", "--no-tables", "--no-faults", "-c", "sendrecv", "-d", "int8", "-b", "8",
                        "-e", "8"], capture_output=True, text=True, env=env, timeout=LONG_CHILD_SECONDS)
    return r.returncode, json.loads(out.read_text())["backends"][0], r.stdout + r.stderr


@pytest.mark.slow
def test_the_python_plugin_without_a_defect_passes(python_plugin: dict[str, str], tmp_path: Path) -> None:
    rc, b, text = _certify_py(python_plugin, tmp_path, None)
    assert rc == 0, text[-4000:]
    status = {c["name"]: c["status"] for c in b["cases"]}
    assert status.pop("kernels") == "skipped"            # the Python scaffold has no kernel set
    assert set(status.values()) == {"passed"}


@pytest.mark.parametrize("defect", sorted(PY_MUTANTS))
@pytest.mark.slow
def test_each_device_api_defect_of_a_python_plugin_fails(python_plugin: dict[str, str], tmp_path: Path,
                                                         defect: str) -> None:
    rc, b, text = _certify_py(python_plugin, tmp_path, defect)
    assert rc == 1, f"{defect} passed the suite:\n{text[-3000:]}"
    failed = {c["name"] for c in b["cases"] if c["status"] == "failed"}
    assert PY_MUTANTS[defect] <= failed, (defect, failed)


# -- the suite's own robustness: deadlines and signals ----------------------------------------------------

def _env(library: Path, defect: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES",)}
    env.update(ANYCHIP_PLUGIN_PATH=str(library), ANYCHIP_LOG_LEVEL="ERROR", MUTANT_DEFECT=defect)
    return env


@pytest.mark.slow
def test_a_case_without_an_answer_fails_at_its_deadline(library: Path, tmp_path: Path) -> None:
    """Streams and events that never report completion: the collective's wait never ends; the case
    fails after --deadline seconds naming itself and the rank, and the run ends with a verdict."""
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "conformance", "--device", NAME, "--json", str(out),
                        "--no-progress", "--deadline", "15", "--no-faults", "-c", "all_reduce", "-d", "int8", "-b",
                        "8", "-e", "8"], capture_output=True, text=True, env=_env(library, "never_done"),
                       timeout=CHILD_SECONDS)
    assert r.returncode == 1, r.stdout + r.stderr
    b = json.loads(out.read_text())["backends"][0]
    late = [c for c in b["cases"] if "no answer in 15 s" in c["detail"]]
    assert len(late) == 1 and late[0]["status"] == "failed", b["cases"]
    assert late[0]["detail"].startswith("rank ") and f"(case {late[0]['name']})" in late[0]["detail"]
    after = CASE_ORDER[CASE_ORDER.index(late[0]["name"]) + 1:]
    assert all(c["status"] == "failed" and c["detail"].startswith("not run") for c in b["cases"] if c["name"] in after)


@pytest.mark.slow
def test_sigterm_stops_the_whole_run(library: Path, tmp_path: Path) -> None:
    """SIGTERM while a backend's ranks hang: the ranks are stopped and no further backend starts."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "anychip.cli", "conformance", "--device", f"{NAME},cpu",
                          "--no-progress", "--deadline", "300", "--no-faults", "-c", "all_reduce", "-d", "int8", "-b",
                          "8", "-e", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(library, "never_done"))
    time.sleep(10)                       # the first backend's ranks are up and waiting forever
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, out + err
    assert "conformance: stopped by signal 15; the remaining backends were not run" in err
    assert "cpu" not in out
