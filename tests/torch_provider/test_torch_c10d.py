"""The c10d backend `anychip` (anychip.torch.distributed, docs/torch.md): every op by value,
DistributedDataParallel against one device, a killed rank and a timeout."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, build_template_wrapper, ccl_segments, leaked_segments

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _launch(n: int, *argv: str, timeout: float = CHILD_SECONDS, device: str = "ascend",
            **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANYCHIP_TORCH", "ANYCHIP_TORCH_C10D_DIRECT", "ANYCHIP_COLLECTIVE_TIMEOUT")}
    env.update(extra)
    cmd = [sys.executable, "-m", "anychip", "launch", "-n", str(n), "--device", device, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def _every_op(n: int, device: str = "ascend") -> tuple[str, dict[int, int]]:
    """The worker's output on n ranks, and each rank's count of passed checks: per dtype (4
    float, 4 integer) 4 all_reduce ops, AVG or the 3 bitwise ones, n broadcast and n reduce
    roots, n + 1 all_gather blocks, 2 reduce_scatter, 2 all_to_all_single, n all_to_all
    blocks, 1 send/recv ring (rank 1: also the plain recv from rank 0); then bool, async,
    future, scatter and the refusal, and on rank 0 the n gathered blocks."""
    done = _launch(n, str(ROOT / "src" / "anychip" / "conformance" / "torch_worker.py"), device=device)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.findall(r"CHECK \S+ FAIL.*", done.stdout) == []
    counts = {int(r): int(c) for r, c in re.findall(r"DONE (\d) failures=0 checks=(\d+)", done.stdout)}
    assert sorted(counts) == list(range(n)), done.stdout[-2000:]
    # the hot ops of device tensors took the C++ path, the same number of times on every rank
    direct = [json.loads(d) for d in re.findall(r"\] DIRECT (.*)", done.stdout)]
    assert len(direct) == n and all(d == direct[0] for d in direct), direct
    assert sorted(direct[0]) == ["all_gather_into_tensor", "all_reduce", "broadcast", "reduce_scatter_tensor"]
    assert all(c >= 4 for c in direct[0].values()), direct[0]
    return done.stdout, counts


def _want_checks(n: int, rank: int) -> int:
    per_dtype = 4 * (4 + 1 + 4 * n + 1 + 2 + 2 + 1) + 4 * (4 + 3 + 4 * n + 1 + 2 + 2 + 1)
    return per_dtype + 5 + (n if rank == 0 else 0) + (8 if rank == 1 else 0)


@pytest.mark.slow
def test_every_op_by_value_on_two_ranks():
    out, counts = _every_op(2)
    assert counts == {0: 167, 1: 173} == {r: _want_checks(2, r) for r in range(2)}
    done = subprocess.CompletedProcess([], 0, out, "")
    for op in ("all_reduce.avg.float16", "all_reduce.BXOR.uint8", "all_reduce.PRODUCT.int8", "broadcast.1.bfloat16",
               "reduce.0.int64", "all_gather_into_tensor.float16", "reduce_scatter.int8",
               "all_to_all_single.uneven.int64", "all_to_all.1.uint8", "send/recv.float64", "recv.int32", "scatter",
               "gather.1", "future", "all_reduce.bool.sum", "refuses.non_contiguous"):
        assert f"[0] CHECK {op} ok" in done.stdout or f"[1] CHECK {op} ok" in done.stdout, op


@pytest.mark.parametrize("device, direct", [
    # BKCL has no int8 and no average: those reductions take the communicator's path (the host engine)
    ("kunlun", {"all_gather_into_tensor": 8, "all_reduce": 29, "broadcast": 16, "reduce_scatter_tensor": 7}),
    # RCCL reduces every dtype, average included
    ("hygon", {"all_gather_into_tensor": 8, "all_reduce": 37, "broadcast": 16, "reduce_scatter_tensor": 8})])
@pytest.mark.slow
def test_every_op_by_value_on_the_other_simulated_chips(device, direct):
    out, counts = _every_op(2, device)
    assert counts == {0: 167, 1: 173}
    assert f"[0] DIRECT {json.dumps(direct, sort_keys=True)}" in out


def _test_plugin(tmp_path: Path, name: str, variant: str) -> Path:
    """The test plugin of tests/c/plugin_variants.c's VARIANT_<variant>, as backend `name`."""
    from anychip.scaffold import new_plugin
    project = new_plugin("tmpl", "c", tmp_path)
    return build_template_wrapper(os.environ.get("CC", "cc"), project, ROOT / "tests" / "c" / "plugin_variants.c",
                                  tmp_path / f"lib{name}.so", f'-DNAME="{name}"', f"-DVARIANT_{variant}",
                                  roots=(tmp_path,))


