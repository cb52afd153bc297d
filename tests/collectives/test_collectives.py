"""Collectives across processes: every op x dtype x reduce op on every backend, point to
point, groups, split, and the failure modes (a killed rank, a timeout, check mode).

Each test starts a few rank processes (tests/collectives/ccl_worker.py) that run many cases and
check their own results exactly; see that file for the inputs and expectations.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from conftest import CHILD_SECONDS, ccl_segments

import anychip

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ccl_worker.py")
BIG = 2**20 + 3


def _available(backend: str) -> bool:
    return any(b.name == backend and b.available for b in anychip.backends())


def _backends(*names: str) -> list:
    return [pytest.param(b, marks=pytest.mark.skipif(not _available(b), reason=f"{b} is unavailable")) for b in names]


# The three simulated chips share the engine's path (the simulator's memory, its IPC handles for
# zero-copy); what differs is each chip's adapter. The op x dtype x reduce-op matrix runs on each
# chip once, at two ranks (kunlun) or four (ascend, hygon), beside the host's and OpenCL's at both.
TWO_RANK_BACKENDS = _backends("cpu", "opencl", "kunlun")
FOUR_RANK_BACKENDS = _backends("cpu", "opencl", "ascend", "hygon")


def _assert_no_segment_left(before: set[str]) -> None:
    """Nothing new stays in /dev/shm. Another job on the machine may hold a segment for
    the moment its ranks take to map it; a leaked one never goes away."""
    deadline = time.monotonic() + 5
    while not ccl_segments() <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ccl_segments() <= before, f"shared-memory segments were left in /dev/shm: {ccl_segments() - before}"


def launch(n: int, device: str, *args: str, env: dict | None = None, timeout: float = CHILD_SECONDS) -> str:
    """`anychip launch -n N --device B tests/collectives/ccl_worker.py args...`; its output, checked for PASS
    per rank."""
    before = ccl_segments()
    cmd = [sys.executable, "-m", "anychip.cli", "launch", "-n", str(n), "--device", device, WORKER, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    for r in range(n):
        assert f"[{r}] PASS" in p.stdout, p.stdout + p.stderr
    _assert_no_segment_left(before)
    return p.stdout


@pytest.mark.parametrize("backend", TWO_RANK_BACKENDS)
@pytest.mark.slow
def test_every_op_dtype_and_reduce_op_on_two_ranks(backend: str) -> None:
    # 4 counts x 8 dtypes x 18 (op, redop), then every op at 2^20+3 in 4 dtypes on cpu, 2 elsewhere
    if backend == "cpu":
        assert "PASS 612 cases" in launch(2, backend, "matrix", "0,1,7,1000", str(BIG))
    else:
        assert "PASS 594 cases" in launch(2, backend, "matrix", "0,1,7,1000", str(BIG), "float32,bfloat16")


@pytest.mark.parametrize("backend", FOUR_RANK_BACKENDS)
@pytest.mark.slow
def test_every_op_dtype_and_reduce_op_on_four_ranks(backend: str) -> None:
    if backend in ("cpu", "hygon"):     # the staged and the zero-copy large paths, two dtypes at 2^20+3
        out = launch(4, backend, "matrix", "0,1,7,1000", str(BIG), "float32,bfloat16")
        assert "PASS 594 cases" in out
    else:
        assert "PASS 576 cases" in launch(4, backend, "matrix", "0,1,7,1000")


@pytest.mark.slow
def test_chunked_rounds_with_tiny_slots() -> None:
    # a 4 KiB chunk and a 64-byte small slot: many rounds, blocks split across rounds
    env = {"ANYCHIP_CCL_SMALL": "64", "ANYCHIP_CCL_CHUNK": "4096"}
    launch(4, "cpu", "matrix", "0,1,7,1000,5000", "0", env=env)
    # three ranks: slices and blocks of uneven sizes
    launch(3, "cpu", "matrix", "1,7,1000,5000", "0", env=env)
    # the same on a simulated chip with zero-copy disabled: the staged path on device memory
    launch(2, "kunlun", "matrix", "7,5000", "0", env={**env, "ANYCHIP_CCL_ZERO_COPY_MIN": str(2**40)})


@pytest.mark.parametrize("backend,n", [("cpu", 4), ("ascend", 4), ("opencl", 2), ("hygon", 3)])
@pytest.mark.slow
def test_send_recv_ring_groups_and_split(backend: str, n: int) -> None:
    if not _available(backend):
        pytest.skip(f"{backend} is unavailable")
    launch(n, backend, "p2p")


@pytest.mark.parametrize("backend,leave", [("cpu", "destroy"), ("cpu", "exit"), ("opencl", "destroy"),
                                           ("ascend", "destroy"), ("kunlun", "exit"), ("hygon", "destroy")])
@pytest.mark.slow
def test_grouped_ring_survives_a_peer_that_finished_and_left(backend: str, leave: str) -> None:
    """Rank 1's part of the group is done (its send is in the channel, its recv complete) and
    it destroys its communicator or exits while rank 2, 0.5 s late, has not received yet: rank 2
    still gets rank 1's message and rank 0 does not fail (it did: "missing rank 1 (pid N left
    the communicator ...)"), as for a send outside a group."""
    if not _available(backend):
        pytest.skip(f"{backend} is unavailable")
    out = launch(3, backend, "late_ring", leave, env={"ANYCHIP_COLLECTIVE_TIMEOUT": "60"})
    for r in range(3):
        assert f"[{r}] PASS 2 cases" in out, out


