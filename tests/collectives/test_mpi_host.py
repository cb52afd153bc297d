"""The host transport's choices and element-type arithmetic, in this process (no MPI job)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from anychip import InvalidArgumentError, UnsupportedError
from anychip.collectives import World
from anychip.collectives.transports.choose import choose, host_key
from anychip.collectives.transports.staged import acc_type, finish_avg, from_acc, to_acc


def world(size: int, local_size: int, launcher: str = "anychip") -> World:
    return World(0, size, 0, local_size, "job", launcher)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("ANYCHIP_HOST_TRANSPORT", "ANYCHIP_HOSTID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unknown_host_transport_is_refused(env: pytest.MonkeyPatch) -> None:
    import anychip
    env.setenv("ANYCHIP_HOST_TRANSPORT", "tcp")
    want = r"ANYCHIP_HOST_TRANSPORT='tcp' is not understood; use auto, shm or mpi"
    with pytest.raises(InvalidArgumentError, match=want):
        choose(anychip.device("cpu"), world(2, 2))


@pytest.mark.parametrize("mode", ["shm", "auto"])
def test_spanning_hosts_without_mpi_is_refused(env: pytest.MonkeyPatch, mode: str) -> None:
    import anychip
    env.setenv("ANYCHIP_HOST_TRANSPORT", mode)
    want = (r"ANYCHIP_HOST_TRANSPORT=shm: the job spans more than one host \(4 ranks, 2 on this one\)" if mode == "shm"
            else r"the job spans more than one host \(4 ranks, 2 on this one, launched by torchrun\); between hosts "
                 r"anychip uses MPI: launch with mpiexec and install anychip\[mpi\]")
    with pytest.raises(UnsupportedError, match=want):
        choose(anychip.device("cpu"), world(4, 2, "torchrun"))


def test_host_key_is_the_host_id_when_set(env: pytest.MonkeyPatch) -> None:
    import socket
    assert host_key() == f"host:{socket.gethostname()}"
    env.setenv("ANYCHIP_HOSTID", " rack3-node7 ")
    assert host_key() == "id:rack3-node7"


@pytest.mark.slow
def test_mpi_transport_refuses_a_job_mpi_did_not_start(tmp_path) -> None:
    pytest.importorskip("mpi4py")
    prog = ("import anychip.collectives as c\n"
            "try:\n    c.init('cpu')\nexcept anychip.InvalidArgumentError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_", "ANYCHIP_"))}
    env.update(ANYCHIP_RANK="0", ANYCHIP_WORLD_SIZE="2", ANYCHIP_HOST_TRANSPORT="mpi")
    out = subprocess.run([sys.executable, "-c", "import anychip\n" + prog], capture_output=True, text=True, env=env,
                         timeout=60)
    want = ("ERR MPI sees 1 rank(s) but the launcher (anychip) says 2: the MPI transport needs the job started by "
            "mpiexec (or set ANYCHIP_HOST_TRANSPORT=shm on one host)")
    assert out.stdout.strip() == want, out.stderr


# -- element types: the engine's rules, reproduced around MPI ----------------------------------

def test_accumulation_types() -> None:
    assert acc_type("float16", "sum") is np.float32 and acc_type("bfloat16", "max") is np.float32
    assert acc_type("int8", "avg") is np.int64 and acc_type("uint8", "avg") is np.int64
    assert acc_type("int32", "avg") is np.int64 and acc_type("int32", "sum") is np.int32
    assert acc_type("int64", "avg") is np.int64 and acc_type("float64", "avg") is np.float64


def test_bfloat16_rounds_to_nearest_even_and_keeps_nan() -> None:
    # float32 bit patterns: exact, just below / at / above the halfway point, ties to even, NaN, inf
    bits = np.array([0x3F800000, 0x3F807FFF, 0x3F808000, 0x3F808001, 0x3F818000, 0x7FC00001, 0xFF800000,
                     0x7F7FFFFF], dtype=np.uint32)
    out = np.zeros(bits.size * 2, dtype=np.uint8)
    from_acc(bits.view(np.float32), "bfloat16", out)
    assert out.view(np.uint16).tolist() == [0x3F80, 0x3F80, 0x3F80, 0x3F81, 0x3F82, 0x7FC0, 0xFF80, 0x7F80]
    back, fresh = to_acc(out, "bfloat16", "sum")
    assert fresh and back.view(np.uint32).tolist()[:5] == [0x3F800000, 0x3F800000, 0x3F800000, 0x3F810000,
                                                            0x3F820000]


def test_float16_widens_and_rounds_once() -> None:
    raw = np.array([1.0, 2049.0, -0.5], dtype=np.float16).view(np.uint8)   # 2049 is not a float16: 2048
    acc, fresh = to_acc(raw, "float16", "sum")
    assert fresh and acc.dtype == np.float32 and acc.tolist() == [1.0, 2048.0, -0.5]
    acc += np.float32(1.0)        # 2049 in float32, rounded once to float16: ties to even, 2048
    out = np.zeros(6, dtype=np.uint8)
    from_acc(acc, "float16", out)
    assert out.view(np.float16).tolist() == [2.0, 2048.0, 0.5]


def test_avg_truncates_integers_toward_zero_and_divides_floats_once() -> None:
    ints = np.array([7, -7, 8, -8, -1, np.iinfo(np.int64).min], dtype=np.int64)
    finish_avg(ints, "avg", 4)
    assert ints.tolist() == [1, -1, 2, -2, 0, np.iinfo(np.int64).min // 4]
    floats = np.array([1.0, -3.0], dtype=np.float32)
    finish_avg(floats, "avg", 3)
    assert floats.tolist() == [np.float32(1.0) / np.float32(3.0), -1.0]
    same = np.array([5], dtype=np.int64)
    finish_avg(same, "sum", 4)
    assert same.tolist() == [5]


def test_to_acc_is_a_view_when_no_widening_is_needed() -> None:
    raw = np.arange(16, dtype=np.uint8)
    acc, fresh = to_acc(raw, "int32", "sum")
    assert not fresh and acc.dtype == np.int32 and np.shares_memory(acc, raw)
    acc, fresh = to_acc(raw, "int8", "avg")
    assert fresh and acc.dtype == np.int64 and acc.tolist() == list(range(16))