@pytest.mark.slow
def test_a_c_plugins_collectives_take_the_cpp_path_where_its_masks_allow(tmp_path):
    lib = _test_plugin(tmp_path, "tshm", "CCL_SHM")
    done = _launch(2, str(HERE / "plugin_ops.py"), device="tshm", ANYCHIP_TORCH="tshm", ANYCHIP_PLUGIN_PATH=str(lib))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    want = 'tshm True {"all_gather_into_tensor": 1, "all_reduce": 2, "broadcast": 1}'
    assert f"[0] RESULT {want}" in done.stdout and f"[1] RESULT {want}" in done.stdout, done.stdout[-2000:]


def _hang(tmp_path: Path, direct: str, **extra: str) -> subprocess.CompletedProcess:
    """plugin_hang.py on 2 ranks of a plugin whose every all_reduce enqueues work that never ends
    (the plugin reports success), under init_process_group(timeout=2 s)."""
    lib = _test_plugin(tmp_path, "thang", "CCL_HANG")
    return _launch(2, str(HERE / "plugin_hang.py"), "2", device="thang", ANYCHIP_TORCH="thang",
                   ANYCHIP_PLUGIN_PATH=str(lib), CCL_HANG_RANKS="all", ANYCHIP_TORCH_C10D_DIRECT=direct, **extra)


