"""Bad arguments are refused where they are given, with an anychip error saying what is
wrong: collective arguments, Work.wait, anychip launch and anychip conformance flags, and
placements. No raw TypeError, no traceback, nothing started first."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import collectives


@pytest.fixture(scope="module")
def comm():
    c = collectives.init("cpu:0", world=collectives.World(0, 1, 0, 1, f"bad-args-{os.getpid()}-{time.monotonic_ns()}",
                                                          "none"))
    yield c
    c.destroy()


DTYPES = "int8, uint8, int32, int64, float16, bfloat16, float32, float64"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"count": [4]}, "all_reduce: count must be an integer, got list [4]"),
    ({"dtype": [1]}, f"all_reduce: dtype [1] is not supported; use one of {DTYPES} (by name or as a NumPy dtype)"),
    ({"dtype": {}}, f"all_reduce: dtype {{}} is not supported; use one of {DTYPES} (by name or as a NumPy dtype)"),
    ({"op": ["sum"]}, "all_reduce: reduce op ['sum'] is not supported; use one of sum, prod, min, max, avg"),
])
def test_unhashable_collective_arguments(comm, kwargs, message):
    buf = comm.device.alloc(16)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        comm.all_reduce(buf, **kwargs)
    assert str(info.value) == message
    with pytest.raises(anychip.InvalidArgumentError) as info:
        comm.broadcast(buf, root={})
    assert str(info.value) == "broadcast: root must be an int rank in [0, 1), got {}"


def test_dtype_none_is_the_default_float32(comm):
    buf = comm.device.alloc(12).copy_from(np.arange(3, dtype=np.float32))    # 3 float32, not whole float64s
    comm.all_reduce(buf, dtype=None).wait()
    assert buf.to_numpy(np.float32).tolist() == [0, 1, 2]
    with pytest.raises(anychip.InvalidArgumentError, match="not a whole number of 8-byte units"):
        comm.all_reduce(buf, dtype="float64")


@pytest.mark.parametrize("timeout", ["1", float("nan"), -1, True, [1]])
def test_work_wait_timeout_must_be_seconds(comm, timeout):
    work = comm.barrier()
    with pytest.raises(anychip.InvalidArgumentError) as info:
        work.wait(timeout=timeout)
    assert str(info.value) == f"Work.wait: timeout must be a number of seconds >= 0 or None, got {timeout!r}"


def test_shard_tensor_placements_must_be_a_list(comm):
    from anychip.parallel import ProcessMesh, shard_tensor
    mesh = ProcessMesh([0], comm=comm)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        shard_tensor(np.zeros(4, np.float32), mesh, None)
    assert str(info.value) == ("shard_tensor: placements must be a list of Shard(dim), Replicate() or Partial(op), "
                               "one per mesh dimension, got None")


def _cli(*args: str, timeout: float = CHILD_SECONDS) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    return subprocess.run([sys.executable, "-m", "anychip.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _refused(r: subprocess.CompletedProcess, line: str) -> None:
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr == f"anychip: error: {line}\n", r.stderr


@pytest.mark.parametrize(("args", "line"), [
    (["--grace", "-1"], "launch: --grace must be a number of seconds >= 0, got -1.0"),
    (["--grace", "nan"], "launch: --grace must be a number of seconds >= 0, got nan"),
    (["--device", "cpu:7"], "launch: --device takes a backend name (rank r runs on BACKEND:r), got 'cpu:7'; "
                            "e.g. --device cpu"),
])
def test_launch_flags_are_checked_before_any_rank_starts(args, line, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("raise SystemExit('a rank ran')\n")
    _refused(_cli("launch", "-n", "2", *args, str(prog)), line)


@pytest.mark.slow
def test_launch_of_an_unknown_backend(tmp_path):
    r = _cli("launch", "-n", "2", "--device", "no_such_chip", str(tmp_path / "p.py"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("anychip: error: launch: --device 'no_such_chip' is not a known backend; known: "), \
        r.stderr


@pytest.mark.slow
def test_launch_of_a_program_that_cannot_run(tmp_path):
    r = _cli("launch", "-n", "2", "no-such-program-here")
    _refused(r, "launch: starting rank 0 of 2 (no-such-program-here) failed: [Errno 2] No such file or directory: "
                "'no-such-program-here'")
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\necho hi\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    r = _cli("launch", "-n", "2", str(plain))
    _refused(r, f"launch: starting rank 0 of 2 ({plain}) failed: [Errno 13] Permission denied: '{plain}'")


@pytest.mark.parametrize(("args", "line"), [
    (["-n", "65"], "conformance: -n must be from 1 to 64 (the collective engine's limit), got 65"),
    (["-n", "100000"], "conformance: -n must be from 1 to 64 (the collective engine's limit), got 100000"),
    (["--json", "/nonexistent/x.json"], "conformance: --json /nonexistent/x.json: the directory /nonexistent does "
                                        "not exist"),
])
@pytest.mark.slow
def test_conformance_flags_are_checked_before_the_run(args, line):
    _refused(_cli("conformance", "--device", "cpu", *args), line)
