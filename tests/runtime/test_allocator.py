"""The caching allocator policy, over a fake raw allocator and fake streams/events
(as CuPy tests its memory pool): no backend is involved."""
from __future__ import annotations

import itertools
import pickle
import re
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from anychip._lib._alloc import ALLOCATED, FREE
from anychip.runtime.allocator import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConf,
    Block,
    CachingAllocator,
    NativeAllocator,
    make_allocator,
    round_size,
    segment_size,
)
from anychip.runtime.errors import InvalidArgumentError, OutOfMemoryError

KiB = 1 << 10
MiB = 1 << 20


# ---------------------------------------------------------------------------
# fakes
# ---------------------------------------------------------------------------

class Handle:
    """A raw segment of the fake device."""

    __slots__ = ("id", "size")

    def __init__(self, id: int, size: int) -> None:
        self.id = id
        self.size = size

    def __repr__(self) -> str:
        return f"H{self.id}"


class Event:
    __slots__ = ("id", "stream", "done", "destroyed")

    def __init__(self, id: int, stream: object) -> None:
        self.id = id
        self.stream = stream
        self.done = False
        self.destroyed = False

    def __repr__(self) -> str:
        return f"E{self.id}@{self.stream}"


class FakeDevice:
    """Raw alloc/free with a capacity (so out-of-memory is real), events whose
    completion the test controls, and a log of every call."""

    def __init__(self, capacity: int = 1 << 34, events: bool = True, auto_done: bool = False) -> None:
        self.capacity = capacity
        self.used = 0
        self.live: dict[int, Handle] = {}
        self.calls: list[tuple] = []
        self.ids = itertools.count(1)
        self.events: list[Event] = []
        self.auto_done = auto_done
        self.has_events = events

    # raw memory
    def raw_alloc(self, n: int) -> Handle:
        self.calls.append(("alloc", n))
        if self.used + n > self.capacity:
            raise OutOfMemoryError(n, self.capacity - self.used, self.capacity, backend="fake", code=2,
                                   code_name="FAKE_ERROR_OOM")
        h = Handle(next(self.ids), n)
        self.live[h.id] = h
        self.used += n
        return h

    def raw_free(self, h: Handle) -> None:
        self.calls.append(("free", h.id))
        assert self.live.pop(h.id) is h, "raw_free of a handle that is not live"
        self.used -= h.size

    def mem_info(self) -> tuple[int, int]:
        return self.capacity - self.used, self.capacity

    # events
    def record(self, stream: object) -> Event:
        ev = Event(len(self.events) + 1, stream)
        ev.done = self.auto_done
        self.events.append(ev)
        self.calls.append(("record", stream))
        return ev

    def query(self, ev: Event) -> bool:
        assert not ev.destroyed
        return ev.done

    def synchronize(self, ev: Event) -> None:
        assert not ev.destroyed
        self.calls.append(("sync", ev.id))
        ev.done = True

    def destroy(self, ev: Event) -> None:
        assert not ev.destroyed
        ev.destroyed = True

    def complete(self, stream: object = ...) -> None:
        """Mark the events recorded so far (on ``stream``, or all) as done."""
        for ev in self.events:
            if stream is ... or ev.stream == stream:
                ev.done = True

    def pending_events(self) -> list[Event]:
        return [e for e in self.events if not e.destroyed]

    def allocs(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "alloc"]

    def frees(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "free"]

    def kwargs(self) -> dict:
        kw = dict(mem_info=self.mem_info, name="fake:0")
        if self.has_events:
            kw.update(event_record=self.record, event_query=self.query,
                      event_synchronize=self.synchronize, event_destroy=self.destroy)
        return kw

    def allocator(self, conf: AllocatorConf | str | None = None, cls: type = CachingAllocator):
        return cls(self.raw_alloc, self.raw_free, conf=conf, **self.kwargs())


@pytest.fixture
def dev() -> FakeDevice:
    return FakeDevice()


@pytest.fixture
def alloc(dev: FakeDevice) -> CachingAllocator:
    return dev.allocator()


def blocks_of(al, handle) -> list[tuple[int, int, str]]:
    for seg in al.snapshot():
        if seg["handle"] == repr(handle):
            return seg["blocks"]
    raise AssertionError(f"no segment {handle!r}")


def state(al) -> tuple:
    return al.memory_stats(), al.snapshot()


# ---------------------------------------------------------------------------
# sizes, pools, split and coalesce
# ---------------------------------------------------------------------------

def test_rounding(alloc: CachingAllocator) -> None:
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    a, b, c = alloc.malloc(1), alloc.malloc(513), alloc.malloc(512)
    assert (a.size, a.requested) == (512, 1)
    assert (b.size, b.requested) == (1024, 513)
    assert (c.size, c.requested) == (512, 512)
    assert (a.offset, b.offset, c.offset) == (0, 512, 1536)
    assert a.handle is b.handle is c.handle


def test_roundup_power2_divisions() -> None:
    divs = AllocatorConf.parse("roundup_power2_divisions:4").roundup_power2_divisions
    assert round_size(MiB + 1, divs) == MiB + 256 * KiB
    assert round_size(MiB, divs) == MiB
    assert round_size(3 * MiB - 5, divs) == 3 * MiB
    assert round_size(1000, divs) == 1024        # below 512 * divisions: plain rounding
    dev = FakeDevice()
    al = dev.allocator("roundup_power2_divisions:4")
    assert al.malloc(5 * MiB + 1).size == 6 * MiB


@pytest.mark.parametrize("nbytes, seg, pool", [
    (1, SMALL_BUFFER, "small"),
    (SMALL_SIZE, SMALL_BUFFER, "small"),
    (SMALL_SIZE + 1, LARGE_BUFFER, "large"),
    (10 * MiB - 512, LARGE_BUFFER, "large"),
    (10 * MiB, 10 * MiB, "large"),
    (11 * MiB + 1, 12 * MiB, "large"),
])
def test_segment_size_per_pool(dev: FakeDevice, alloc: CachingAllocator, nbytes: int, seg: int, pool: str) -> None:
    assert segment_size(round_size(nbytes)) == seg
    alloc.malloc(nbytes)
    assert dev.allocs() == [seg]
    (snap,) = alloc.snapshot()
    assert (snap["total_size"], snap["pool"]) == (seg, pool)


