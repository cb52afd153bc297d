"""The c10d backend `anychip` (anychip.torch.distributed, docs/torch.md): every op by value,
DistributedDataParallel against one device, a killed rank and a timeout."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS

from anychip._spawn import python_command  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _launch(n: int, *argv: str, timeout: float = CHILD_SECONDS) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH",)}
    cmd = python_command(["-m", "anychip", "launch", "-n", str(n), "--device", "ascend", *argv])
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_every_op_by_value_on_two_ranks():
    done = _launch(2, str(ROOT / "anychip" / "conformance" / "torch_worker.py"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.findall(r"CHECK \S+ FAIL.*", done.stdout) == []
    counts = sorted(int(m) for m in re.findall(r"DONE \d failures=0 checks=(\d+)", done.stdout))
    assert len(counts) == 2 and counts[0] > 150, done.stdout[-2000:]
    for op in ("all_reduce.avg.float16", "all_reduce.BXOR.uint8", "all_reduce.PRODUCT.int8", "broadcast.1.bfloat16",
               "reduce.0.int64", "all_gather_into_tensor.float16", "reduce_scatter.int8",
               "all_to_all_single.uneven.int64", "all_to_all.1.uint8", "send/recv.float64", "recv.int32", "scatter",
               "gather.1", "future", "all_reduce.bool.sum", "refuses.non_contiguous"):
        assert f"[0] CHECK {op} ok" in done.stdout or f"[1] CHECK {op} ok" in done.stdout, op


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_losses_equal_one_devices(n):
    done = _launch(n, "examples/torch_ddp.py", "--check", "--steps", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"losses equal one device's (4 steps, {n} ranks on ascend)" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(*argv: str) -> list[subprocess.CompletedProcess | None]:
    """Two ranks started directly (no launcher stops the survivor): their results, in rank order."""
    port = _free_port()
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ANYCHIP_LAUNCH_DEVICE": "ascend"}
        for k in ("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE", "ANYCHIP_JOB_ID",
                  "ANYCHIP_TORCH", "ANYCHIP_COLLECTIVE_TIMEOUT"):
            env.pop(k, None)
        procs.append(subprocess.Popen(python_command([str(HERE / "faults.py"), *argv]), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=CHILD_SECONDS)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    return out


def test_a_killed_rank_fails_the_survivors_op_naming_it():
    before = _shm()
    r0, r1 = _two_ranks("kill", "60")
    assert r1.returncode == -9
    assert r0.returncode == 3, r0.stdout + r0.stderr[-3000:]
    line = next(ln for ln in r0.stdout.splitlines() if ln.startswith("ERROR"))
    assert line.startswith("ERROR DistBackendError: anychip c10d all_reduce (rank 0 of 2, group ")
    assert re.search(r"missing rank 1 \(pid \d+ died\)", line), line
    assert _shm() - before == set()


def test_a_rank_that_never_joins_is_a_timeout_naming_it():
    before = _shm()
    r0, r1 = _two_ranks("timeout", "2")
    assert r0.returncode == 3, r0.stdout + r0.stderr[-3000:]
    line = next(ln for ln in r0.stdout.splitlines() if ln.startswith("ERROR"))
    assert "timed out after 2.0 s on rank 0: waiting for rank 1" in line, line
    assert r1.returncode == 0
    assert _shm() - before == set()
    assert sys.executable


def test_conformance_framework_torch_prints_tables_and_passes():
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_TORCH"}
    done = subprocess.run(python_command(["-m", "anychip", "conformance", "--framework", "torch", "--device",
                                          "ascend", "-n", "2"]), capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter"):
        assert f"# {op} (torch.distributed), float32, sum" in done.stdout
    assert re.search(r"# (\d+) value checks, 0 failed", done.stdout)
    assert int(re.search(r"# (\d+) value checks", done.stdout).group(1)) > 300
    assert "conformance (torch): PASS" in done.stdout
    rows = re.findall(r"^ +(\d+) +(\d+) +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$", done.stdout, flags=re.M)
    assert len(rows) >= 4 * 7 and all(wrong == "0" for _, _, wrong in rows)
