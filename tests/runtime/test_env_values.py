"""Values of the collectives' environment variables: every invalid one is flagged by
``anychip info`` (exit 1) and refused with a clear error where it is read; ``inf`` is a
timeout that never expires."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import collectives

BAD = [
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "abc", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "-1", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_COLLECTIVE_CHECK", "maybe", "want one of 0, 1, true, false, yes, no, on, off"),
    ("ANYCHIP_COLLECTIVE_TRANSPORT", "nccl", "want one of auto, native, host"),
    ("ANYCHIP_HOST_TRANSPORT", "tcp", "want one of auto, shm, mpi"),
    ("ANYCHIP_CCL_SMALL", "abc", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_CHUNK", "0", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_SPIN_US", "-1", "want a number of microseconds > 0"),
    ("ANYCHIP_CCL_ZERO_COPY_MIN", "abc", "want a whole number of bytes >= 0"),
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "1_0", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_CCL_SMALL", "4096.5", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_SPIN_US", "0x10", "want a number of microseconds > 0"),
    ("ANYCHIP_TORCH_KERNELS", "fast", "want one of 0, 1, all"),
    ("ANYCHIP_TORCH_C10D_DIRECT", "yes", "want one of 0, 1"),
]
GOOD = [("ANYCHIP_COLLECTIVE_TIMEOUT", "inf"), ("ANYCHIP_COLLECTIVE_TIMEOUT", "0.5"),
        ("ANYCHIP_COLLECTIVE_CHECK", "ON"), ("ANYCHIP_CCL_SMALL", "4096"), ("ANYCHIP_CCL_SPIN_US", "2.5"),
        ("ANYCHIP_CCL_ZERO_COPY_MIN", "0"), ("ANYCHIP_HOST_TRANSPORT", "mpi"), ("ANYCHIP_COLLECTIVE_TIMEOUT", "1e1"),
        ("ANYCHIP_CCL_SMALL", " 4096 "), ("ANYCHIP_COLLECTIVE_CHECK", " off ")]


def _info(name: str, value: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYCHIP_")}
    env[name] = value
    return subprocess.run([sys.executable, "-m", "anychip.cli", "info"], capture_output=True, text=True, env=env,
                          timeout=CHILD_SECONDS)


@pytest.mark.parametrize(("name", "value", "why"), BAD)
def test_anychip_info_flags_every_invalid_collectives_value(name, value, why):
    r = _info(name, value)
    assert r.returncode == 1, r.stdout
    assert f"anychip: error: {name}={value!r} is invalid: {why}\n" in r.stderr, r.stderr
    assert f"      <- INVALID: {why}" in r.stdout


@pytest.mark.parametrize(("name", "value"), GOOD)
def test_anychip_info_accepts_valid_values(name, value):
    r = _info(name, value)
    assert r.returncode == 0, r.stderr
    assert "INVALID" not in r.stdout


def _single(device: str, monkeypatch: pytest.MonkeyPatch):
    world = collectives.World(0, 1, 0, 1, f"env-test-{os.getpid()}-{time.monotonic_ns()}", "none")
    return collectives.init(device, world=world)


def test_a_bad_zero_copy_threshold_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ANYCHIP_CCL_ZERO_COPY_MIN", "abc")
    with pytest.raises(anychip.InvalidArgumentError) as info:
        _single("cpu:0", monkeypatch)
    assert str(info.value) == "ANYCHIP_CCL_ZERO_COPY_MIN='abc' is not a whole number of bytes >= 0"


#: the variables the C engine reads itself: a bad value is refused before a communicator is made
ENGINE_BAD = [b for b in BAD if b[0] in ("ANYCHIP_CCL_SMALL", "ANYCHIP_CCL_CHUNK", "ANYCHIP_CCL_SPIN_US",
                                         "ANYCHIP_COLLECTIVE_CHECK")]


@pytest.mark.parametrize(("name", "value", "why"), ENGINE_BAD)
def test_a_bad_value_the_engine_would_ignore_is_refused_at_init(name, value, why, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        _single("cpu:0", monkeypatch)
    assert str(info.value) == f"{name}={value!r} is invalid: {why}"


def test_the_collective_check_flag_reads_every_spelling(monkeypatch):
    from anychip.runtime.env import collective_check
    for value, on in (("1", True), (" ON ", True), ("yes", True), ("true", True), ("off", False), ("0", False),
                      ("No", False), ("", False)):
        monkeypatch.setenv("ANYCHIP_COLLECTIVE_CHECK", value)
        assert collective_check() is on, value


SIM = [d for d in ("cpu:0", "ascend:0", "hygon:0") if any(x.name == d for x in anychip.devices())]


@pytest.mark.parametrize("device", SIM)
def test_an_infinite_timeout_never_expires(device, monkeypatch):
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "inf")
    comm = _single(device, monkeypatch)
    try:
        buf = comm.device.alloc(16).copy_from(np.arange(4, dtype=np.float32))
        comm.all_reduce(buf).wait()
        assert buf.to_numpy(np.float32).tolist() == [0, 1, 2, 3]
    finally:
        comm.destroy()


PROG = """
import numpy as np
from anychip import collectives
comm = collectives.init()
buf = comm.device.alloc(16).copy_from(np.full(4, comm.rank + 1, np.float32))
comm.all_reduce(buf).wait()
print("sum", buf.to_numpy(np.float32).tolist(), comm.transport.name)
comm.destroy()
"""


@pytest.mark.parametrize("backend", [b for b in ("cpu", "ascend") if any(d.backend == b for d in anychip.devices())])
def test_an_infinite_timeout_on_two_ranks(backend, tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    env["ANYCHIP_COLLECTIVE_TIMEOUT"] = "inf"
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", "--device", backend, str(prog)],
                       capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[{rank}] sum [3.0, 3.0, 3.0, 3.0]" in r.stdout, r.stdout