def test_split_then_coalesce(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a, b, c = alloc.malloc(4 * KiB), alloc.malloc(8 * KiB), alloc.malloc(4 * KiB)
    h = a.handle
    assert dev.allocs() == [SMALL_BUFFER]
    rest = SMALL_BUFFER - 16 * KiB
    assert blocks_of(alloc, h) == [(0, 4096, "active_allocated"), (4096, 8192, "active_allocated"),
                                   (12288, 4096, "active_allocated"), (16384, rest, "inactive")]
    alloc.free(b)                                   # the middle one: nothing to merge with
    assert blocks_of(alloc, h) == [(0, 4096, "active_allocated"), (4096, 8192, "inactive"),
                                   (12288, 4096, "active_allocated"), (16384, rest, "inactive")]
    alloc.free(a)                                   # merges with its free right neighbour
    assert blocks_of(alloc, h) == [(0, 12288, "inactive"), (12288, 4096, "active_allocated"),
                                   (16384, rest, "inactive")]
    alloc.free(c)                                   # merges on both sides: one free block
    assert blocks_of(alloc, h) == [(0, SMALL_BUFFER, "inactive")]
    stats = alloc.memory_stats()
    assert stats["inactive_split.all.current"] == 0
    assert stats["inactive_split_bytes.all.current"] == 0
    assert dev.frees() == []


def test_coalesce_left_neighbour(alloc: CachingAllocator) -> None:
    a, b, c = alloc.malloc(512), alloc.malloc(512), alloc.malloc(512)
    alloc.free(a)
    alloc.free(b)                                   # merges into its free left neighbour
    assert blocks_of(alloc, a.handle)[:2] == [(0, 1024, "inactive"), (1024, 512, "active_allocated")]
    alloc.free(c)
    assert blocks_of(alloc, a.handle) == [(0, SMALL_BUFFER, "inactive")]


def test_best_fit(dev: FakeDevice, alloc: CachingAllocator) -> None:
    # free blocks of 4K, 8K and 16K, kept apart by live 512-byte blocks
    b16, s1, b4, s2, b8, s3 = (alloc.malloc(n) for n in (16 * KiB, 512, 4 * KiB, 512, 8 * KiB, 512))
    where = {n: (b.handle, b.offset) for n, b in ((4, b4), (8, b8), (16, b16))}
    for b in (b4, b8, b16):
        alloc.free(b)
    got = alloc.malloc(6 * KiB)
    assert (got.handle, got.offset) == where[8]
    assert got.size == 6 * KiB                      # split: 2K stay free behind it
    assert dev.allocs() == [SMALL_BUFFER]
    h = got.handle
    assert (where[8][1] + 6 * KiB, 2 * KiB, "inactive") in blocks_of(alloc, h)
    # exact sizes are taken before larger ones
    assert (alloc.malloc(4 * KiB).offset, alloc.malloc(16 * KiB).offset) == (where[4][1], where[16][1])


def test_equal_sizes_last_freed_first(alloc: CachingAllocator) -> None:
    blocks = [alloc.malloc(64 * KiB) for _ in range(5)]
    alloc.free(blocks[1])
    alloc.free(blocks[3])
    assert alloc.malloc(64 * KiB).offset == blocks[3].offset
    assert alloc.malloc(64 * KiB).offset == blocks[1].offset


def test_merge_with_equal_size_neighbours(alloc: CachingAllocator) -> None:
    a, s, b, _t = alloc.malloc(4 * KiB), alloc.malloc(512), alloc.malloc(4 * KiB), alloc.malloc(512)
    alloc.free(a)
    alloc.free(b)                                   # two free blocks of one size
    alloc.free(s)                                   # merges both
    assert blocks_of(alloc, a.handle)[:2] == [(0, 8 * KiB + 512, "inactive"), (8 * KiB + 512, 512, "active_allocated")]
    c = alloc.malloc(8 * KiB + 512)
    assert (c.handle, c.offset) == (a.handle, 0)


def test_free_list_holds_exactly_the_free_blocks(alloc: CachingAllocator) -> None:
    # many distinct sizes come and go: the free list holds the free blocks, sorted, and nothing else
    keep = []
    for r in range(8):
        blocks = []
        for k in range(40):
            blocks.append(alloc.malloc(512 * (1 + 40 * r + k)))
            keep.append(alloc.malloc(512))          # keeps the blocks apart
        for b in blocks:
            alloc.free(b)
        keep += [alloc.malloc(b.requested) for b in blocks]
    listed = [b for fl in (alloc._small[None], alloc._any_small) for b in fl.blocks()]
    assert [b.size for b in alloc._small[None].blocks()] == sorted(b.size for b in alloc._small[None].blocks())
    inactive = {(seg["handle"], off, size) for seg in alloc.snapshot() for off, size, st in seg["blocks"]
                if st == "inactive"}
    assert {(repr(b.handle), b.offset, b.size) for b in listed} == inactive and len(listed) == len(inactive)
    # sizes that come and go do not pile up: empty size buckets are dropped once they outnumber the others
    sizes = alloc._small[None]._sizes()
    used = {b.size for b in alloc._small[None].blocks()}
    assert sizes == sorted(set(sizes)) and used <= set(sizes) and len(sizes) <= 2 * len(used) + 17
    for b in keep:
        alloc.free(b)
    assert alloc.memory_stats()["allocated_bytes.all.current"] == 0


def test_large_pool_split_rule(dev: FakeDevice, alloc: CachingAllocator) -> None:
    b = alloc.malloc(11 * MiB)                      # 12 MiB segment: 1 MiB left, not > 1 MiB: whole
    assert b.size == 12 * MiB and b.requested == 11 * MiB
    a = alloc.malloc(5 * MiB)                       # 20 MiB segment: 15 MiB left > 1 MiB: split
    assert a.size == 5 * MiB
    assert blocks_of(alloc, a.handle) == [(0, 5 * MiB, "active_allocated"), (5 * MiB, 15 * MiB, "inactive")]
    c = alloc.malloc(14 * MiB + 512)                # from a's 15 MiB rest: 512 K left, no split
    assert (c.handle, c.offset, c.size) == (a.handle, 5 * MiB, 15 * MiB)
    assert dev.allocs() == [12 * MiB, LARGE_BUFFER]
    assert alloc.memory_stats()["allocated_bytes.large_pool.current"] == 32 * MiB


def test_max_split_size(dev: FakeDevice) -> None:
    al = dev.allocator("max_split_size_mb:40")
    big = al.malloc(60 * MiB)
    assert big.size == 60 * MiB
    h = big.handle
    al.free(big)
    # below max_split_size: never served by an oversize block
    small = al.malloc(30 * MiB)
    assert small.handle is not h
    assert dev.allocs() == [60 * MiB, 30 * MiB]
    # at or above it: served if it wastes less than LARGE_BUFFER, and never split
    c = al.malloc(45 * MiB)
    assert (c.handle, c.size) == (h, 60 * MiB)
    al.free(c)
    d = al.malloc(40 * MiB)                         # 60 >= 40 + 20: too wasteful
    assert d.handle is not h
    assert dev.allocs() == [60 * MiB, 30 * MiB, 40 * MiB]
    # a request below max_split_size splits as usual, a block of 40 MiB or more does not
    al.free(small)
    e = al.malloc(12 * MiB)
    assert (e.handle, e.size) == (small.handle, 12 * MiB)
    assert al.memory_stats()["max_split_size"] == 40 * MiB


def test_small_and_large_pools_are_separate(dev: FakeDevice, alloc: CachingAllocator) -> None:
    s = alloc.malloc(SMALL_SIZE)                    # small pool, 2 MiB segment
    alloc.free(s)
    big = alloc.malloc(SMALL_SIZE + 1)              # would fit the free 2 MiB, but it is large
    assert big.handle is not s.handle
    assert dev.allocs() == [SMALL_BUFFER, LARGE_BUFFER]
    alloc.free(big)
    little = alloc.malloc(512)                      # back to the small pool's segment
    assert little.handle is s.handle
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.small_pool.current"] == SMALL_BUFFER
    assert stats["reserved_bytes.large_pool.current"] == LARGE_BUFFER
    assert stats["segment.all.current"] == 2


def test_zero_size(dev: FakeDevice, alloc: CachingAllocator) -> None:
    z = alloc.malloc(0)
    assert (z.size, z.requested, z.handle, z.offset) == (0, 0, None, 0)
    assert dev.calls == []
    assert alloc.memory_stats()["allocation.all.current"] == 0
    alloc.record_stream(z, "s1")                    # accepted, nothing to wait for
    alloc.free(z)
    with pytest.raises(InvalidArgumentError, match="double free"):
        alloc.free(z)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "12", None])
