"""The device API's and the collectives' semantics, as CUDA and NCCL document them: the named
cases beyond ordering and values (see docs/conformance.md, "The named cases").

Device API (each rank on its own device):

* ``stream_query``: a stream is pending while its last item runs, and while kernels are queued;
* ``event_rerecord``: a re-recorded event is incomplete until its latest record completes;
* ``elapsed_time``: the time between the two events' latest records, at the host's clock rate;
* ``wait_binding``: a stream wait binds to the record current at the call, not a later one;
* ``device_synchronize``: waits for every stream of the device;
* ``mem_info``: free memory comes back after frees and does not drift with odd sizes;
* ``copy_peer``: a copy to another device is ordered after the stream's earlier work and copies
  exactly the bytes asked for.

Collectives: ``split`` (a sub-communicator's own size and ranks), ``group_collectives`` (several
collectives in one group each run), ``op_streams`` (each op follows its own stream), and the
fault case ``abort`` (the peers of an aborted communicator fail, naming the abort, in time).

Timing is only ever used one way: a verdict of "too early" is given only when the host saw the
event before the work it waits for could have finished (its least duration, :mod:`._busy`);
where the host was too slow to tell, the observation is repeated, never failed.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ._busy import Busy
from ._outcomes import Failure, Skip, _comm_with, _pattern, _same, names_rank

#: observations of a race the host must win to see a defect (never to pass a correct backend)
_TRIES = 8


# ---------------------------------------------------------------------------------------------
# device API
# ---------------------------------------------------------------------------------------------

def _poll_done(event: Any, limit: float = 30.0) -> float | None:
    """Query ``event`` until it completes; the host time just before the last query that saw it
    pending (the event completed after it), or None when the first query already saw it done."""
    before = None
    t_end = time.perf_counter() + limit
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        if event.query():
            return before
        before = t
    raise Failure("an event behind work that takes milliseconds", f"complete within {limit:g} s", "still pending")


def stream_query(dev: Any, busy: Busy) -> None:
    """CUDA: cudaStreamQuery returns cudaErrorNotReady while any operation on the stream is
    incomplete: the last one while it runs, and kernels as well as copies.

    The last item is a wait for an event of another stream held busy: once the work before it is
    done it runs, and it cannot finish before that event; the stream is pending until then (seen
    without timing: the query is True while the event is still pending afterwards)."""
    import anychip
    s, s2 = anychip.Stream(dev), anychip.Stream(dev)
    try:
        for attempt in range(4):
            busy.hold(s2, 0.05 * 2 ** attempt)
            other = s2.record_event()
            if other.query():                     # the backend ran the held work when it was queued
                break
            busy.hold(s, 0.005)
            before = s.record_event()
            s.wait_event(other)                   # the last item
            while not before.query():
                time.sleep(0.0002)
            q = s.query()
            other_pending = not other.query()
            s2.synchronize()
            s.synchronize()
            if q and other_pending:
                raise Failure("stream.query() once the work before its last item (a wait for an event of another "
                              "stream, still pending after the query) completed", False,
                              "True: the stream was reported complete while its last item ran")
            if other_pending:
                break
        _kernels_pending(dev, s)
    finally:
        s.synchronize()
        s2.synchronize()
        s.destroy()
        s2.destroy()


def _kernels_pending(dev: Any, s: Any) -> None:
    """Kernels alone on a stream, enough that they provably take 30 ms: the stream and an
    event after them are pending."""
    from ..runtime import kernels_of
    front = kernels_of(dev)
    if front is None or not front.supports("neg", "float32"):
        return
    n = 1 << 20
    x = dev.alloc(4 * n).memset(0)
    y = dev.alloc(4 * n)
    try:
        def run(k: int) -> float:
            t = time.perf_counter()
            for _ in range(k):
                front.unary("neg", (y, 0), "float32", (x, 0, (1,)), "float32", (n,), stream=s)
            s.synchronize()
            return (time.perf_counter() - t) / k
        per = min(run(2) for _ in range(2))
        k = max(4, min(20_000, int(4 * 0.03 / max(per, 1e-7)) + 1))
        least = k * per / 4
        t0 = time.perf_counter()
        for _ in range(k):
            front.unary("neg", (y, 0), "float32", (x, 0, (1,)), "float32", (n,), stream=s)
        q = s.query()
        mark = s.record_event()
        eq = mark.query()
        late = time.perf_counter() - t0
        s.synchronize()
        if late < least and (q or eq):
            raise Failure(f"stream.query() and event.query() {late * 1e3:.1f} ms after queueing {k} kernels that "
                          f"take at least {least * 1e3:.0f} ms (nothing else on the stream)", "False, False",
                          f"{q}, {eq}: queued kernels were not counted")
    finally:
        x.free()
        y.free()


def event_rerecord(dev: Any, busy: Busy) -> None:
    """CUDA: cudaEventQuery / cudaEventSynchronize refer to the most recent cudaEventRecord."""
    import anychip
    s = anychip.Stream(dev)
    try:
        ev = anychip.Event(dev).record(s)
        s.synchronize()
        if not ev.query():
            raise Failure("event.query() after its stream synchronized", True, False)
        buf = dev.alloc(4096).memset(1)
        t0, least = busy.hold(s)
        buf.memset(9, stream=s)
        ev.record(s)                               # the second record, behind held work
        q = ev.query()
        late = time.perf_counter() - t0
        if late < least and q:
            raise Failure(f"event.query() {late * 1e3:.1f} ms after re-recording it behind work of at least "
                          f"{least * 1e3:.0f} ms", False, "True: the first record's completion was reported")
        ev.synchronize()
        got = buf.to_numpy()
        _same("the memset before the second record, after event.synchronize()", got, np.full(4096, 9, np.uint8))
        if not ev.query():
            raise Failure("event.query() after event.synchronize()", True, False)
        buf.free()
    finally:
        s.synchronize()
        s.destroy()


def elapsed_time(dev: Any) -> None:
    """CUDA: cudaEventElapsedTime is the time between the two events' (latest) records, in ms.
    On an idle stream a record completes when it is made, so the host's clock brackets it:
    the start's re-record completes in [t0, t1], the end's in [t2, t3], and elapsed_ms lies in
    [t2 - t1, t3 - t0] (plus 2 % and 0.5 ms for two clocks)."""
    import anychip
    s = anychip.Stream(dev)
    gap, first_gap = 0.12, 0.15
    try:
        start, end = anychip.Event(dev), anychip.Event(dev)
        last = None
        for _ in range(4):
            start.record(s)                         # a first record, long before the measured one
            s.synchronize()
            time.sleep(first_gap)
            t0 = time.perf_counter()
            start.record(s)
            while not start.query():
                pass
            t1 = time.perf_counter()
            time.sleep(gap)
            t2 = time.perf_counter()
            end.record(s)
            while not end.query():
                pass
            t3 = time.perf_counter()
            ms = start.elapsed_ms(end)
            lo, hi = (t2 - t1) * 1e3, (t3 - t0) * 1e3
            if not lo / 1.02 - 0.5 <= ms <= hi * 1.02 + 0.5:
                raise Failure(f"elapsed_ms between a re-recorded start and an end {gap * 1e3:.0f} ms later on an idle "
                              f"stream (the first record of the start was {first_gap * 1e3:.0f} ms before; the host "
                              f"saw the records complete {lo:.1f} to {hi:.1f} ms apart)",
                              f"{lo:.1f} <= ms <= {hi:.1f}", f"{ms:.2f}")
            last = (lo, hi)
            if hi - lo < 0.05 * lo:                 # tight enough to tell a clock 10 % off
                return
        if last is None:
            raise Failure("elapsed_ms", "a measurement", "none")
    finally:
        s.synchronize()
        s.destroy()


def wait_binding(dev: Any, busy: Busy) -> None:
    """CUDA: cudaStreamWaitEvent waits for the work captured by the event's most recent record
    at the time of the call; a later record of the event does not change what it waits for.

    Stream 2, held busy briefly, waits for an event whose record is complete; the event is then
    re-recorded on stream 1 behind much longer held work, and stream 2 copies. Stream 2 must
    finish without the later record: seen done while that record is pending (tried three times,
    stream 1 held longer each time, before a stream 2 that finished after it is a failure; a
    backend that runs the held work when it is queued, as a Paddle plugin's synchronous
    ``device_memory_set`` does, has no pending record to tell by: stream 1 is idle at once)."""
    import anychip
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    a, b = dev.alloc(4096).memset(3), dev.alloc(4096).memset(0)
    try:
        ev = anychip.Event(dev)
        conclusive = 0
        for attempt in range(3):
            ev.record(s1)
            s1.synchronize()                      # the record the wait binds to: complete
            busy.hold(s2, 0.005)                  # stream 2 reaches its wait only after the re-record
            s2.wait_event(ev)
            busy.hold(s1, 0.05 * 2 ** attempt)
            if s1.query():                        # the backend ran the held work when it was queued
                s2.synchronize()                  # (a synchronous memset): no pending record to tell by
                break
            ev.record(s1)                         # a later record, behind held work
            conclusive += 1
            anychip.copy(b, a, stream=s2)
            done = s2.record_event()
            while not done.query():
                time.sleep(0.0002)
            later_pending = not ev.query()
            s1.synchronize()
            _same("the copy on stream 2", b.to_numpy(), np.full(4096, 3, np.uint8))
            if later_pending:
                return
        if not conclusive:
            raise Skip("held work ran when it was queued (stream 1 idle at once): a later record cannot be pending")
        raise Failure("stream 2 waiting for an event whose record was complete, the event then re-recorded on stream 1 "
                      "behind held work (3 tries, stream 1 held 0.05, 0.1, 0.2+ s)",
                      "stream 2 done while the later record was pending",
                      "stream 2 done only after it, every time: the wait bound to the later record")
    finally:
        s1.synchronize()
        s2.synchronize()
        s1.destroy()
        s2.destroy()
        a.free()
        b.free()


def device_synchronize(dev: Any, busy: Busy) -> None:
    """CUDA: cudaDeviceSynchronize blocks until the device has completed all preceding work, on
    every stream: the default stream and three new ones, each in turn the one held busy."""
    import anychip
    streams = [dev.current_stream()] + [anychip.Stream(dev) for _ in range(3)]
    buf = dev.alloc(4096)
    try:
        for i, s in enumerate(streams):
            busy.hold(s, 0.02)
            buf.memset(i + 1, stream=s)
            mark = s.record_event()
            dev.synchronize()
            if not mark.query():
                raise Failure(f"event.query() on stream {i} of 4 (0: the default stream), the one held busy, after "
                              "device.synchronize()", True, "False: the device synchronize did not wait for it")
            _same(f"stream {i}'s memset after device.synchronize()", buf.to_numpy(), np.full(4096, i + 1, np.uint8))
    finally:
        for s in streams[1:]:
            s.synchronize()
            s.destroy()
        buf.free()


def mem_info(dev: Any, ranks_per_device: int) -> None:
    """cudaMemGetInfo: free memory falls by an allocation and comes back after its free; freeing
    allocations of odd sizes gives back what allocating them took (no drift). Through the
    backend's own malloc / free (the caching allocator would round the sizes)."""
    if not getattr(dev.plugin, "accelerator", True) or ranks_per_device > 1:
        raise Skip("mem_info of a host backend, or of a device several ranks share, moves with others' memory")
    plugin, index = dev.plugin, dev.index
    dev.synchronize()
    dev.empty_cache()
    free0, total = dev.mem_info()
    big = max(1 << 20, min(64 << 20, total // 16)) + 1
    h = plugin._malloc(index, big)
    free1, _ = dev.mem_info()
    plugin._free(index, h)
    free2, _ = dev.mem_info()
    if free1 > free0 - big + free0 // 1024:
        raise Failure(f"mem_info() free with {big} bytes allocated (it was {free0})", f"<= {free0 - big}", free1)
    if free2 < free0 - free0 // 1024 // 16:
        raise Failure(f"mem_info() free after freeing the {big} bytes (it was {free0})", free0,
                      f"{free2}: the freed memory was not given back")
    sizes = [4096 * k + 1 + 2 * k for k in range(1, 97)] + [k * 257 + 1 for k in range(1, 97)]
    for round_ in range(2):
        held = [plugin._malloc(index, n) for n in sizes]
        for x in held:
            plugin._free(index, x)
        free3, _ = dev.mem_info()
        if free3 != free2:
            raise Failure(f"mem_info() free after allocating and freeing {len(sizes)} buffers of odd sizes "
                          f"(round {round_ + 1})", free2, f"{free3} ({free3 - free2:+d} bytes)")


def copy_peer(dev: Any, busy: Busy) -> None:
    """A device-to-device copy to another device of the backend (cudaMemcpyPeerAsync): enqueued
    on the source device's stream, after the work before it; exactly the bytes asked for."""
    import anychip
    count = dev.plugin.device_count()
    if count < 2:
        raise Skip(f"{dev.backend} has one device")
    other = anychip.device(f"{dev.backend}:{(dev.index + 1) % count}")
    s = anychip.Stream(dev)
    try:
        for n in (1, 63, 4101, 65543, (1 << 20) + 9):
            src = dev.alloc(n + 64).copy_from(_pattern(n + 64, 5))
            dst = other.alloc(n + 64).memset(0x5A)
            new = _pattern(n + 64, n)
            busy.hold(s, 0.01)
            src.copy_from(new, stream=s)            # queued: the peer copy must see it
            anychip.copy(dst, src, n, dst_offset=7, src_offset=3, stream=s)
            s.synchronize()
            got = dst.to_numpy()
            _same(f"a {n} B copy to {other} at offset 7 queued after held work and the source's refill on one stream",
                  got[7:7 + n], new[3:3 + n])
            _same(f"bytes around the {n} B copy to {other}", np.concatenate([got[:7], got[7 + n:]]),
                  np.full(64, 0x5A, np.uint8))
            src.free()
            dst.free()
    finally:
        s.synchronize()
        s.destroy()


# ---------------------------------------------------------------------------------------------
# collectives
# ---------------------------------------------------------------------------------------------

def _ints(dev: Any, values: np.ndarray) -> Any:
    return dev.alloc(values.nbytes).copy_from(np.ascontiguousarray(values))


def split(comm: Any) -> None:
    """ncclCommSplit: the ranks passing one color form a communicator of their own, ranked by
    (key, rank): its size, its ranks, and its reductions (sum, avg) over its members only."""
    n, r = comm.size, comm.rank
    if n < 2:
        raise Skip("needs at least 2 ranks")
    color = 0 if r < n - 1 else None                 # every rank but the last, ranked in reverse
    sub = comm.split(color, key=n - r)
    if sub is None:
        comm.barrier().wait()
        return
    try:
        members = n - 1
        want_rank = members - 1 - r
        if (sub.size, sub.rank) != (members, want_rank):
            raise Failure(f"(size, rank) of rank {r}'s communicator from split(color 0 for ranks 0..{n - 2}, "
                          "key n - rank)",
                          (members, want_rank), (sub.size, sub.rank))
        dev = sub.device
        count = 4099
        mine = np.arange(count, dtype=np.int64) * 1_000_003 + (r + 1) * 7_000_000_007
        send = _ints(dev, mine)
        total, avg = dev.alloc(mine.nbytes), dev.alloc(mine.nbytes)
        sub.all_reduce(send, total, count=count, dtype="int64", op="sum").wait()
        sub.all_reduce(send, avg, count=count, dtype="int64", op="avg").wait()
        ranks = np.full(16, sub.rank, np.int32)
        gathered = dev.alloc(16 * 4 * members)
        sub.all_gather(_ints(dev, ranks), gathered, count=16, dtype="int32").wait()
        want = np.sum([np.arange(count, dtype=np.int64) * 1_000_003 + (q + 1) * 7_000_000_007 for q in range(members)],
                      axis=0)
        got = total.to_numpy(np.int64)
        if not np.array_equal(got, want):
            raise Failure(f"int64 all_reduce sum on a sub-communicator of {members} of {n} ranks", want[:3], got[:3])
        got = avg.to_numpy(np.int64)
        if np.any(np.abs(got * members - want) >= members):
            raise Failure(f"int64 all_reduce avg on a sub-communicator of {members} of {n} ranks (the sum / {members})",
                          want[:3] // members, got[:3])
        got = gathered.to_numpy(np.int32).reshape(members, 16)[:, 0]
        if list(got) != list(range(members)):
            raise Failure(f"all_gather of each member's sub-communicator rank, {members} members", list(range(members)),
                          list(got))
    finally:
        sub.destroy()
        comm.barrier().wait()


def group_collectives(comm: Any) -> None:
    """ncclGroupStart / ncclGroupEnd around several collectives: each one runs, on its own
    buffers (three all_reduces and an all_gather, distinct data and reduce ops)."""
    n, r = comm.size, comm.rank
    dev = comm.device
    count = 1031
    inputs = [np.arange(count, dtype=np.int32) * (k + 2) + (r + 1) * (k + 5) for k in range(3)]
    sends = [_ints(dev, x) for x in inputs]
    recvs = [dev.alloc(x.nbytes).memset(0xA5) for x in inputs]
    gsend = _ints(dev, np.full(count, r * 11 + 3, np.int32))
    grecv = dev.alloc(count * 4 * n).memset(0xA5)
    ops = ("sum", "max", "min")
    with comm.group():
        works = [comm.all_reduce(s, d, count=count, dtype="int32", op=o) for s, d, o in zip(sends, recvs, ops,
                                                                                             strict=True)]
        works.append(comm.all_gather(gsend, grecv, count=count, dtype="int32"))
    for w in works:
        w.wait()
    bad = []
    for k, (d, o) in enumerate(zip(recvs, ops, strict=True)):
        every = [np.arange(count, dtype=np.int32) * (k + 2) + (q + 1) * (k + 5) for q in range(n)]
        want = {"sum": sum(every), "max": np.maximum.reduce(every), "min": np.minimum.reduce(every)}[o]
        if not np.array_equal(d.to_numpy(np.int32), want):
            bad.append(f"all_reduce {k + 1} ({o})")
    if not np.array_equal(grecv.to_numpy(np.int32), np.repeat(np.arange(n, dtype=np.int32) * 11 + 3, count)):
        bad.append("all_gather 4")
    for x in (*sends, *recvs, gsend, grecv):
        x.free()
    if bad:
        raise Failure("three all_reduces (sum, max, min) and an all_gather in one comm.group()", "each op's result",
                      f"wrong: {', '.join(bad)}")


def op_streams(comm: Any, busy: Busy) -> None:
    """Each op is ordered on the stream it is given (NCCL: the stream argument of each call),
    not on the stream of the communicator's first op: an all_reduce on a second stream, queued
    behind held work and its input's copy there, sees that input."""
    import anychip
    n, r = comm.size, comm.rank
    dev = comm.device
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    count = 4099
    buf = dev.alloc(count * 4)
    try:
        x = np.full(count, r + 1, np.int32)
        buf.copy_from(x)
        comm.all_reduce(buf, count=count, dtype="int32", stream=s1).wait()       # the first op: stream 1
        s1.synchronize()
        for k in range(2):
            fresh = np.arange(count, dtype=np.int32) * (k + 3) + r
            busy.hold(s2, 0.02)
            buf.copy_from(fresh, stream=s2)
            w = comm.all_reduce(buf, count=count, dtype="int32", stream=s2)
            got = np.empty(count, np.int32)
            buf.copy_to(got, stream=s2)
            s2.synchronize()
            w.wait()
            want = np.asarray(np.sum([np.arange(count, dtype=np.int32) * (k + 3) + q for q in range(n)], axis=0),
                              np.int32)
            if not np.array_equal(got, want):
                raise Failure(f"all_reduce {k + 2} of a communicator, on stream 2 behind held work and its input's "
                              "copy (its first op ran on stream 1)", f"the sum of the new inputs: {want[:3]}",
                              f"{got[:3]}: it did not wait for stream 2")
    finally:
        s1.synchronize()
        s2.synchronize()
        s1.destroy()
        s2.destroy()
        buf.free()


def abort(comm: Any) -> None:
    """anychip's Communicator.abort: every rank's pending and future ops of the communicator fail
    (NCCL's ncclCommAbort is local; anychip promises more). Each peer's all_reduce raises an
    anychip error naming the abort or the aborting rank within 10 s, instead of hanging."""
    from ..runtime.errors import AnychipError
    n, r = comm.size, comm.rank
    if n < 2:
        raise Skip("needs at least 2 ranks")
    c = _comm_with({"ANYCHIP_COLLECTIVE_TIMEOUT": "20"})
    try:
        buf = c.device.alloc(4 * 1024)
        c.all_reduce(buf, count=1024).wait(timeout=30)          # the communicator works
        comm.barrier().wait()
        if r == n - 1:
            c.abort("aborted by the conformance suite's abort case")
            return
        t = time.perf_counter()
        try:
            c.all_reduce(buf, count=1024).wait(timeout=30)
        except AnychipError as exc:
            secs = time.perf_counter() - t
            msg = str(exc)
            if "abort" not in msg.lower() and not names_rank(msg, n - 1):
                raise Failure(f"the error of an all_reduce whose peer rank {n - 1} aborted the communicator",
                              f"a message naming the abort or rank {n - 1}", f"{type(exc).__name__}: {msg}") from None
            if secs > 10:
                raise Failure(f"seconds until the all_reduce failed after rank {n - 1} aborted", "< 10",
                              f"{secs:.1f} ({type(exc).__name__}: {msg})") from None
            return
        raise Failure(f"an all_reduce whose peer rank {n - 1} aborted the communicator", "an anychip error",
                      "it completed")
    finally:
        comm.barrier().wait()
        try:
            c.destroy()
        except Exception:  # noqa: BLE001, S110 - the aborted communicator's destroy may refuse
            pass
