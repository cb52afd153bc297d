"""Collectives through the chips' own libraries (src/anychip/collectives/transports/native.py).

HCCL, BKCL and RCCL are the simulator's (csrc/sim/hccl.c, bkcl.c, rccl.c), called through
the chips' plugin.h adapters (csrc/adapters/*/plugin_*.c) exactly as the vendors' libraries would
be. Multi-rank tests start rank processes (tests/collectives/native_ccl_worker.py) that check their own results exactly.
NCCL through cupy.cuda.nccl needs a GPU; its GPU-free logic runs here against a
recording stand-in of ``cupy.cuda.nccl``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS, ccl_segments, leaked_segments

import anychip
from anychip import collectives
from anychip.chips.ascend import AscendPlugin
from anychip.collectives.communicator import OpSpec
from anychip.collectives.transports import native
from anychip.collectives.transports.shm import ShmTransport
from anychip.runtime._libs import find_library
from anychip.runtime.errors import (
    CollectiveError,
    CollectiveTimeout,
    DeviceError,
    InvalidArgumentError,
    UnsupportedError,
)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "native_ccl_worker.py")
SIMS = {"ascend": "HCCL", "kunlun": "BKCL", "hygon": "RCCL"}


def _available(backend: str) -> bool:
    return any(b.name == backend and b.available for b in anychip.backends())


SIM_PARAMS = [pytest.param(b, marks=pytest.mark.skipif(not _available(b), reason=f"{b} is unavailable"))
              for b in SIMS]


def _single(device: str, monkeypatch: pytest.MonkeyPatch, choice: str = "auto"):
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TRANSPORT", choice)
    world = collectives.World(0, 1, 0, 1, f"native-test-{os.getpid()}-{time.monotonic_ns()}", "none")
    return collectives.init(device, world=world)


# -- choosing the transport ----------------------------------------------------------------

@pytest.mark.parametrize("backend", SIM_PARAMS)
def test_init_picks_the_native_library_of_a_simulated_chip(backend, monkeypatch):
    comm = _single(f"{backend}:0", monkeypatch)
    try:
        assert isinstance(comm.transport, native.NativeTransport)
        assert comm.transport.name == f"native/{SIMS[backend]} (simulated)"
        assert comm.transport.mode == "sim"
        assert comm.transport.lib.path == anychip.device(f"{backend}:0").plugin.library_path
    finally:
        comm.destroy()


def test_host_override_and_errors(monkeypatch):
    if not _available("ascend"):
        pytest.skip("ascend is unavailable")
    comm = _single("ascend:0", monkeypatch, "host")
    assert isinstance(comm.transport, ShmTransport) and comm.transport.name == "shm/sim"
    comm.destroy()
    with pytest.raises(UnsupportedError, match=r"ANYCHIP_COLLECTIVE_TRANSPORT=native but cpu:0 has no native "
                                               r"collective library: cpu has no native collective library"):
        _single("cpu:0", monkeypatch, "native")
    with pytest.raises(InvalidArgumentError, match=r"ANYCHIP_COLLECTIVE_TRANSPORT='nccl' is not one of auto, "
                                                   r"native, host"):
        _single("cpu:0", monkeypatch, "nccl")
    comm = _single("cpu:0", monkeypatch, "auto")          # no native library: the engine
    assert isinstance(comm.transport, ShmTransport)
    comm.destroy()


def test_a_vendor_runtime_whose_collective_library_does_not_load_is_reported(tmp_path, monkeypatch):
    """The adapter binds the runtime and its collective library together: a libhccl.so beside
    CANN's runtime that is not a loadable library is reported, not skipped (the runtime here is a
    copy of the simulator, which has the same symbols)."""
    lib64 = tmp_path / "Ascend" / "lib64"
    lib64.mkdir(parents=True)
    shutil.copy(find_library("libascend_sim"), lib64 / "libascendcl.so")
    (lib64 / "libhccl.so").write_text("not a library")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "Ascend"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    monkeypatch.setenv("ANYCHIP_SIMULATE", "never")
    ok, why = AscendPlugin().available()
    assert not ok
    assert why.startswith(f"{lib64}/libascendcl.so was found but does not work ({lib64}/libhccl.so: "), why


def test_what_each_library_takes_natively():
    """What the adapters' tables (plugin.h's ccl_dtype_mask / ccl_redop_mask, ccl_op_dtype_masks
    and entries) offer: the native transport sends the rest to the engine."""
    def spec(kind, dtype="float32", op="sum"):
        return OpSpec(kind, None, None, 4, dtype, op, -1)
    for backend in SIMS:
        if not _available(backend):
            pytest.skip(f"{backend} is unavailable")
    h, b, r = (anychip.device(f"{backend}:0").plugin.native_ccl() for backend in SIMS)
    assert (h.api, b.api, r.api) == ("HCCL", "BKCL", "RCCL")
    assert not h.supports(spec("all_reduce", op="avg"))             # HCCL has no average
    assert h.supports(spec("all_reduce", "int8", "prod")) and h.supports(spec("all_reduce", "bfloat16", "sum"))
    for kind in ("all_reduce", "reduce", "reduce_scatter"):                # refused on 910B / 910_93
        assert not h.supports(spec(kind, "bfloat16", "prod")), kind
    assert h.refused == {("prod", "bfloat16"), *(("avg", d) for d in h.dtypes)}
    assert b.refused == r.refused == frozenset()                    # minor 2, no per-op table: the masks alone
    assert not b.supports(spec("reduce_scatter", "int8"))           # BKCL has no int8
    assert b.supports(spec("all_gather", "int8"))                   # movement goes as bytes
    assert not b.supports(spec("barrier")) and not r.supports(spec("barrier"))
    assert r.supports(spec("reduce", "bfloat16", "avg"))


# -- one rank, in process ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", SIM_PARAMS)
def test_one_rank_every_op_and_the_engine_for_what_the_library_lacks(backend, monkeypatch):
    comm = _single(f"{backend}:0", monkeypatch)
    dev = comm.device
    try:
        x = dev.alloc(4 * 1000).copy_from(np.arange(1000, dtype=np.float32))
        y = dev.alloc(4 * 1000)
        for kind in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"):
            y.memset(0)
            w = getattr(comm, kind)(x, y, dtype="float32")
            w.wait()
            assert w.is_completed() and w.exception() is None
            assert np.array_equal(y.to_numpy(np.float32), np.arange(1000, dtype=np.float32)), kind
        # avg (not in HCCL / BKCL: the engine on the same stream) and int8 (not in BKCL)
        z = dev.alloc(8).copy_from(np.array([-3, 5, 7, 1, 0, 2, 9, 4], dtype=np.int8))
        comm.all_reduce(z, dtype="int8", op="avg").wait()
        assert z.to_numpy(np.int8).tolist() == [-3, 5, 7, 1, 0, 2, 9, 4]
        comm.barrier().wait()
        with comm.group():
            a = comm.send(x, 0, count=10)
            b = comm.recv(y, 0, count=10)
        a.wait()
        b.wait()
        assert np.array_equal(y.to_numpy(np.float32)[:10], np.arange(10, dtype=np.float32))
    finally:
        comm.destroy()
    with pytest.raises(InvalidArgumentError, match="was destroyed"):
        comm.all_reduce(x)


@pytest.mark.parametrize("backend", SIM_PARAMS)
def test_repeated_ops_take_the_prepared_path_and_reuse_their_events(backend, monkeypatch):
    comm = _single(f"{backend}:0", monkeypatch)
    dev, t = comm.device, comm.transport
    try:
        x = dev.alloc(4 * 64).copy_from(np.arange(64, dtype=np.float32))
        y = dev.alloc(4 * 64)
        calls = []
        submit = t.submit
        monkeypatch.setattr(t, "submit", lambda *a: calls.append(a) or submit(*a))
        works = [comm.all_reduce(x, y) for _ in range(200)]      # every Work kept: 200 events
        for _ in range(300):
            last = comm.all_reduce(x, y)                           # each dropped before it settles
        last.wait()
        for w in works:
            w.wait()
        assert calls == []                                         # all through submit_prepared
        assert np.array_equal(y.to_numpy(np.float32), np.arange(64, dtype=np.float32))
        assert 0 < len(t._events) <= 64
        # the same call after the buffer was freed is refused, not served from the cache
        y.free()
        with pytest.raises(InvalidArgumentError, match="freed"):
            comm.all_reduce(x, y)
        # a library error on the prepared path raises as on the plain one
        z = dev.alloc(4 * 64)
        comm.all_reduce(x, z).wait()
        monkeypatch.setattr(t.lib, "error", lambda rc, what: InvalidArgumentError(f"{what}: {rc}"))
        entry = next(p for k, p in comm._prepared.items() if k[2] == id(z))
        entry._native = (lambda s: 5, "all_reduce", "ar")
        with pytest.raises(InvalidArgumentError, match="ar: 5"):
            comm.all_reduce(x, z)
    finally:
        comm.destroy()


@pytest.mark.parametrize("backend", SIM_PARAMS)
def test_fresh_views_of_one_range_reuse_the_prepared_op(backend, monkeypatch):
    # a framework's tensor that starts inside its storage comes as a new view at every call:
    # the cache knows it by the viewed buffer and the range, and still misses once that buffer
    # is freed or dropped (its id and memory then serve another buffer)
    comm = _single(f"{backend}:0", monkeypatch)
    dev, t = comm.device, comm.transport
    checks, prepares = [], []
    check, prepare = comm._check, t.prepare
    monkeypatch.setattr(comm, "_check", lambda *a: checks.append(a[0]) or check(*a))
    monkeypatch.setattr(t, "prepare", lambda specs: prepares.append(len(specs)) or prepare(specs))
    try:
        base = dev.alloc(4 * 256).copy_from(np.arange(256, dtype=np.float32))
        out = dev.alloc(4 * 256).memset(0)
        for _ in range(50):
            comm.all_reduce(base.view(4 * 16, 4 * 64), out.view(4 * 32, 4 * 64)).wait()
        assert (checks, prepares) == (["all_reduce"], [1])
        got = out.to_numpy(np.float32)
        assert np.array_equal(got[32:96], np.arange(16, 80, dtype=np.float32))
        assert not got[:32].any() and not got[96:].any()
        for _ in range(20):                          # in place, another range: one more entry
            comm.all_reduce(out.view(0, 4 * 8)).wait()
        assert (checks, prepares) == (["all_reduce"] * 2, [1, 1])
        for _ in range(10):                          # a group's sends and receives on fresh views
            with comm.group():
                a = comm.send(base.view(0, 4 * 8), 0, count=8)
                b = comm.recv(out.view(4 * 200, 4 * 8), 0, count=8)
            a.wait()
            b.wait()
        assert checks.count("send") == checks.count("recv") == 1
        assert prepares == [1, 1, 2]
        assert np.array_equal(out.to_numpy(np.float32)[200:208], np.arange(8, dtype=np.float32))
        # freed under a view kept from before: refused, not served from the cache
        kept = base.view(4 * 16, 4 * 64)
        base.free()
        with pytest.raises(InvalidArgumentError, match="send was freed"):
            comm.all_reduce(kept, out.view(4 * 32, 4 * 64))
        # dropped, and a new buffer in its place: checked and prepared anew, the new values
        del base, kept
        base = dev.alloc(4 * 256).copy_from(np.full(256, 7, dtype=np.float32))
        comm.all_reduce(base.view(4 * 16, 4 * 64), out.view(4 * 32, 4 * 64)).wait()
        assert checks.count("all_reduce") == 4 and prepares == [1, 1, 2, 1]
        assert np.array_equal(out.to_numpy(np.float32)[32:96], np.full(64, 7, dtype=np.float32))
    finally:
        comm.destroy()


@pytest.mark.parametrize("backend", SIM_PARAMS)
def test_library_result_codes_for_bad_arguments(backend, monkeypatch):
    comm = _single(f"{backend}:0", monkeypatch)
    t = comm.transport
    lib, ffi = t.lib, t.lib.ffi
    plugin = comm.device.plugin
    raw = plugin._malloc(0, 64)                           # one 64-byte allocation, not the caching allocator's
    p = ffi.cast("void *", raw)
    null = ffi.cast("void *", 0)
    names = {"HCCL": ("HCCL_E_PARA", "HCCL_E_PTR"), "BKCL": ("BKCL_INVALID_ARGUMENT",) * 2,
             "RCCL": ("ncclInvalidArgument",) * 2}[lib.api]
    # an unknown data type: the adapter refuses it with the library's bad-argument code
    bad_type = names[0]
    stream = plugin._stream_create(0) if lib.api == "HCCL" else None
    try:
        comm.device.plugin._use(0)
        if stream is not None:
            # HCCL has no default stream: NULL is HCCL_E_PTR (CANN's HcomCheckOpParam)
            code = lib.op(t._comm, "all_reduce", p, p, 4, lib.dtypes["float32"], 0, 0, null)
            assert lib.code_name(code) == "HCCL_E_PTR"
            assert "stream is NULL" in lib.detail()
        on = lib.stream_handle(plugin, stream) if stream is not None else null
        code = lib.op(t._comm, "all_reduce", p, p, 4, 99, 0, 0, on)
        assert lib.code_name(code) == bad_type
        with pytest.raises(InvalidArgumentError, match=rf"all_reduce failed: {lib.api} returned {bad_type}: "
                                                       r".*(data type|dtype)"):
            lib.check(code, "all_reduce")
        code = lib.op(t._comm, "all_reduce", null, p, 4, lib.dtypes["float32"], 0, 0, on)
        assert lib.code_name(code) == names[1]
        assert "send buffer is NULL" in lib.detail()
        code = lib.op(t._comm, "all_reduce", p, p, 17, lib.dtypes["float32"], 0, 0, on)   # 68 > 64 bytes
        assert lib.code_name(code) == names[0]
        detail = lib.detail()                      # (read once: the adapter's last error is taken)
        assert "needs 68 bytes" in detail and "its allocation ends 64 bytes after it" in detail
        code = lib.op(t._comm, "broadcast", p, p, 4, lib.byte, 0, 1, on)                  # root 1 of 1
        assert lib.code_name(code) == names[0]
        assert "root 1 is outside 0..0" in lib.detail()
        host = np.zeros(16, dtype=np.float32)
        code = lib.op(t._comm, "all_reduce", ffi.from_buffer(host), p, 4, lib.dtypes["float32"], 0, 0, on)
        assert lib.code_name(code) == names[0]
        assert "is not device memory of this process" in lib.detail()
        assert lib.async_error(t._comm) == 0
    finally:
        if stream is not None:
            plugin._stream_destroy(0, stream)
        plugin._free(0, raw)
        comm.destroy()
    # a later failure of the device API on this thread carries its own detail, not a message of the
    # destroyed communicator (the Hygon adapter kept the last communicator it was called with)
    h = plugin._malloc(0, 4096)
    with pytest.raises(DeviceError, match="not at its start"):
        plugin._free(0, h + 512)
    plugin._free(0, h)


# -- many ranks -----------------------------------------------------------------------------------

def _launch(n: int, backend: str, *args: str, env: dict | None = None) -> str:
    cmd = [sys.executable, "-m", "anychip.cli", "launch", "-n", str(n), "--device", backend, WORKER, *args]
    e = {**os.environ, "ANYCHIP_COLLECTIVE_TRANSPORT": "native", **(env or {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_SECONDS, env=e)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.mark.parametrize("backend", SIM_PARAMS)
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.slow
def test_every_op_dtype_and_reduce_op_through_the_native_library(backend, nranks):
    big = "1048579" if nranks == 2 else "0"             # 2^20 + 3: the zero-copy path
    out = _launch(nranks, backend, "matrix", "0,1,7,1000", big)
    want = "612" if big != "0" else "576"
    for r in range(nranks):
        assert f"[{r}] PASS {want} cases via native/{SIMS[backend]} (simulated)" in out, out


def _spawn(n: int, suite: str, backend: str, env: dict, *args: str) -> list[tuple[int, str, str]]:
    job = f"native-{os.getpid()}-{time.monotonic_ns()}"
    procs = []
    for r in range(n):
        e = {**os.environ, **env, "ANYCHIP_RANK": str(r), "ANYCHIP_WORLD_SIZE": str(n), "ANYCHIP_JOB_ID": job,
             "ANYCHIP_LAUNCH_DEVICE": backend, "ANYCHIP_COLLECTIVE_TRANSPORT": "native"}
        procs.append(subprocess.Popen([sys.executable, WORKER, suite, *args], env=e, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=CHILD_SECONDS) for p in procs[:-1]]
    results.append(procs[-1].communicate("", timeout=CHILD_SECONDS))
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, results, strict=True)]


def _result(out: str) -> tuple[str, float, str]:
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    kind, secs, msg = line[len("RESULT "):].split("|", 2)
    return kind, float(secs), msg


@pytest.mark.parametrize("backend", SIM_PARAMS)
@pytest.mark.slow
def test_a_peer_that_never_arrives_is_a_timeout_on_the_others(backend):
    results = _spawn(3, "timeout", backend, {}, "0.5")
    for rc, out, err in results[:2]:
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert kind == "CollectiveTimeout", msg
        assert 0.4 < secs < 10
        assert msg.startswith("all_reduce (op #1, group world.split1(color=0)) timed out after 0.5 s on rank "), msg
        assert "waiting for rank 2" in msg, msg
    assert results[2][0] == 0


@pytest.mark.parametrize("backend, transport, name", [
    *[pytest.param(b, "native", f"native/{SIMS[b]} (simulated)", marks=p.marks)
      for b, p in zip(SIMS, SIM_PARAMS, strict=True)],
    ("ascend", "host", "shm/sim"), ("cpu", "auto", "shm/host")])
@pytest.mark.slow
def test_each_communicator_times_out_at_its_own_timeout(backend, transport, name):
    """Two communicators of one process, made with timeouts of 60 s and 0.5 s: an op the peer
    skips on the short one fails after 0.5 s with the library's or the engine's detail, which
    names that peer (the simulator's HCCL / BKCL / RCCL take it through plugin.h's
    comm_init_rank_timeout); the long one still works; the environment is untouched. Before,
    the timeout was the process's (ANYCHIP_COLLECTIVE_TIMEOUT, 300 s)."""
    job = f"two-{os.getpid()}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_COLLECTIVE_TIMEOUT"}
    procs = [subprocess.Popen([sys.executable, WORKER, "two", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "ANYCHIP_RANK": str(r), "ANYCHIP_WORLD_SIZE": "2",
                                              "ANYCHIP_JOB_ID": job, "ANYCHIP_LAUNCH_DEVICE": backend,
                                              "ANYCHIP_COLLECTIVE_TRANSPORT": transport}) for r in range(2)]
    results = [p.communicate(timeout=CHILD_SECONDS) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, out + err
        assert f"ENV unset {name}\n" in out, out
        assert "LONG [3.0, 3.0, 3.0, 3.0]\n" in out, out
    kind, secs, msg = _result(results[0][0])
    assert kind == "CollectiveTimeout", msg
    assert 0.4 < secs < 10, secs
    assert re.match(r"all_reduce \(op #\d+, group world\) timed out after 0\.5 s on rank 0: waiting for rank 1",
                    msg), msg


@pytest.mark.parametrize("backend", SIM_PARAMS)
@pytest.mark.slow
def test_an_op_that_never_runs_times_out_on_every_rank(backend):
    """Every rank's all_reduce waits behind a held stream, so the library never sees it (nor
    times it out): the watchdog fails each rank's Work after ANYCHIP_COLLECTIVE_TIMEOUT (plus
    its second of grace), naming the op and the rank, and aborts the communicator. Before,
    every rank waited for ever."""
    results = _spawn(3, "stuck", backend, {}, "0.5")
    for r, (rc, out, err) in enumerate(results):
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert (kind, msg) == ("CollectiveTimeout", f"all_reduce (group world.split1(color=0)) did not complete within "
                               f"0.5 s on rank {r} (ANYCHIP_COLLECTIVE_TIMEOUT=0.5); the communicator was aborted")
        assert 1.4 < secs < 10, secs
        assert (f"LATER CollectiveError|communicator world.split1(color=0) was aborted: {msg}\n") in out, out


@pytest.mark.parametrize("backend", SIM_PARAMS)
@pytest.mark.slow
def test_a_killed_peer_fails_the_others_within_seconds(backend):
    before = ccl_segments()
    results = _spawn(3, "kill", backend, {"ANYCHIP_COLLECTIVE_TIMEOUT": "60"})
    assert results[1][0] == -9
    for r in (0, 2):
        rc, out, err = results[r]
        assert rc == 0, err
        kind, secs, msg = _result(out)
        assert kind == "CollectiveError", msg
        assert secs < 10
        assert msg.startswith("all_reduce (op #1, group world) failed: missing rank 1 (pid "), msg
        assert msg.endswith(" died)"), msg
    left = leaked_segments(before)
    assert not left, f"segments left in /dev/shm: {sorted(left)}"


# -- NCCL through cupy.cuda.nccl, with a recording stand-in -------------------------------------

class FakeNcclComm:
    def __init__(self, module, ndev, uid, rank):
        self.m, self.calls = module, module.calls
        self.calls.append(("init", ndev, uid, rank))
        self.failure = None

    def __getattr__(self, name):
        if name in ("allReduce", "reduce", "broadcast", "reduceScatter", "allGather", "send", "recv"):
            return lambda *args: self.calls.append((name, *args))
        raise AttributeError(name)

    def check_async_error(self):
        if self.failure:
            raise RuntimeError(self.failure)

    def abort(self):
        self.calls.append(("abort",))

    def destroy(self):
        self.calls.append(("destroy",))


class FakeNccl:
    """What NcclTransport uses of cupy.cuda.nccl (names and argument orders of CuPy 14)."""
    NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_INT64 = 0, 1, 2, 4
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3

    def __init__(self, uid):
        self.uid, self.calls, self.comms = uid, [], []

    def get_unique_id(self):
        return self.uid

    def NcclCommunicator(self, ndev, uid, rank):  # noqa: N802 - CuPy's name
        c = FakeNcclComm(self, ndev, uid, rank)
        self.comms.append(c)
        return c

    def groupStart(self):  # noqa: N802
        self.calls.append(("groupStart",))

    def groupEnd(self):  # noqa: N802
        self.calls.append(("groupEnd",))


class FakeBoot:
    def __init__(self, rank, size, root_value):
        self.rank, self.size, self.root_value = rank, size, root_value
        self.submitted, self.closed = [], False

    def exchange(self, obj):
        assert obj is None or self.rank == 0
        return [self.root_value if self.rank else obj] + [None] * (self.size - 1)

    def submit(self, specs, stream):
        self.submitted.append(specs)
        w = collectives.Work("engine")
        w._finish(None)
        return w

    def abort(self, reason):
        pass

    def close(self):
        self.closed = True


@pytest.mark.parametrize("uid", [bytes(range(128)), tuple(range(128))], ids=["bytes (CuPy 14)", "tuple (CuPy 13)"])
def test_nccl_transport_logic_with_a_stand_in(uid):
    dev = anychip.device("cpu:0")
    nccl = FakeNccl(uid)
    # rank 1 of 2: the id comes from rank 0 through the bootstrap, unchanged
    boot = FakeBoot(1, 2, uid)
    t = native.NcclTransport(dev, 1, 2, "", "world", nccl=nccl, boot=boot)
    assert nccl.calls == [("init", 2, uid, 1)]
    nccl.calls.clear()
    a, b = dev.alloc(64), dev.alloc(128)
    s = dev.current_stream()
    sptr = int(getattr(s._live(), "ptr", 0) or 0)
    t.submit([OpSpec("all_reduce", a, a, 16, "float32", "avg", -1)], s).wait()   # no NCCL_AVG: the engine
    assert nccl.calls == [] and len(boot.submitted) == 1
    t.submit([OpSpec("reduce", a, b, 8, "int64", "max", 0)], s).wait()
    t.submit([OpSpec("broadcast", a, a, 3, "float16", None, 1)], s).wait()       # 6 bytes
    t.submit([OpSpec("all_to_all", a, b, 4, "int32", None, -1)], s).wait()      # 16 bytes per peer
    t.submit([OpSpec("barrier", None, None, 0, "uint8", None, -1)], s).wait()
    scratch = t._scratch.ptr
    assert nccl.calls == [
        ("reduce", a.ptr, b.ptr, 8, 4, 2, 0, sptr),
        ("broadcast", a.ptr, a.ptr, 6, 1, 1, sptr),
        ("groupStart",),
        ("send", a.ptr, 16, 1, 0, sptr), ("recv", b.ptr, 16, 1, 0, sptr),
        ("send", a.ptr + 16, 16, 1, 1, sptr), ("recv", b.ptr + 16, 16, 1, 1, sptr),
        ("groupEnd",),
        ("allReduce", scratch, scratch, 1, 7, 0, sptr)]
    nccl.comms[0].failure = "unhandled cuda error"
    with pytest.raises(CollectiveError, match=r"^all_gather \(group world\) failed: NCCL: unhandled cuda error$"):
        t.submit([OpSpec("all_gather", a, b, 2, "float64", None, -1)], s).wait()
    t.close()
    assert nccl.calls[-1] == ("destroy",) and boot.closed
    with pytest.raises(InvalidArgumentError, match="was destroyed"):
        t.submit([OpSpec("barrier", None, None, 0, "uint8", None, -1)], s)


def test_nccl_transport_on_a_gpu():
    if not _available("cuda"):
        pytest.skip("no CUDA GPU here: NCCL through cupy.cuda.nccl runs only on a GPU machine (ci/gpu-check)")
    dev = anychip.device("cuda:0")
    if dev.plugin.native_ccl() is None:
        pytest.skip("cupy.cuda.nccl is not available")
    world = collectives.World(0, 1, 0, 1, f"nccl-test-{os.getpid()}", "none")
    comm = collectives.init(dev, world=world)
    assert isinstance(comm.transport, native.NcclTransport)
    x = dev.alloc(4 * 100).copy_from(np.arange(100, dtype=np.float32))
    comm.all_reduce(x).wait()
    assert np.array_equal(x.to_numpy(np.float32), np.arange(100, dtype=np.float32))
    comm.destroy()


def test_timeout_class_from_the_library_message():
    class Lib:
        api, timeout_codes = "RCCL", frozenset()

        def async_error(self, comm):
            return 6

        def comm_detail(self, comm):
            return "all_reduce (op #3, nccl communicator nccl-1-2-3) timed out after 0.5 s on rank 0"

        def code_name(self, code):
            return "ncclRemoteError"

    t = native.NativeTransport.__new__(native.NativeTransport)
    t.lib, t._comm, t.label = Lib(), object(), "world.split1(color=0)"
    exc = t._async_failure("all_reduce")
    assert isinstance(exc, CollectiveTimeout)
    assert str(exc) == "all_reduce (op #3, group world.split1(color=0)) timed out after 0.5 s on rank 0"


def test_nccl_transport_abort_with_a_stand_in():
    dev = anychip.device("cpu:0")
    nccl = FakeNccl(bytes(128))
    t = native.NcclTransport(dev, 0, 2, "", "world", nccl=nccl, boot=FakeBoot(0, 2, None))
    a = dev.alloc(64)
    s = dev.current_stream()
    done = t.submit([OpSpec("all_reduce", a, a, 16, "float32", "sum", -1)], s)     # complete before the abort
    t.abort("watchdog: no progress")
    assert nccl.calls[-1] == ("abort",)
    assert done.wait() is True                   # an op complete before the abort keeps its outcome
    with pytest.raises(CollectiveError, match=r"^communicator world was aborted: watchdog: no progress$"):
        t.submit([OpSpec("all_reduce", a, a, 16, "float32", "sum", -1)], s)
    t.close()
    assert nccl.calls[-1] == ("abort",)          # an aborted communicator is not destroyed again


def test_a_library_is_called_as_its_calls_table_says():
    from anychip.runtime.native_ccl import NativeLibrary

    seen = []

    class Lib:
        def f(self, *args):
            seen.append(args)
            return 7

    class Table(NativeLibrary):
        calls = {"all_reduce": ("f", "comm send recv count dtype redop stream"),
                 "send": ("f", "send count dtype root comm stream")}

    lib = Table(None, Lib(), "", False)
    assert lib.kinds == frozenset({"all_reduce", "send"})
    assert lib.op("C", "all_reduce", "S", "R", 3, 4, 5, 0, "ST") == 7
    assert lib.bind("C", "send", "S", "R", 3, 4, 5, 2)("ST2") == 7
    assert seen == [("C", "S", "R", 3, 4, 5, "ST"), ("S", 3, 4, 2, "C", "ST2")]
    with pytest.raises(TypeError, match=r"Bad.calls\['all_reduce'\]: 'send recv stream count' must name arguments "
                                        r"of comm, count, dtype, recv, redop, root, send, stream and end with stream"):
        class Bad(NativeLibrary):
            calls = {"all_reduce": ("f", "send recv stream count")}


@pytest.mark.parametrize("backend, env", [*((b, None) for b in SIMS), ("ascend", "1")])
def test_a_communicators_init_waits_for_its_peers_at_most_its_own_timeout(monkeypatch, backend, env):
    """Rank 0 of 2 whose peer never joins: the simulated library's init gives up after the
    group's own timeout (1 s, through the adapter's comm_init_rank_timeout), or
    ANYCHIP_COLLECTIVE_TIMEOUT when set, naming the missing rank and which timeout applied.
    Before, the init waited the default (300 s) whatever the group's timeout."""
    if not _available(backend):
        pytest.skip(f"{backend} is unavailable")
    if env is None:
        monkeypatch.delenv("ANYCHIP_COLLECTIVE_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", env)
    dev = anychip.device(f"{backend}:0")
    start = time.monotonic()
    with pytest.raises(CollectiveError) as info:
        native.NativeTransport(dev, 0, 2, "", "world", boot=FakeBoot(0, 2, None), timeout=None if env else 1.0)
    took = time.monotonic() - start
    source = "the communicator's own timeout" if env is None else "ANYCHIP_COLLECTIVE_TIMEOUT=1"
    assert f"communicator of 2 ranks: ranks 1 did not join within 1 s ({source})" in str(info.value), info.value
    assert 1.0 <= took < 10, took


@pytest.mark.parametrize("own, env, source", [
    (None, "0.2", "ANYCHIP_COLLECTIVE_TIMEOUT=0.2"), (0.2, None, "the group's own timeout"),
    (5.0, "0.2", "ANYCHIP_COLLECTIVE_TIMEOUT=0.2, which overrides the group's own 5 s")])
def test_the_watchdog_fails_a_stuck_nccl_op_and_aborts_the_communicator(monkeypatch, own, env, source):
    """The CUDA path (NcclTransport, cupy.cuda.nccl) with the stand-in, its event on a simulated
    stream held so that the op never completes: the watchdog fails the Work after the timeout
    (ANYCHIP_COLLECTIVE_TIMEOUT, or the transport's own: NCCL takes none, the watchdog applies
    it) and its second of grace, naming the op and the rank, and calls ncclCommAbort. Before, the
    Work waited for ever (NCCL never times out)."""
    if not _available("ascend"):
        pytest.skip("ascend is unavailable")
    if env is None:
        monkeypatch.delenv("ANYCHIP_COLLECTIVE_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", env)
    dev = anychip.device("ascend:0")
    nccl = FakeNccl(bytes(128))
    t = native.NcclTransport(dev, 1, 2, "", "world", nccl=nccl, boot=FakeBoot(1, 2, bytes(128)),
                             timeout=own)
    a = dev.alloc(64)
    s = anychip.Stream(dev)
    dev.plugin.sim_hold_stream(dev.index, s._live())
    try:
        start = time.monotonic()
        work = t.submit([OpSpec("all_reduce", a, a, 16, "float32", "sum", -1)], s)
        with pytest.raises(CollectiveTimeout) as info:
            work.wait()
        took = time.monotonic() - start
    finally:
        dev.plugin.sim_release_stream(dev.index, s._live())     # (else the watchdog ends this process 10 s later)
    s.synchronize()
    # which timeout applied, and where it came from
    assert str(info.value) == ("all_reduce (group world) did not complete within 0.2 s on rank 1 "
                               f"({source}); the communicator was aborted")
    assert 1.2 <= took < 5, took
    assert nccl.calls[-1] == ("abort",)
    with pytest.raises(CollectiveError, match=r"^communicator world was aborted: all_reduce \(group world\) did not"):
        t.submit([OpSpec("all_reduce", a, a, 16, "float32", "sum", -1)], s)
    t.close()


@pytest.mark.slow
def test_the_watchdog_leaves_completed_ops_alone_while_works_are_waited_and_held(monkeypatch):
    """Stress: the watchdog looks every 10 ms while 600 ops are enqueued on two streams, half of
    their Works waited at once (the waiter and the watchdog settle side by side), half held
    unwaited past the deadline (complete, never settled): none fails, nothing is aborted."""
    if not _available("ascend"):
        pytest.skip("ascend is unavailable")
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "0.1")
    dev = anychip.device("ascend:0")
    nccl = FakeNccl(bytes(128))
    t = native.NcclTransport(dev, 0, 2, "", "world", nccl=nccl, boot=FakeBoot(0, 2, None))
    a = dev.alloc(64)
    streams = [dev.current_stream(), anychip.Stream(dev)]
    held = []
    deadline = time.monotonic() + 2.5
    n = 0
    while n < 600 or time.monotonic() < deadline:
        work = t.submit([OpSpec("all_reduce", a, a, 16, "float32", "sum", -1)], streams[n % 2])
        if n % 2:
            held.append(work)
        else:
            assert work.wait() is True
        n += 1
        if n % 50 == 0:
            time.sleep(0.02)
    assert all(w.wait() is True for w in held), [w.exception() for w in held if w.exception()]
    assert ("abort",) not in nccl.calls
    t.close()