@pytest.mark.slow
def test_zero_copy_mappings_are_evicted_and_remade() -> None:
    assert "PASS 140 cases" in launch(2, "hygon", "ipc_cache")


# -- failures --------------------------------------------------------------------------

def _spawn(n: int, suite: str, device: str, env: dict, hold_last: bool = False) -> list[tuple[int, str, str]]:
    """Ranks started directly (the launcher would stop the others when one dies)."""
    job = f"test-{os.getpid()}-{time.monotonic_ns()}"
    procs = []
    for r in range(n):
        e = {**os.environ, **env, "ANYCHIP_RANK": str(r), "ANYCHIP_WORLD_SIZE": str(n), "ANYCHIP_JOB_ID": job,
             "ANYCHIP_LAUNCH_DEVICE": device}
        procs.append(subprocess.Popen([sys.executable, WORKER, suite], env=e, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    waiting = procs[:-1] if hold_last else procs
    for p in waiting:
        out, err = p.communicate(timeout=CHILD_SECONDS)
        results.append((p.returncode, out, err))
    if hold_last:
        out, err = procs[-1].communicate("", timeout=CHILD_SECONDS)
        results.append((procs[-1].returncode, out, err))
    return results


def _result(out: str) -> tuple[str, float, str]:
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    kind, secs, msg = line[len("RESULT "):].split("|", 2)
    return kind, float(secs), msg


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
@pytest.mark.slow
def test_killed_rank_mid_all_reduce_fails_the_others_and_leaves_no_segment(backend: str) -> None:
    before = ccl_segments()
    results = _spawn(4, "kill", backend, {"ANYCHIP_COLLECTIVE_TIMEOUT": "60"})
    assert results[1][0] == -9
    for r in (0, 2, 3):
        rc, out, err = results[r]
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert kind == "CollectiveError", msg
        assert secs < 10
        assert msg.startswith("all_reduce (op #1, group world) failed: missing rank 1 (pid "), msg
        assert msg.endswith(" died)"), msg
    _assert_no_segment_left(before)


@pytest.mark.slow
def test_timeout_raises_collective_timeout_on_every_waiting_rank() -> None:
    results = _spawn(3, "timeout", "cpu", {"ANYCHIP_COLLECTIVE_TIMEOUT": "60", "CCL_TEST_OP_TIMEOUT": "0.5"},
                     hold_last=True)
    for r in (0, 1):
        rc, out, err = results[r]
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert kind == "CollectiveTimeout", msg
        assert 0.4 < secs < 10
        assert "all_reduce (op #1, group world) timed out after 0.5 s on rank" in msg
        # which timeout applied: the one set on the communicator, not ANYCHIP_COLLECTIVE_TIMEOUT's 60 s
        assert "waiting for rank 2 (has not started any op) (the communicator's own timeout)" in msg, msg
    assert results[2][0] == 0


@pytest.mark.slow
def test_check_mode_reports_what_each_rank_called() -> None:
    results = _spawn(2, "check", "cpu", {"ANYCHIP_COLLECTIVE_CHECK": "1"})
    for rc, out, err in results:
        assert rc == 0, err
        kind, _, msg = _result(out)
        assert kind == "CollectiveError"
        assert msg == ("mismatched collective in group world (op #1; ANYCHIP_COLLECTIVE_CHECK): rank 0 called "
                       "all_reduce(count=10, float32, sum), rank 1 called all_reduce(count=11, float32, sum)")


@pytest.mark.slow
def test_send_recv_size_mismatch_fails_both_sides_at_once() -> None:
    results = _spawn(2, "p2p_mismatch", "cpu", {"ANYCHIP_COLLECTIVE_TIMEOUT": "60"})
    expect = "recv (group world): rank 0 sends 40 bytes but rank 1 expects 44 bytes"
    for rc, out, err in results:
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert (kind, msg) == ("CollectiveError", expect)
        assert secs < 10


def test_ranks_started_by_mpiexec() -> None:
    """MPICH's Hydra (the `mpich` wheel's mpiexec) sets PMI_RANK / PMI_SIZE / MPI_LOCALRANKID."""
    import shutil
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install mpich)")
    root = os.path.dirname(os.path.dirname(HERE))
    env = {**os.environ, "ANYCHIP_LAUNCH_DEVICE": "kunlun"}
    for v in ("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_JOB_ID", "RANK", "WORLD_SIZE"):
        env.pop(v, None)
    p = subprocess.run([mpiexec, "-n", "3", sys.executable, os.path.join(root, "examples", "allreduce.py")],
                       capture_output=True, text=True, timeout=CHILD_SECONDS, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    # Hydra forwards each rank's output in chunks of its own: lines can arrive joined or split
    # by an empty line, so the records are read out of the whole text
    records = sorted(re.findall(r"rank \d+ of \d+ on \w+:\d+: \[[^\]]*\] (?:correct|WRONG)", p.stdout))
    expected = [f"rank {r} of 3 on kunlun:{r}: [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0] correct" for r in range(3)]
    assert records == expected, p.stdout