def test_bad_sizes(alloc: CachingAllocator, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="allocation size"):
        alloc.malloc(bad)


def test_numpy_size(alloc: CachingAllocator) -> None:
    b = alloc.malloc(np.int64(1000))
    assert b.size == 1024 and type(b.requested) is int


# ---------------------------------------------------------------------------
# streams
# ---------------------------------------------------------------------------

def test_same_stream_reuse_is_immediate(dev: FakeDevice, alloc: CachingAllocator) -> None:
    for size in (512, 64 * KiB, SMALL_SIZE, 64 * MiB):
        a = alloc.malloc(size, "s1")
        where = (a.handle, a.offset)
        n = len(dev.allocs())
        alloc.free(a)
        for _ in range(3):
            b = alloc.malloc(size, "s1")
            assert (b.handle, b.offset) == where
            alloc.free(b)
        assert len(dev.allocs()) == n
    assert dev.events == []


def test_cross_stream_reuse_waits_for_event(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a = alloc.malloc(64 * MiB, "A")
    where = (a.handle, a.offset)
    alloc.free(a)
    b1 = alloc.malloc(64 * MiB, "B")                # miss on B: an event is recorded on A
    assert b1.handle is not where[0]
    assert [(e.stream, e.done) for e in dev.events] == [("A", False)]
    alloc.free(b1)
    b2 = alloc.malloc(64 * MiB, "B")                # B's own block; A's still waits
    assert b2.handle is b1.handle
    alloc.free(b2)
    dev.complete("A")
    c = alloc.malloc(64 * MiB, "B")
    d = alloc.malloc(64 * MiB, "B")                 # A's block, now B's
    assert {(c.handle, c.offset), (d.handle, d.offset)} == {(b1.handle, 0), where}
    assert dev.allocs() == [64 * MiB, 64 * MiB]
    assert all(e.destroyed for e in dev.events)
    # the block moved: A has nothing cached any more
    alloc.malloc(64 * MiB, "A")
    assert dev.allocs() == [64 * MiB] * 3


def test_cross_stream_block_reused_meanwhile_stays(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a = alloc.malloc(64 * MiB, "A")
    h = a.handle
    alloc.free(a)
    alloc.malloc(64 * MiB, "B")                     # event on A, A's block marked
    a2 = alloc.malloc(64 * MiB, "A")                # A reuses it meanwhile (mark cleared)
    assert a2.handle is h
    alloc.free(a2)                                  # freed again after the event: not covered
    dev.complete()
    b = alloc.malloc(64 * MiB, "B")
    assert b.handle is not h                        # B did not get it...
    a3 = alloc.malloc(64 * MiB, "A")
    assert a3.handle is h                           # ...A still has it
    assert len(dev.allocs()) == 3


def test_cross_stream_event_done_at_once(dev: FakeDevice) -> None:
    dev.auto_done = True                            # e.g. the CPU backend
    al = dev.allocator()
    a = al.malloc(1000, "A")
    al.free(a)
    b = al.malloc(1000, "B")
    assert (b.handle, b.offset) == (a.handle, 0)
    assert dev.allocs() == [SMALL_BUFFER]
    # whole segments moved, split blocks coalesce in B's list
    assert blocks_of(al, a.handle) == [(0, 1024, "active_allocated"), (1024, SMALL_BUFFER - 1024, "inactive")]


def test_record_stream_delays_reuse(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a = alloc.malloc(64 * MiB, "A")
    h = a.handle
    alloc.record_stream(a, "B")
    alloc.record_stream(a, "C")
    alloc.record_stream(a, "A")                     # its own stream: nothing to do
    alloc.free(a)
    assert [e.stream for e in dev.events] == ["B", "C"] or [e.stream for e in dev.events] == ["C", "B"]
    assert blocks_of(alloc, h) == [(0, 64 * MiB, "active_pending_free")]
    stats = alloc.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["active_bytes.all.current"] == 64 * MiB
    assert stats["active.large_pool.current"] == 1
    with pytest.raises(InvalidArgumentError, match="already freed"):
        alloc.free(a)
    b = alloc.malloc(64 * MiB, "A")                 # not reusable yet
    assert b.handle is not h
    alloc.free(b)
    dev.complete("B")
    alloc.malloc(512, "A")                          # events are polled at every malloc
    assert blocks_of(alloc, h) == [(0, 64 * MiB, "active_pending_free")]
    dev.complete("C")
    c = alloc.malloc(64 * MiB, "A")
    d = alloc.malloc(64 * MiB, "A")
    assert {c.handle, d.handle} == {h, b.handle}
    assert len(dev.allocs()) == 3                   # 64M, 64M, small segment
    stats = alloc.memory_stats()
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"] == 128 * MiB + 512
    assert stats["active_bytes.all.peak"] == 128 * MiB + 512
    assert stats["active.all.allocated"] == 5 and stats["active.all.freed"] == 2


def test_record_stream_errors(alloc: CachingAllocator) -> None:
    a = alloc.malloc(512)
    alloc.free(a)
    with pytest.raises(InvalidArgumentError, match="record_stream"):
        alloc.record_stream(a, "B")
    with pytest.raises(InvalidArgumentError, match="record_stream"):
        alloc.record_stream("not a block", "B")


def test_without_events(dev: FakeDevice) -> None:
    dev.has_events = False
    al = dev.allocator()
    a = al.malloc(64 * MiB, "A")
    al.free(a)
    b = al.malloc(64 * MiB, "B")                    # never across streams by itself
    assert b.handle is not a.handle
    al.record_stream(b, "A")
    al.free(b)
    assert blocks_of(al, b.handle) == [(0, 64 * MiB, "active_pending_free")]
    al.empty_cache()                                # can't know B's work is done: b stays
    assert dev.frees() == [a.handle.id]
    c = al.malloc(64 * MiB, "C")
    assert c.handle not in (a.handle, b.handle)
    al.free(c)
    al.synchronize_and_free_events()                # the device is idle: everything is free for all
    d = al.malloc(64 * MiB, "D")
    assert d.handle in (b.handle, c.handle)
    assert len(dev.allocs()) == 3


def test_free_blocks_of_two_streams_coalesce_once_their_work_is_done(dev: FakeDevice,
                                                                     alloc: CachingAllocator) -> None:
    a, b = alloc.malloc(4 * KiB, "s1"), alloc.malloc(4 * KiB, "s1")
    alloc.free(a)
    c = alloc.malloc(SMALL_SIZE, "s2")              # miss on s2: event on s1, s1's blocks marked
    c2 = alloc.malloc(SMALL_SIZE, "s2")             # s2's segment is full
    dev.complete("s1")
    d = alloc.malloc(4 * KiB, "s2")                 # s1's free blocks are stream-less now: d is a's place
    assert (d.handle, d.offset) == (a.handle, 0) and dev.allocs() == [SMALL_BUFFER, SMALL_BUFFER]
    for x in (b, c, c2, d):
        alloc.free(x)
    # b went back to s1's list, d to s2's: the segment is whole only once both are stream-less
    assert len(blocks_of(alloc, b.handle)) > 1
    alloc.synchronize_and_free_events()             # the device is idle
    assert blocks_of(alloc, b.handle) == [(0, SMALL_BUFFER, "inactive")]
    assert blocks_of(alloc, c.handle) == [(0, SMALL_BUFFER, "inactive")]
    assert alloc.memory_stats()["inactive_split.all.current"] == 0
    alloc.empty_cache()
    assert dev.live == {} and alloc.memory_stats()["reserved_bytes.all.current"] == 0


def test_empty_cache_returns_segments_freed_on_several_streams(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a = alloc.malloc(4 * KiB, "s1")
    alloc.free(a)
    alloc.malloc(SMALL_SIZE, "s2")                  # event on s1 (not done); a new segment for s2...
    alloc.malloc(SMALL_SIZE, "s2")                  # ...which is full now
    dev.complete()
    b = alloc.malloc(4 * KiB, "s2")                 # a's segment, now s2's block inside a stream-less rest
    assert b.handle is a.handle
    alloc.free(b)                                   # back to s2's list, next to stream-less free memory
    assert [st for _, _, st in blocks_of(alloc, a.handle)] == ["inactive", "inactive"]
    alloc.empty_cache()                             # every block of the segment is free: it goes
    assert a.handle.id in dev.frees()
    assert alloc.memory_stats()["segment.all.current"] == 1


def test_retire_stream(dev: FakeDevice, alloc: CachingAllocator) -> None:
    live = alloc.malloc(8 * KiB, "s1")
    cached = alloc.malloc(4 * KiB, "s1")
    alloc.free(cached)
    other = alloc.malloc(512, "s2")
    alloc.record_stream(other, "s1")
    n_events = len(dev.events)
    alloc.retire_stream("s1")
    assert "s1" not in alloc._small and len(dev.events) == n_events
    got = alloc.malloc(4 * KiB, "s3")               # s1's cached memory serves any stream at once
    assert (got.handle, got.offset) == (cached.handle, cached.offset)
    alloc.free(other)                               # no event is recorded on the retired stream
    alloc.free(live)                                # freed after its stream was retired: stream-less
    assert len(dev.events) == n_events
    assert live in alloc._any_small.blocks() or live.prev in alloc._any_small.blocks()
    alloc.retire_stream("never used")               # nothing to do
    alloc.free(got)
    alloc.synchronize_and_free_events()
    alloc.empty_cache()
    assert dev.live == {}


@pytest.mark.parametrize("cls", [CachingAllocator, NativeAllocator])
@pytest.mark.parametrize("nbytes", [1 << 62, 1 << 63, 1 << 64, 10**30])
def test_absurd_size_is_out_of_memory(dev: FakeDevice, cls: type, nbytes: int) -> None:
    al = dev.allocator(cls=cls)
    with pytest.raises(OutOfMemoryError) as info:
        al.malloc(nbytes)
    assert info.value.requested == nbytes and dev.calls == []
    assert f"{nbytes} bytes were requested: no device can hold it" in str(info.value)
    assert al.memory_stats()["num_ooms"] == 1


def test_abandoned_allocator(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a, b = alloc.malloc(4 * KiB), alloc.malloc(4 * KiB)
    alloc._lock.acquire()                           # e.g. held by another thread at a fork()
    alloc.abandon("its memory belongs to the parent process")
    with pytest.raises(InvalidArgumentError, match="free\\(\\) on fake:0: its memory belongs to the parent process"):
        alloc.free(a)
    alloc.free(b, False)                            # a finalizer: ignored, never blocks
    with pytest.raises(InvalidArgumentError, match="malloc on fake:0: its memory belongs"):
        alloc.malloc(512)
    assert dev.calls == [("alloc", SMALL_BUFFER)] and b._state == ALLOCATED


def test_threads_race_the_cached_path_against_the_slow_path() -> None:
    dev = FakeDevice(auto_done=True)
    al = dev.allocator()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        live: list[Block] = []
        try:
            for _ in range(3000):
                r = rng.random()
                if live and r < 0.45:
                    al.free(live.pop(int(rng.integers(len(live)))))
                elif r < 0.47:
                    al.empty_cache()
                elif r < 0.49:
                    al.memory_stats()
                elif r < 0.5 and live:
                    al.record_stream(live[-1], f"s{seed + 1}")
                else:
                    live.append(al.malloc(int(rng.choice([512, 3000, 64 * KiB, MiB + 5, 3 * MiB])), f"s{seed}"))
            for b in live:
                al.free(b)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    al.synchronize_and_free_events()
    al.empty_cache()
    s = al.memory_stats()
    assert (s["allocated_bytes.all.current"], s["active_bytes.all.current"], s["reserved_bytes.all.current"],
            s["inactive_split.all.current"]) == (0, 0, 0, 0)
    assert dev.live == {}


def test_finalizer_free_while_busy_is_deferred(dev: FakeDevice, alloc: CachingAllocator) -> None:
    a = alloc.malloc(4 * KiB)
    with alloc._locked():                           # another operation is under way
        alloc.free(a, False)                        # a finalizer: queued, never blocks
        assert a._state == ALLOCATED
    assert a._state == FREE                         # freed when the holder left
    assert alloc.memory_stats()["allocated_bytes.all.current"] == 0


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

def test_double_free_leaves_state_unchanged(alloc: CachingAllocator) -> None:
    a, b = alloc.malloc(1000), alloc.malloc(3000)
    alloc.free(a)
    before = state(alloc)
    with pytest.raises(InvalidArgumentError, match="double free on fake:0"):
        alloc.free(a)
    assert state(alloc) == before
    alloc.free(b)                                   # merged into a's block object: b's is gone
    before = state(alloc)
    with pytest.raises(InvalidArgumentError, match="double free"):
        alloc.free(a)
    with pytest.raises(InvalidArgumentError, match="double free"):
        alloc.free(b)
    assert state(alloc) == before


def test_foreign_block(dev: FakeDevice, alloc: CachingAllocator) -> None:
    other = FakeDevice().allocator()
    x = other.malloc(512)
    keep = alloc.malloc(512)
    before = state(alloc)
    with pytest.raises(InvalidArgumentError, match="another allocator"):
        alloc.free(x)
    with pytest.raises(InvalidArgumentError, match="expects a Block"):
        alloc.free(object())
    with pytest.raises(InvalidArgumentError, match="expects a Block"):
        alloc.free(None)
    assert state(alloc) == before
    other.free(x)
    alloc.free(keep)


def test_empty_cache_returns_exactly_unsplit_segments(dev: FakeDevice, alloc: CachingAllocator) -> None:
    s1 = alloc.malloc(SMALL_SIZE)                   # small segment 1, half used
    s2 = alloc.malloc(SMALL_SIZE)                   # same segment, now full
    s3 = alloc.malloc(SMALL_SIZE)                   # small segment 2
    big = alloc.malloc(64 * MiB)                    # large segment 3
    mid = alloc.malloc(5 * MiB)                     # large segment 4 (20 MiB), split
    alloc.free(s1)                                  # segment 1 is still split (s2 lives)
    alloc.free(s3)                                  # segment 2 is one free block
    alloc.free(big)                                 # segment 3 is one free block
    assert dev.frees() == []
    alloc.empty_cache()
    assert sorted(dev.frees()) == sorted([s3.handle.id, big.handle.id])
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == SMALL_BUFFER + LARGE_BUFFER
    assert stats["segment.all.current"] == 2
    assert stats["num_device_free"] == 2
    assert stats["reserved_bytes.all.freed"] == SMALL_BUFFER + 64 * MiB
    assert {s["handle"] for s in alloc.snapshot()} == {repr(s2.handle), repr(mid.handle)}
    alloc.free(s2)
    alloc.free(mid)
    alloc.empty_cache()
    assert dev.live == {} and alloc.snapshot() == []


def test_oom_escalation_order(dev: FakeDevice) -> None:
    dev.capacity = 64 * MiB
    al = dev.allocator()
    a = al.malloc(32 * MiB, "A")
    al.record_stream(a, "B")
    al.free(a)                                      # waits for an event on B
    c = al.malloc(16 * MiB, "A")
    al.free(c)                                      # cached
    del dev.calls[:]
    d = al.malloc(48 * MiB, "A")
    assert [x for x in dev.calls if x[0] in ("alloc", "free", "sync")] == [
        ("alloc", 48 * MiB),                        # fails: 48 MiB are reserved
        ("sync", 1),                                # wait for every pending event
        ("free", a.handle.id),                      # return every unused segment
        ("free", c.handle.id),
        ("alloc", 48 * MiB),                        # retried once: fits
    ]
    assert d.handle.size == 48 * MiB
    stats = al.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"], stats["num_sync_all_streams"]) == (1, 0, 1)
    assert stats["reserved_bytes.all.current"] == 48 * MiB

    del dev.calls[:]
    with pytest.raises(OutOfMemoryError) as info:
        al.malloc(32 * MiB, "A")
    assert [x for x in dev.calls if x[0] in ("alloc", "free", "sync")] == [("alloc", 32 * MiB),
                                                                            ("alloc", 32 * MiB)]
    err = info.value
    assert (err.requested, err.free, err.total, err.device) == (32 * MiB, 16 * MiB, 64 * MiB, "fake:0")
    assert (err.backend, err.code, err.code_name) == ("fake", 2, "FAKE_ERROR_OOM")
    assert err.stats["num_ooms"] == 1 and err.stats["num_alloc_retries"] == 2
    assert err.stats["allocated_bytes.all.current"] == 48 * MiB
    msg = str(err)
    for words in ("tried to allocate 32.00 MiB", "16.00 MiB free", "64.00 MiB total", "48.00 MiB allocated",
                  "48.00 MiB reserved"):
        assert words in msg, msg
    # picklable, fields included
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and isinstance(back, OutOfMemoryError) and isinstance(back, MemoryError)
    assert (back.requested, back.free, back.total, back.device, back.code_name) == (
        32 * MiB, 16 * MiB, 64 * MiB, "fake:0", "FAKE_ERROR_OOM")
    assert back.stats == err.stats and str(back) == msg
    # the allocator still works after the error
    assert al.memory_stats()["num_ooms"] == 1
    al.free(d)
    assert al.malloc(48 * MiB, "A").handle is d.handle


def test_oom_uses_other_streams_blocks_after_sync(dev: FakeDevice) -> None:
    dev.capacity = 40 * MiB
    al = dev.allocator()
    keep = al.malloc(5 * MiB, "A")                  # 20 MiB segment, split: cannot be released
    other = al.malloc(5 * MiB, "A")
    al.free(other)
    al.malloc(20 * MiB, "B")                        # fills the device
    b = al.malloc(5 * MiB, "B")                     # OOM: A's free 15 MiB come over after a sync
    assert (b.handle, b.offset) == (keep.handle, 5 * MiB)
    assert al.memory_stats()["num_ooms"] == 0


def test_oom_without_mem_info() -> None:
    dev = FakeDevice(capacity=4 * MiB)
    al = CachingAllocator(dev.raw_alloc, dev.raw_free, name="fake:1")
    al.malloc(SMALL_SIZE)
    with pytest.raises(OutOfMemoryError) as info:
        al.malloc(8 * MiB)
    err = info.value
    assert (err.free, err.total) == (None, None)
    assert "1048576 bytes allocated, 2097152 bytes reserved" in str(err)


def test_garbage_collection_threshold(dev: FakeDevice) -> None:
    dev.capacity = 100 * MiB
    al = dev.allocator("garbage_collection_threshold:0.5")
    blocks = [al.malloc(n * MiB) for n in (12, 14, 16, 18)]   # 60 MiB reserved
    for b in blocks:
        al.free(b)
    del dev.calls[:]
    al.malloc(30 * MiB)                             # 60 > 50: free oldest unused until <= 50
    assert dev.calls == [("free", blocks[0].handle.id), ("alloc", 30 * MiB)]
    al.malloc(40 * MiB)                             # 78 > 50: 30 more to go
    assert dev.calls[2:] == [("free", blocks[1].handle.id), ("free", blocks[2].handle.id),
                             ("alloc", 40 * MiB)]


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------

def test_stats_after_known_sequence(alloc: CachingAllocator) -> None:
    a = alloc.malloc(1000)                          # small: 1024 of a new 2 MiB segment
    alloc.malloc(3 * MiB)                           # large: 3 MiB of a new 20 MiB segment
    alloc.free(a)                                   # the small segment is whole again
    c = alloc.malloc(512)
    s = alloc.memory_stats()
    r_small = SMALL_BUFFER - 1024                   # first rest of the small segment
    expect = {
        "allocated_bytes": {"small_pool": (512, 1024, 1536, 1024), "large_pool": (3 * MiB, 3 * MiB, 3 * MiB, 0),
                            "all": (3 * MiB + 512, 3 * MiB + 1024, 3 * MiB + 1536, 1024)},
        "requested_bytes": {"small_pool": (512, 1000, 1512, 1000), "large_pool": (3 * MiB, 3 * MiB, 3 * MiB, 0),
                            "all": (3 * MiB + 512, 3 * MiB + 1000, 3 * MiB + 1512, 1000)},
        "reserved_bytes": {"small_pool": (SMALL_BUFFER, SMALL_BUFFER, SMALL_BUFFER, 0),
                           "large_pool": (LARGE_BUFFER, LARGE_BUFFER, LARGE_BUFFER, 0),
                           "all": (22 * MiB, 22 * MiB, 22 * MiB, 0)},
        "allocation": {"small_pool": (1, 1, 2, 1), "large_pool": (1, 1, 1, 0), "all": (2, 2, 3, 1)},
        "active": {"small_pool": (1, 1, 2, 1), "large_pool": (1, 1, 1, 0), "all": (2, 2, 3, 1)},
        "active_bytes": {"small_pool": (512, 1024, 1536, 1024), "large_pool": (3 * MiB, 3 * MiB, 3 * MiB, 0),
                         "all": (3 * MiB + 512, 3 * MiB + 1024, 3 * MiB + 1536, 1024)},
        "segment": {"small_pool": (1, 1, 1, 0), "large_pool": (1, 1, 1, 0), "all": (2, 2, 2, 0)},
        "inactive_split_bytes": {
            "small_pool": (SMALL_BUFFER - 512, SMALL_BUFFER - 512, r_small + SMALL_BUFFER - 512, r_small),
            "large_pool": (17 * MiB, 17 * MiB, 17 * MiB, 0),
            "all": (17 * MiB + SMALL_BUFFER - 512, 17 * MiB + SMALL_BUFFER - 512,
                    17 * MiB + r_small + SMALL_BUFFER - 512, r_small)},
        "inactive_split": {"small_pool": (1, 1, 2, 1), "large_pool": (1, 1, 1, 0), "all": (2, 2, 3, 1)},
    }
    for name, pools in expect.items():
        for pool, (cur, peak, allocated, freed) in pools.items():
            got = tuple(s[f"{name}.{pool}.{m}"] for m in ("current", "peak", "allocated", "freed"))
            assert got == (cur, peak, allocated, freed), (name, pool)
    assert {k: s[k] for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                              "num_device_free", "max_split_size")} == {
        "num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0, "num_device_alloc": 2,
        "num_device_free": 0, "max_split_size": -1}
    assert len(s) == 9 * 3 * 4 + 6

    alloc.reset_peak_stats()
    s = alloc.memory_stats()
    assert s["allocated_bytes.all.peak"] == s["allocated_bytes.all.current"] == 3 * MiB + 512
    assert s["requested_bytes.small_pool.peak"] == 512
    alloc.reset_accumulated_stats()
    alloc.free(c)
    s = alloc.memory_stats()
    assert s["allocated_bytes.small_pool.allocated"] == 0
    assert s["allocated_bytes.small_pool.freed"] == 512
    assert s["allocated_bytes.all.current"] == 3 * MiB
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 512
    assert s["active.all.freed"] == 1 and s["active.all.allocated"] == 0
    assert s["segment.all.allocated"] == 0 and s["num_device_alloc"] == 0


# ---------------------------------------------------------------------------
# native backend, configuration
# ---------------------------------------------------------------------------

def test_native_allocator(dev: FakeDevice) -> None:
    al = make_allocator(dev.raw_alloc, dev.raw_free, conf="backend:native", **dev.kwargs())
    assert type(al) is NativeAllocator
    a = al.malloc(1000, "A")
    assert (a.size, a.offset, a.requested) == (1000, 0, 1000)
    al.free(a)
    b = al.malloc(1000, "A")
    assert dev.calls == [("alloc", 1000), ("free", a.handle.id), ("alloc", 1000)]
    assert b.handle is not a.handle
    al.record_stream(b, "B")
    al.free(b)
    assert dev.frees() == [a.handle.id]             # waits for B
    s = al.memory_stats()
    assert (s["allocated_bytes.all.current"], s["active_bytes.all.current"],
            s["reserved_bytes.all.current"]) == (0, 1000, 1000)
    dev.complete("B")
    al.malloc(0)
    al.malloc(2 * MiB)
    assert dev.frees() == [a.handle.id, b.handle.id]
    s = al.memory_stats()
    assert s["allocation.all.allocated"] == 3 and s["num_device_alloc"] == 3 and s["num_device_free"] == 2
    assert s["reserved_bytes.large_pool.current"] == 2 * MiB
    assert [x["blocks"] for x in al.snapshot()] == [[(0, 2 * MiB, "active_allocated")]]
    with pytest.raises(InvalidArgumentError, match="double free"):
        al.free(b)
    dev.capacity = dev.used + MiB
    with pytest.raises(OutOfMemoryError) as info:
        al.malloc(2 * MiB)
    assert info.value.requested == 2 * MiB and al.memory_stats()["num_ooms"] == 1


def test_make_allocator_reads_environment(dev: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYCHIP_ALLOC_CONF", "backend:native")
    assert type(make_allocator(dev.raw_alloc, dev.raw_free)) is NativeAllocator
    monkeypatch.setenv("ANYCHIP_ALLOC_CONF", "max_split_size_mb:64")
    al = make_allocator(dev.raw_alloc, dev.raw_free)
    assert type(al) is CachingAllocator and al.conf.max_split_size == 64 * MiB
    monkeypatch.delenv("ANYCHIP_ALLOC_CONF")
    assert make_allocator(dev.raw_alloc, dev.raw_free).conf == AllocatorConf()
    monkeypatch.setenv("ANYCHIP_ALLOC_CONF", "max_split_size:64")
    with pytest.raises(InvalidArgumentError, match="max_split_size:64"):
        make_allocator(dev.raw_alloc, dev.raw_free)


@pytest.mark.parametrize("text, expect", [
    (None, AllocatorConf()),
    ("", AllocatorConf()),
    ("backend:native", AllocatorConf(backend="native")),
    ("backend:caching", AllocatorConf()),
    ("max_split_size_mb:64,garbage_collection_threshold:0.8",
     AllocatorConf(max_split_size=64 * MiB, garbage_collection_threshold=0.8)),
    (" max_split_size_mb : 21 , garbage_collection_threshold:0.5 ",
     AllocatorConf(max_split_size=21 * MiB, garbage_collection_threshold=0.5)),
    ("roundup_power2_divisions:1", AllocatorConf()),
    ("roundup_power2_divisions:8", AllocatorConf(roundup_power2_divisions=(8,) * 16)),
    ("roundup_power2_divisions:[256:1,512:2,1024:4,>:8],max_split_size_mb:100",
     AllocatorConf(max_split_size=100 * MiB, roundup_power2_divisions=(1,) * 8 + (2, 4) + (8,) * 6)),
])
def test_conf_parse(text: str | None, expect: AllocatorConf) -> None:
    assert AllocatorConf.parse(text) == expect


@pytest.mark.parametrize("text, item", [
    ("max_split_size_mb:abc", "max_split_size_mb:abc"),
    ("max_split_size_mb:20", "max_split_size_mb:20"),
    ("max_split_size_mb:64,garbage_collection_threshold:1.0", "garbage_collection_threshold:1.0"),
    ("garbage_collection_threshold:0", "garbage_collection_threshold:0"),
    ("garbage_collection_threshold:x", "garbage_collection_threshold:x"),
    ("backend:cudaMallocAsync", "backend:cudaMallocAsync"),
    ("expandable_segments:True", "expandable_segments:True"),
    ("max_split_size_mb", "max_split_size_mb"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions:3"),
    ("roundup_power2_divisions:[256:3]", "roundup_power2_divisions:[256:3]"),
    ("roundup_power2_divisions:[512:2,256:1]", "roundup_power2_divisions:[512:2,256:1]"),
    ("roundup_power2_divisions:[256:1", "roundup_power2_divisions:[256:1"),
    ("backend:native,backend:caching", "backend:caching"),
    ("max_split_size_mb:\uff16\uff14", "max_split_size_mb:\uff16\uff14"),      # full-width digits
    ("max_split_size_mb:64_0", "max_split_size_mb:64_0"),
    ("max_split_size_mb:+64", "max_split_size_mb:+64"),
    ("garbage_collection_threshold:0_5", "garbage_collection_threshold:0_5"),
    ("garbage_collection_threshold:\uff10.\uff15", "garbage_collection_threshold:\uff10.\uff15"),
    ("garbage_collection_threshold:5e-1", "garbage_collection_threshold:5e-1"),
    ("roundup_power2_divisions:\u0664", "roundup_power2_divisions:\u0664"),   # Arabic-Indic 4
    ("roundup_power2_divisions:[256:1,256:2]", "roundup_power2_divisions:[256:1,256:2]"),
    ("roundup_power2_divisions:[256:1,>:2,>:4]", "roundup_power2_divisions:[256:1,>:2,>:4]"),
])
def test_conf_parse_errors(text: str, item: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        AllocatorConf.parse(text)
    msg = str(info.value)
    assert repr(item) in msg, msg
    assert "ANYCHIP_ALLOC_CONF" in msg
    for key in AllocatorConf.KEYS:
        assert key in msg
    assert "example: ANYCHIP_ALLOC_CONF=max_split_size_mb:64" in msg


@pytest.mark.parametrize("text, why", [
    ("max_split_size_mb:64_0", "'64_0' is not an integer number of MiB (plain digits 0-9)"),
    ("roundup_power2_divisions:[256:1,256:2]", "bound '256' is given twice"),
    ("max_split_size_mb:64,max_split_size_mb:64", "max_split_size_mb is given twice"),
])
def test_conf_parse_error_reasons(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(why)):
        AllocatorConf.parse(text)


def test_block_has_slots(alloc: CachingAllocator) -> None:
    b = alloc.malloc(10)
    assert isinstance(b, Block) and not hasattr(b, "__dict__")
    with pytest.raises(AttributeError):
        b.foo = 1


def test_no_raw_calls_in_steady_state(dev: FakeDevice, alloc: CachingAllocator) -> None:
    sizes = [512, 3000, 64 * KiB, SMALL_SIZE, 3 * MiB, 64 * MiB, 100]
    for _ in range(3):
        live = [alloc.malloc(n, s) for n in sizes for s in ("A", "B")]
        for b in reversed(live):
            alloc.free(b)
    n = len(dev.calls)
    for _ in range(5):
        live = [alloc.malloc(n, s) for n in sizes for s in ("A", "B")]
        for b in live:
            alloc.free(b)
    assert len(dev.calls) == n
    assert MIN_BLOCK_SIZE == 512


# ---------------------------------------------------------------------------
# property test: random operations, invariants after every step
# ---------------------------------------------------------------------------

STREAMS = (None, "s1", "s2")
SIZES = st.one_of(
    st.integers(0, 4 * KiB),
    st.integers(1, 2 * SMALL_SIZE),
    st.sampled_from([512, 1024, 4096, SMALL_SIZE, SMALL_SIZE + 1, 5 * MiB, 10 * MiB, 11 * MiB, 21 * MiB,
                     24 * MiB, 30 * MiB]),
)


class AllocatorMachine(RuleBasedStateMachine):
    conf: str | None = None
    events = True
    capacity = 44 * MiB

    def __init__(self) -> None:
        super().__init__()
        self.dev = FakeDevice(capacity=self.capacity, events=self.events)
        self.al = self.dev.allocator(self.conf)
        self.live: dict[int, Block] = {}       # id(block) -> block

    blocks = Bundle("blocks")

    @rule(target=blocks, size=SIZES, stream=st.sampled_from(STREAMS))
    def malloc(self, size: int, stream: object) -> Block | None:
        try:
            b = self.al.malloc(size, stream)
        except OutOfMemoryError as e:
            assert e.requested == size
            return None
        assert b.requested == size and b.size >= size and b.stream == stream
        assert id(b) not in self.live
        self.live[id(b)] = b
        return b

    @rule(block=consumes(blocks))
    def free(self, block: Block | None) -> None:
        if block is None:
            return
        self.al.free(block)
        del self.live[id(block)]

    @rule(block=consumes(blocks))
    def free_then_realloc_same_stream(self, block: Block | None) -> None:
        if block is None or block.size == 0 or block._uses is not None:
            return
        n_alloc = len(self.dev.allocs())
        size, stream = block.requested, block.stream
        self.free(block)
        again = self.al.malloc(size, stream)        # freed memory is reused at once
        assert len(self.dev.allocs()) == n_alloc
        self.al.free(again)

    @rule(block=blocks, stream=st.sampled_from(STREAMS))
    def record_stream(self, block: Block | None, stream: object) -> None:
        if block is not None and id(block) in self.live:
            self.al.record_stream(block, stream)

    @rule(data=st.data())
    def complete_events(self, data: st.DataObject) -> None:
        pending = [e for e in self.dev.events if not e.done]
        if pending:
            for e in data.draw(st.lists(st.sampled_from(pending), max_size=len(pending))):
                e.done = True

    @rule()
    def empty_cache(self) -> None:
        self.al.empty_cache()

    @rule(stream=st.sampled_from(STREAMS))
    def retire_stream(self, stream: object) -> None:
        # as Stream.destroy: the stream's work is complete first
        for e in self.dev.events:
            if e.stream == stream:
                e.done = True
        self.al.retire_stream(stream)
        assert stream not in self.al._small and stream not in self.al._large
        assert all(b._uses is None or stream not in b._uses for b in self.live.values())

    @rule()
    def synchronize(self) -> None:
        self.al.synchronize_and_free_events()

    @invariant()
    def consistent(self) -> None:
        al, dev = self.al, self.dev
        s = al.memory_stats()
        live = [b for b in self.live.values() if b.size]
        # no two live blocks overlap, each lies inside its segment
        by_handle: dict[int, list[Block]] = {}
        for b in live:
            assert b.handle.id in dev.live
            assert 0 <= b.offset and b.offset + b.size <= b.handle.size
            by_handle.setdefault(b.handle.id, []).append(b)
        for bs in by_handle.values():
            bs.sort(key=lambda b: b.offset)
            for x, y in itertools.pairwise(bs):
                assert x.offset + x.size <= y.offset
        assert s["allocated_bytes.all.current"] == sum(b.size for b in live)
        assert s["requested_bytes.all.current"] == sum(b.requested for b in live)
        assert s["allocation.all.current"] == len(live)
        self._check_segments(s)
        self._check_totals(s)
        self._check_free_lists()

    def _check_segments(self, s: dict) -> None:
        al, dev = self.al, self.dev
        # reserved == segments held == what the fake device has handed out
        snap = al.snapshot()
        assert s["reserved_bytes.all.current"] == sum(x["total_size"] for x in snap) == dev.used
        assert s["segment.all.current"] == len(snap) == len(dev.live)
        pending = isb = isc = 0
        for seg in snap:
            blocks = seg["blocks"]
            assert blocks[0][0] == 0 and sum(size for _, size, _ in blocks) == seg["total_size"]
            for (o1, s1, _), (o2, _, _) in itertools.pairwise(blocks):
                assert o1 + s1 == o2
            pending += sum(size for _, size, state in blocks if state == "active_pending_free")
            if len(blocks) > 1:
                isb += sum(size for _, size, state in blocks if state == "inactive")
                isc += sum(1 for _, _, state in blocks if state == "inactive")
        assert s["active_bytes.all.current"] == s["allocated_bytes.all.current"] + pending
        assert s["inactive_split_bytes.all.current"] == isb
        assert s["inactive_split.all.current"] == isc

    def _check_totals(self, s: dict) -> None:
        # pools add up, peaks bound the current values, totals are consistent
        for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation",
                     "segment", "active", "inactive_split", "inactive_split_bytes"):
            for m in ("current", "allocated", "freed"):
                assert s[f"{name}.all.{m}"] == s[f"{name}.small_pool.{m}"] + s[f"{name}.large_pool.{m}"]
            for pool in ("all", "small_pool", "large_pool"):
                cur, peak = s[f"{name}.{pool}.current"], s[f"{name}.{pool}.peak"]
                assert 0 <= cur <= peak
                assert s[f"{name}.{pool}.allocated"] - s[f"{name}.{pool}.freed"] == cur

    def _check_free_lists(self) -> None:
        al = self.al
        # every free block sits in one list, sorted by size, and adjacent free blocks of one list are merged
        listed = set()
        for fl in [*al._small.values(), *al._large.values(), al._any_small, al._any_large]:
            blocks = fl.blocks()
            assert [b.size for b in blocks] == sorted(b.size for b in blocks)
            for b in blocks:
                assert b._fl is fl and b._state == FREE and id(b) not in listed
                assert bool(fl.small) == (b.handle.size == SMALL_BUFFER)      # the pool of its segment
                listed.add(id(b))
        n_free = 0
        for head in al._segments:
            b = head
            assert b.prev is None
            while b is not None:
                n_free += b._state == FREE
                n = b.next
                if n is not None:
                    assert n.prev is b
                    if b._state == FREE and n._state == FREE:
                        assert b._fl is not n._fl, "adjacent free blocks of one list not merged"
                b = n
        assert n_free == len(listed)


class AllocatorMachineConf(AllocatorMachine):
    conf = "garbage_collection_threshold:0.6,roundup_power2_divisions:[2:4,>:2],max_split_size_mb:21"


class AllocatorMachineNoEvents(AllocatorMachine):
    events = False


_settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = _settings
TestAllocatorMachineConf = AllocatorMachineConf.TestCase
TestAllocatorMachineConf.settings = _settings
TestAllocatorMachineNoEvents = AllocatorMachineNoEvents.TestCase
TestAllocatorMachineNoEvents.settings = _settings
