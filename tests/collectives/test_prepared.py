"""Prepared collectives: ``op = comm.prepare(kind, buf, ...)`` checked once, ``op.launch()`` again and
again (MPI's ``MPI_Allreduce_init`` / ``MPI_Start``).

One-rank communicators check the refusals (exact messages), the freed-buffer and destroyed-
communicator cases, the reused Work and its events; one job per transport (2 ranks: the
shared-memory engine on cpu, the simulated chips' HCCL, MPI) launches every kind hundreds of
times and compares each result with NumPy's, exactly.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import CHILD_SECONDS, solo

import anychip
from anychip.collectives import PreparedOp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refused(fn, message: str) -> None:
    with pytest.raises(anychip.InvalidArgumentError) as e:
        fn()
    assert str(e.value) == message


def test_bad_arguments_are_refused_at_prepare(comm) -> None:
    dev = comm.device
    b = dev.alloc(16)
    _refused(lambda: comm.prepare("allreduce", b),
             "prepare: kind 'allreduce' is not a collective; use one of all_reduce, broadcast, reduce, all_gather, "
             "reduce_scatter, all_to_all, send, recv, barrier")
    _refused(lambda: comm.prepare("all_gather", b, op="max"), "prepare: all_gather takes no reduce op (got op='max')")
    _refused(lambda: comm.prepare("all_gather", b), "prepare: all_gather needs recv= (its receive buffer)")
    _refused(lambda: comm.prepare("all_reduce", b, root=0),
             "prepare: all_reduce takes no root= (broadcast and reduce do)")
    _refused(lambda: comm.prepare("broadcast", b, peer=0), "prepare: broadcast takes no peer= (send and recv do)")
    _refused(lambda: comm.prepare("send", b), "prepare: send needs peer= (the rank it exchanges with)")
    _refused(lambda: comm.prepare("recv", b, peer=0, recv=b), "prepare: recv receives into buf; it takes no recv=")
    _refused(lambda: comm.prepare("barrier", b), "prepare: barrier takes no buffers (pass None)")
    # the op's own checks, once, with its own messages
    _refused(lambda: comm.prepare("all_reduce", b, 5),
             "all_reduce: send holds 16 bytes but count=5 float32 needs 20 bytes; it fits count <= 4")
    _refused(lambda: comm.prepare("all_reduce", b, dtype="complex64"),
             "all_reduce: dtype 'complex64' is not supported; use one of int8, uint8, int32, int64, float16, "
             "bfloat16, float32, float64 (by name or as a NumPy dtype)")
    _refused(lambda: comm.prepare("reduce", b, op="mean"),
             "reduce: reduce op 'mean' is not supported; use one of sum, prod, min, max, avg")
    _refused(lambda: comm.prepare("broadcast", b, root=1),
             "broadcast: root=1 is out of range; the group has ranks 0..0")
    _refused(lambda: comm.prepare("all_reduce", np.zeros(4, np.float32)),
             "all_reduce: send must be an anychip.Buffer on cpu:0, got ndarray")


def test_a_prepared_op_whose_buffer_was_freed_is_refused(comm) -> None:
    dev = comm.device
    x = dev.alloc(16).copy_from(np.arange(4, dtype=np.float32))
    y = dev.alloc(16)
    op = comm.prepare("all_reduce", x, recv=y)
    op.launch().wait()
    y.free()
    _refused(op.launch, "all_reduce: the prepared op's recv buffer was freed; prepare the op again with live buffers")
    v = dev.alloc(64)
    view_op = comm.prepare("all_reduce", v.view(16, 16))
    v.free()                                   # the viewed buffer
    _refused(view_op.launch,
             "all_reduce: the prepared op's send buffer was freed; prepare the op again with live buffers")
    _refused(lambda: comm.prepare("all_reduce", y), "all_reduce: send was freed")


def test_a_prepared_op_of_a_destroyed_communicator_is_refused() -> None:
    c = solo("cpu:0")
    op = c.prepare("all_reduce", c.device.alloc(8))
    c.destroy()
    with pytest.raises(anychip.InvalidArgumentError, match=r"was destroyed$"):
        op.launch()


def test_reused_hundreds_of_times_with_one_work(comm) -> None:
    dev = comm.device
    x = dev.alloc(4 * 8)
    y = dev.alloc(4 * 8)
    op = comm.prepare("all_reduce", x, recv=y, dtype="int32", op="max")
    assert isinstance(op, PreparedOp) and "all_reduce(count=8, int32, op=max" in repr(op)
    works = set()
    for i in range(500):
        want = (np.arange(8, dtype=np.int32) * 3 + i) % 11
        x.copy_from(want)
        w = op.launch()
        works.add(id(w))
        w.wait()
        assert np.array_equal(y.to_numpy(np.int32), want)
    assert len(works) == 1 and w.is_completed() and w.exception() is None


def test_launch_inside_a_group_joins_it(comm) -> None:
    dev = comm.device
    a = dev.alloc(16).copy_from(np.arange(4, dtype=np.float32))
    b = dev.alloc(16)
    send = comm.prepare("send", a, peer=0)
    recv = comm.prepare("recv", b, peer=0)
    for _ in range(50):
        b.memset(0)
        with comm.group():
            ws = send.launch()
            wr = recv.launch()
        ws.wait()
        wr.wait()
        assert np.array_equal(b.to_numpy(np.float32), np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("backend", ["ascend", "hygon"])
def test_native_work_and_event_are_reused(backend, monkeypatch) -> None:
    if not any(b.name == backend and b.available for b in anychip.backends()):
        pytest.skip(f"{backend} is unavailable")
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TRANSPORT", "native")
    c = solo(f"{backend}:0")
    try:
        t = c.transport
        dev = c.device
        x = dev.alloc(4 * 64).copy_from(np.arange(64, dtype=np.float32))
        y = dev.alloc(4 * 64)
        op = c.prepare("all_reduce", x, recv=y)
        stream = anychip.Stream(dev)
        first = op.launch(stream)
        event = first._event
        pool = len(t._events)
        for _ in range(300):
            w = op.launch(stream)
        assert w is first and w._event is event and len(t._events) == pool
        w.wait()
        assert w.is_completed() and not t._pending
        assert np.array_equal(y.to_numpy(np.float32), np.arange(64, dtype=np.float32))
        assert op.launch() is first                      # the default stream too
        first.wait()
    finally:
        c.destroy()


# -- two ranks, every kind, against NumPy ---------------------------------------------------

JOB = textwrap.dedent('''
    import numpy as np
    import anychip
    from anychip import collectives

    comm = collectives.init()
    dev, r, n = comm.device, comm.rank, comm.size
    LAUNCHES = 200
    checks = 0

    def data(rank, count, i, dtype):
        return ((np.arange(count) * 7 + rank * 5 + i) % 13 - 6).astype(dtype)

    def check(got, want, what):
        global checks
        checks += 1
        if not np.array_equal(got, want):
            raise SystemExit(f"rank {r}: {what}: got {got[:8]}, want {want[:8]}")

    for dtype, count in (("float32", 2), ("int64", 5), ("float64", 300), ("float16", 3), ("int32", 20000)):
        nbytes = np.dtype(dtype).itemsize * count
        x = dev.alloc(nbytes * n)
        y = dev.alloc(nbytes * n)
        ops = {
            "all_reduce": comm.prepare("all_reduce", x, count, dtype, "sum", recv=y),
            "max": comm.prepare("all_reduce", x, count, dtype, "max", recv=y),
            "reduce": comm.prepare("reduce", x, count, dtype, "min", recv=y, root=n - 1),
            "broadcast": comm.prepare("broadcast", x, count, dtype, recv=y, root=1),
            "all_gather": comm.prepare("all_gather", x, count, dtype, recv=y),
            "reduce_scatter": comm.prepare("reduce_scatter", x, count, dtype, "sum", recv=y),
            "all_to_all": comm.prepare("all_to_all", x, count, dtype, recv=y),
        }
        for i in range(LAUNCHES):
            for name, op in ops.items():
                mult = n if name in ("reduce_scatter", "all_to_all") else 1
                every = [np.concatenate([data(q, count, i + b, dtype) for b in range(mult)]) for q in range(n)]
                x.copy_from(every[r])
                y.memset(0)
                w = op.launch()
                w.wait()
                got = y.to_numpy(dtype)
                if name == "all_reduce":
                    check(got[:count], np.sum(every, axis=0, dtype=dtype), (name, dtype))
                elif name == "max":
                    check(got[:count], np.max(every, axis=0), (name, dtype))
                elif name == "reduce" and r == n - 1:
                    check(got[:count], np.min(every, axis=0), (name, dtype))
                elif name == "broadcast":
                    check(got[:count], every[1], (name, dtype))
                elif name == "all_gather":
                    check(got[:count * n], np.concatenate(every), (name, dtype))
                elif name == "reduce_scatter":
                    whole = np.sum(every, axis=0, dtype=dtype)
                    check(got[:count], whole[r * count:(r + 1) * count], (name, dtype))
                elif name == "all_to_all":
                    want = np.concatenate([every[q][r * count:(r + 1) * count] for q in range(n)])
                    check(got[:count * n], want, (name, dtype))
        # the op's own call, repeated, beside the prepared ops
        for i in range(LAUNCHES):
            x.copy_from(data(r, count, i, dtype))
            comm.all_reduce(x, y, count, dtype).wait()
            check(y.to_numpy(dtype)[:count], np.sum([data(q, count, i, dtype) for q in range(n)], axis=0,
                                                    dtype=dtype), ("call", dtype))
    barrier = comm.prepare("barrier", None)
    for _ in range(LAUNCHES):
        barrier.launch().wait()
    print(f"RESULT rank={r} checks={checks}", flush=True)
    comm.destroy()
''')


def _run(tmp_path, cmd: list[str], env: dict) -> None:
    prog = tmp_path / "job.py"
    prog.write_text(JOB)
    r = subprocess.run([*cmd, str(prog)], env=env, capture_output=True, text=True, timeout=CHILD_SECONDS * 4)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    results = re.findall(r"RESULT rank=\d+ checks=\d+", r.stdout)
    # 5 dtypes x 200 launches x (7 kinds, the reduce checked on its root only) + 200 calls
    per_rank = {0: 5 * 200 * 6 + 5 * 200, 1: 5 * 200 * 7 + 5 * 200}
    assert sorted(results) == sorted(f"RESULT rank={q} checks={c}" for q, c in per_rank.items()), r.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "ascend"])
def test_two_ranks_every_kind_exact(tmp_path, device) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYCHIP_")}
    env["ANYCHIP_SIMULATE"] = "always"
    _run(tmp_path, [sys.executable, "-m", "anychip", "launch", "-n", "2", "--device", device], env)


@pytest.mark.slow
def test_two_ranks_every_kind_exact_over_mpi(tmp_path) -> None:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        pytest.skip("no mpiexec beside this Python (pip install anychip[mpi])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANYCHIP_", "PMI_", "OMPI_"))}
    env.update(ANYCHIP_HOST_TRANSPORT="mpi", ANYCHIP_LAUNCH_DEVICE="cpu", PYTHONPATH=ROOT)
    _run(tmp_path, [mpiexec, "-n", "2", sys.executable], env)