@pytest.mark.parametrize("direct", ["1", "0"])
@pytest.mark.slow
def test_a_plugin_collective_that_never_completes_fails_every_rank_after_the_groups_timeout(tmp_path, direct):
    """On the C++ path (direct "1") its watchdog, on the Python one the native transport's, fails
    the Work a second past the group's timeout, naming the op, the rank and the timeout, and
    aborts the communicator, whose abort ends the stuck work (CCL_HANG_ABORT_ENDS, as
    ncclCommAbort ends its kernels): Work.wait raises, the future fails alike, the job ends.
    Before, the C++ path's Work.wait blocked in the library for ever."""
    before = ccl_segments()
    done = _hang(tmp_path, direct, CCL_HANG_ABORT_ENDS="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    path = "direct" if direct == "1" else "python"
    for rank in (0, 1):
        lines = [ln.removeprefix(f"[{rank}] ") for ln in done.stdout.splitlines() if ln.startswith(f"[{rank}] ")]
        assert len(lines) == 3 and lines[0] == f"PATH {path}", lines
        waited, said = re.fullmatch(r"RAISED ([\d.]+) (.*)", lines[1]).groups()
        assert said == _never_completed(rank) and 2.9 <= float(waited) < 8, lines
        assert lines[2] == f"FUTURE {_never_completed(rank)}", lines
    assert leaked_segments(before) == set()


@pytest.mark.slow
def test_a_plugin_collective_whose_work_outlives_the_abort_ends_the_process(tmp_path):
    """The plugin's abort does not end the stuck work: nothing can, and Work.wait stays in the
    library's wait; 10 s after the abort the C++ path's watchdog says so and ends the process
    (as ProcessGroupNCCL's does), so the job ends."""
    t = time.monotonic()
    done = _hang(tmp_path, "1")
    took = time.monotonic() - t
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["[0] PATH direct", "[1] PATH direct"], done.stdout
    for rank in (0, 1):
        assert (f"[{rank}] anychip: rank {rank}: all_reduce (group 0) did not complete within 2 s "
                f"(the group's own timeout), and its work on anychip:{rank} still runs 10 s after the abort: "
                "nothing can end it; ending the process\n") in done.stderr, done.stderr[-3000:]
    assert took < 90, took


def _never_completed(rank: int) -> str:
    return (f"anychip c10d all_reduce (rank {rank} of 2, group 0): all_reduce (group 0) did not complete within 2 s "
            f"on rank {rank} (the group's own timeout); the communicator was aborted")


@pytest.mark.slow
def test_every_op_by_value_on_four_ranks():
    out, counts = _every_op(4)
    assert counts == {0: 233, 1: 237, 2: 229, 3: 229} == {r: _want_checks(4, r) for r in range(4)}
    for r in range(4):      # every rank checked the ops with a root at every rank, and the gathers' every block
        for op in ("broadcast.3.bfloat16", "reduce.3.int8", "all_gather.3.float16", "all_to_all.3.uint8",
                   "all_reduce.PRODUCT.int8", "all_reduce.BXOR.int64", "all_to_all_single.uneven.int32",
                   "reduce_scatter_tensor.float64", "send/recv.bfloat16", "scatter", "future"):
            assert f"[{r}] CHECK {op} ok" in out, (r, op)
    assert "[0] CHECK gather.3 ok" in out


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.slow
def test_ddp_losses_equal_one_devices(n):
    done = _launch(n, "examples/torch_ddp.py", "--check", "--steps", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"losses equal one device's (4 steps, {n} ranks on ascend)" in done.stdout


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.slow
def test_views_inside_a_storage_reuse_the_prepared_op_and_keep_no_freed_memory(direct):
    # tests/torch_provider/views.py: a tensor that starts inside its storage, all_reduced 25
    # times, is checked and prepared once by the communicator (and never on the C++ path); a
    # freed, a reused and a resized storage are each prepared anew, with their own values, and
    # the device memory returns to where it was
    done = _launch(2, str(HERE / "views.py"), ANYCHIP_TORCH_C10D_DIRECT=direct)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.findall(r"CHECK \S+ FAIL.*", done.stdout) == []
    mode = "direct" if direct == "1" else "communicator"
    assert done.stdout.count(f"] MODE {mode}") == 2, done.stdout[-2000:]
    for r in range(2):
        for what in ("values", "prepared_once", "async_entries", "freed_released", "reused_storage",
                     "reused_prepared_again", "resized_values", "resized_prepared_again", "resized_old_released",
                     "all_released"):
            assert f"[{r}] CHECK view.{what} ok" in done.stdout, (r, what)
        assert f"[{r}] DONE {r} failures=0" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(*argv: str, direct: str) -> list[subprocess.CompletedProcess]:
    """Two ranks started directly (no launcher stops the survivor): their results, in rank order;
    rank 0's all_reduce on the C++ path (direct "1") or the Python one ("0"), which it says."""
    port = _free_port()
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ANYCHIP_LAUNCH_DEVICE": "ascend",
               "ANYCHIP_TORCH_C10D_DIRECT": direct}
        for k in ("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE", "ANYCHIP_JOB_ID",
                  "ANYCHIP_TORCH", "ANYCHIP_COLLECTIVE_TIMEOUT"):
            env.pop(k, None)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "faults.py"), *argv], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=CHILD_SECONDS)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    path = "direct" if direct == "1" else "python"
    assert f"PATH {path}\n" in out[0].stdout, out[0].stdout + out[0].stderr[-3000:]
    return out


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.slow
def test_a_killed_rank_fails_the_survivors_op_naming_it(direct):
    before = ccl_segments()
    r0, r1 = _two_ranks("kill", "60", direct=direct)
    assert r1.returncode == -9
    assert r0.returncode == 3, r0.stdout + r0.stderr[-3000:]
    line = next(ln for ln in r0.stdout.splitlines() if ln.startswith("ERROR"))
    assert line.startswith("ERROR DistBackendError: anychip c10d all_reduce (rank 0 of 2, group ")
    assert re.search(r"missing rank 1 \(pid \d+ died\)", line), line
    future = next(ln for ln in r0.stdout.splitlines() if ln.startswith("FUTURE"))
    assert future == "FUTURE DistBackendError: " + line.removeprefix("ERROR DistBackendError: "), future
    assert leaked_segments(before) == set()


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.slow
def test_a_rank_that_never_joins_is_a_timeout_naming_it(direct):
    before = ccl_segments()
    r0, r1 = _two_ranks("timeout", "2", direct=direct)
    assert r0.returncode == 3, r0.stdout + r0.stderr[-3000:]
    line = next(ln for ln in r0.stdout.splitlines() if ln.startswith("ERROR"))
    assert "timed out after 2.0 s on rank 0: waiting for rank 1" in line, line
    assert r1.returncode == 0
    assert leaked_segments(before) == set()
    assert sys.executable


@pytest.mark.parametrize("direct, env, want", [("1", None, 2.0), ("0", None, 2.0), ("1", "3", 3.0)])
@pytest.mark.slow
def test_each_group_times_out_at_its_own_timeout(direct, env, want):
    """init_process_group(timeout=20 s), then new_group(timeout=2 s) in one process: rank 1 skips an
    all_reduce of the short group, whose op fails on rank 0 after its own 2 s with the library's
    detail naming rank 1 (the group's timeout reaches its communicator: the simulated HCCL through
    plugin.h's comm_init_rank_timeout); the world, 20 s, still works; the environment is not
    written. ANYCHIP_COLLECTIVE_TIMEOUT, when set, overrides every group's timeout (3 s). Before,
    the first group wrote its timeout into the environment and every later group had it (20 s)."""
    extra = {"ANYCHIP_TORCH_C10D_DIRECT": direct, **({"ANYCHIP_COLLECTIVE_TIMEOUT": env} if env else {})}
    done = _launch(2, str(HERE / "two_timeouts.py"), "20", "2", **extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for r in range(2):
        assert f"[{r}] ENV {env or 'unset'} {env or 'unset'}\n" in done.stdout, done.stdout
        assert f"[{r}] WORLD [3.0, 3.0, 3.0, 3.0]\n" in done.stdout, done.stdout
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("[0] SHORT "))
    secs, msg = line.removeprefix("[0] SHORT ").split("|", 1)
    assert msg.startswith("anychip c10d all_reduce (rank 0 of 2, group "), msg
    source = f"ANYCHIP_COLLECTIVE_TIMEOUT={env}" if env else "the communicator's own timeout"
    assert f"timed out after {want:.1f} s on rank 0: waiting for rank 1 (last in op #1 all_reduce) ({source})" in msg, \
        msg
    assert want - 0.5 < float(secs) < want + 6, secs
    group = f"ANYCHIP_COLLECTIVE_TIMEOUT={env}, which overrides the group's own 2 s" if env else \
        "the group's own timeout"
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("[0] SET "))
    assert re.fullmatch(rf"\[0\] SET anychip c10d: the timeout of process group \S+ \({want:g} s, {re.escape(group)}\) "
                        r"is fixed when the group is made, for its communicator's waits for its peers; make a group "
                        r"with the timeout wanted \(torch.distributed.new_group\(ranks, timeout=...\)\), or set "
                        r"ANYCHIP_COLLECTIVE_TIMEOUT before the groups are made; got "
                        r"set_timeout\(datetime.timedelta\(seconds=60\)\)", line), line


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.slow
def test_an_aborted_group_fails_its_pending_op_at_once(direct):
    before = ccl_segments()
    r0, r1 = _two_ranks("abort", "3", direct=direct)
    assert r0.returncode == 4, r0.stdout + r0.stderr[-3000:]
    lines = {ln.split(" ", 1)[0]: ln for ln in r0.stdout.splitlines()}
    assert re.fullmatch(r"ABORTED DistBackendError: anychip c10d all_reduce \(rank 0 of 2, group (\S+)\): all_reduce "
                        r"\(group \1\) aborted: torch.distributed abort", lines["ABORTED"]), lines
    assert lines["AFTER"] == "AFTER completed=True failed=True quick=True"
    assert lines["FUTURE"] == "FUTURE DistBackendError: " + lines["ABORTED"].removeprefix("ABORTED DistBackendError: ")
    assert r1.returncode == 0
    assert leaked_segments(before) == set()


@pytest.mark.slow
def test_conformance_framework_torch_prints_tables_and_passes():
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_TORCH"}
    done = subprocess.run([sys.executable, "-m", "anychip", "conformance", "--framework", "torch", "--device",
                                          "ascend", "-n", "2"], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS, cwd=ROOT)
    failed = re.findall(r"^#   FAIL (\S+) \(ranks? [\d,]+\): ", done.stdout, flags=re.M)
    assert failed == [], done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter"):
        assert f"# {op} (torch.distributed), float32, sum" in done.stdout
    assert int(re.search(r"# (\d+) value checks", done.stdout).group(1)) > 600
    assert "conformance (torch): PASS" in done.stdout
    rows = re.findall(r"^ +(\d+) +(\d+) +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$", done.stdout, flags=re.M)
    assert len(rows) >= 4 * 7 and all(wrong == "0" for _, _, wrong in rows)


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.slow
def test_work_wait_timeout_raises_naming_the_op_and_leaves_it_pending(direct):
    before = ccl_segments()
    r0, r1 = _two_ranks("late", "60", direct=direct)
    assert r0.returncode == 0 and r1.returncode == 0, r0.stdout + r0.stderr[-3000:] + r1.stderr[-3000:]
    lines = {ln.split(" ", 1)[0]: ln for ln in r0.stdout.splitlines()}
    assert re.fullmatch(r"WAIT DistBackendError: anychip c10d all_reduce \(rank 0 of 2, group \S+\): Work.wait "
                        r"timed out after 0.3 s; the op has not completed \(it is still pending\)",
                        lines["WAIT"]), lines
    assert lines["PENDING"] == "PENDING completed=False exception=None future_done=False"
    assert lines["DONE"] == "DONE completed=True exception=None value=4.0 future=4.0"
    assert leaked_segments(before) == set()
