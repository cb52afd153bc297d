"""Caching device-memory allocator: the policy of PyTorch's CUDACachingAllocator
(and CuPy's MemoryPool) over any backend's raw ``alloc``/``free``.

The allocator never imports a backend. It is given the raw calls::

    raw_alloc(nbytes) -> handle      # raises OutOfMemoryError when the device is full
    raw_free(handle)
    mem_info() -> (free, total)      # optional
    event_record(stream) -> event    # optional, with event_query(event) -> bool,
    event_synchronize(event), event_destroy(event)

Handles are opaque (an int pointer, a ``cl.Buffer``, a numpy array...): a
:class:`Block` is ``(handle, offset, size)`` inside one raw segment. Stream tokens
are opaque hashable objects (``None`` included). ``raw_free`` may be called while
work that used the segment is still queued (cudaFree synchronizes, OpenCL defers
the release): the backend must make that safe. Thread-safe.

Policy (constants below, as in PyTorch):

* requests are rounded up to ``MIN_BLOCK_SIZE`` (512) bytes, or to a power-of-two
  division with ``roundup_power2_divisions``;
* requests of at most ``SMALL_SIZE`` (1 MiB) use the small pool, whose segments
  are ``SMALL_BUFFER`` (2 MiB); larger ones use the large pool, with segments of
  ``LARGE_BUFFER`` (20 MiB) for requests under ``MIN_LARGE_ALLOC`` (10 MiB), else
  the request rounded up to ``ROUND_LARGE`` (2 MiB);
* best fit per (pool, stream): free blocks sit in stacks of one size (last freed,
  first out) over an array of sizes searched by bisection; a block found is split
  when the rest is >= 512 bytes (small pool) or > 1 MiB (large pool, and only for
  requests below ``max_split_size``); blocks of ``max_split_size`` or more are
  never split and serve only requests of at least ``max_split_size`` that waste
  less than ``LARGE_BUFFER``;
* on free a block coalesces with the address-adjacent free blocks of its list.

Streams. A block freed on stream A goes back to A's free list and is reused on
A at once. A free block whose stream's work is known to be complete belongs to
*no stream*: it sits in the pool's stream-less list, where it coalesces with its
neighbours and serves any stream. A request on B looks in B's list, then in the
stream-less list; when both miss, the allocator records, for each other stream A
of that pool with free blocks (at most one outstanding per A), an event on A and
marks A's free blocks. Pending events are polled at the start of every
``malloc`` while some are pending. When A's event has completed, the marked
blocks that A did not reuse or merge meanwhile (each of those clears the mark)
move to the stream-less list. ``record_stream(block, B)``: when the block is
freed, an event is recorded on every such extra stream, and the block returns to
its list only when all of them have completed (it counts as active, not
allocated, meanwhile). ``synchronize_and_free_events()`` (the device is idle)
waits for every event and makes every free block stream-less, so a segment whose
blocks were freed on several streams coalesces again; ``retire_stream(s)`` (a
stream being destroyed, after its work) does the same for one stream's blocks,
and blocks of ``s`` still in use go to the stream-less list when freed.

Without event functions, blocks never cross streams by themselves: a
``record_stream``-ed block waits for :meth:`synchronize_and_free_events`, which
the caller must call only when the device is idle (device synchronize).

Out of memory, in order: (1) completed events have already released their blocks
(polled at each ``malloc``; a miss also starts cross-stream moves and takes those
already done); (2) with ``garbage_collection_threshold``, when reserved >
threshold * total (``mem_info``), unused cached segments are freed, oldest first,
until reserved <= threshold * total, before a new segment is requested;
(3) when ``raw_alloc`` raises ``OutOfMemoryError``: ``num_alloc_retries += 1``,
every pending event is synchronized (``event_synchronize``;
``num_sync_all_streams += 1``), other streams' free blocks of the pool become
stream-less (events recorded and synchronized), the lists are searched again,
then every unused cached segment is returned (``raw_free``, oldest first) and
``raw_alloc`` is retried once; (4) then ``num_ooms += 1`` and
``OutOfMemoryError(requested, free, total, stats, device=name)`` is raised,
picklable, with the backend's code and code name. A request of ``MAX_REQUEST``
bytes (2**62) or more raises ``OutOfMemoryError`` at once, naming the size.

An unused cached segment is one whose blocks are all free, whatever lists they
sit in: ``empty_cache()`` waits for pending events and returns every one.

Statistics (``alloc_stats``) are PyTorch's: one ``Stat`` (current, peak,
allocated, freed) per kind and pool, kept by the compiled core.

Zero-byte requests return a ``Block`` of size 0 with handle ``None`` that takes no
memory and does not count in the statistics; it must still be freed once.
``free`` of anything that is not a block allocated here and not yet freed (a
double free, a block of another allocator, another object) raises
``InvalidArgumentError`` and changes nothing. A block object merged away is
reused only when nothing outside the allocator holds it.

Implementation. The data structures (blocks, free lists, statistics) and the
cached ``malloc`` / ``free`` are compiled (``csrc/alloc/core.c``, the extension
``anychip._lib._alloc``), as CuPy's pool is Cython; a cached pair never leaves C.
This module is the rest of the policy, reached when the cached path steps aside
(a miss, pending events, a block to wait for, an odd size, another thread in the
slow path) and calling the same compiled operations (``_lookup``, ``_take``,
``_insert_free``...). The cached path needs no lock: it holds the GIL and runs no
Python code; the slow path takes ``_lock`` and sets ``_busy``, which sends the
cached path to the slow path meanwhile. A finalizer's free that finds the lock
taken is queued and done when the holder leaves.

Where the time goes, on a cached pair through ``Device.alloc`` + ``Buffer.free``
(512 bytes split from a free 2 MiB segment and merged back), medians of
interleaved rounds on the 2-core development machine under load (Python 3.11,
cpu:0), beside a NumPy ``np.empty(512)`` + ``del`` pair at 0.23 µs:

* 0.13 µs  the compiled malloc + free, called from Python (best fit by binary
  search, split, merge, five statistics per call, each for its pool and "all");
* 0.06 µs  the Buffer made, freed and dropped (also compiled: no Python
  ``__del__``);
* 0.16 µs  ``Device.alloc``'s Python frame: size and stream checks, the call;
* 0.08 µs  without ``stream=``, the thread-local current-stream lookup.

About 0.36 µs with ``stream=`` (1.6x NumPy's pair), 0.43 µs without; it was
2.3 µs before the core was compiled. ``benchmarks/bench_allocator.py`` reports
the pair and NumPy's in one run.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from operator import index as _as_index
from typing import Any

try:
    from .._lib._alloc import ALLOCATED, FREE, PENDING, ZERO, Block, BufferBase, Core, FreeList, register_buffer, view
    from .._lib._alloc import round_size as _round_size
except ImportError as exc:      # a source tree that was not built
    raise ImportError(f"anychip's compiled allocator core is missing ({exc}); build it with "
                      "`pip install -e .` (or `ci/test`), which compiles csrc/") from exc
from .alloc_conf import ENV_VAR, AllocatorConf
from .alloc_stats import COUNTERS, Kind, stats_dict
from .env import alloc_conf
from .errors import InvalidArgumentError, OutOfMemoryError

__all__ = [
    "AllocatorConf",
    "BufferBase",
    "register_buffer",
    "view",
    "Block",
    "CachingAllocator",
    "NativeAllocator",
    "make_allocator",
    "round_size",
    "segment_size",
    "ENV_VAR",
    "MIN_BLOCK_SIZE",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "MAX_REQUEST",
]

MIN_BLOCK_SIZE = 512            # every block size is a multiple of this
SMALL_SIZE = 1 << 20            # requests up to this size use the small pool
SMALL_BUFFER = 2 << 20          # segment size of the small pool
LARGE_BUFFER = 20 << 20         # segment size for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20      # from this size a large request gets its own rounded segment
ROUND_LARGE = 2 << 20           # rounding of those segments
MAX_REQUEST = 1 << 62           # no device holds this: refused at once with OutOfMemoryError

_STATE_NAMES = {ALLOCATED: "active_allocated", PENDING: "active_pending_free", FREE: "inactive"}


def round_size(nbytes: int, divisions: tuple[int, ...] | None = None) -> int:
    """Size of the block that serves a request of ``nbytes`` (>= 1) bytes."""
    return _round_size(nbytes, divisions)


def segment_size(size: int) -> int:
    """Size of the raw segment made for a (rounded) request of ``size`` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def _list_of(block: Block) -> FreeList:
    """The list a block is in (free) or returns to (allocated, pending)."""
    fl = block._fl
    assert fl is not None, block
    return fl


def _is_split(block: Block) -> bool:
    return block.prev is not None or block.next is not None


class _Migration:
    """Free blocks of the list ``src`` that belong to no stream once ``event`` has completed."""

    __slots__ = ("src", "event", "blocks")

    def __init__(self, src: FreeList, event: Any) -> None:
        self.src = src
        self.event = event
        self.blocks = src.blocks()
        for b in self.blocks:
            b._mig = self


# ---------------------------------------------------------------------------
# common part of both allocators
# ---------------------------------------------------------------------------

class _AllocatorBase(Core):
    __slots__ = ("name", "conf", "_raw_alloc", "_raw_free", "_mem_info", "_event_record", "_event_query",
                 "_event_synchronize", "_event_destroy", "_lock", "_pending", "_later", "_users", "_abandoned",
                 *COUNTERS, "__weakref__")

    def __init__(self, raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None], *,
                 mem_info: Callable[[], tuple[int, int] | None] | None = None,
                 event_record: Callable[[Any], Any] | None = None,
                 event_query: Callable[[Any], bool] | None = None,
                 event_synchronize: Callable[[Any], None] | None = None,
                 event_destroy: Callable[[Any], None] | None = None,
                 name: str = "device", conf: AllocatorConf | str | None = None) -> None:
        if (event_record is None) != (event_query is None):
            raise InvalidArgumentError("event_record and event_query must be given together")
        if conf is None or isinstance(conf, str):
            conf = AllocatorConf.parse(conf)
        self.name = name
        self.conf = conf
        self._raw_alloc = raw_alloc
        self._raw_free = raw_free
        self._mem_info = mem_info
        self._event_record = event_record
        self._event_query = event_query
        self._event_synchronize = event_synchronize
        self._event_destroy = event_destroy
        self._lock = threading.Lock()
        self._pending: dict[Any, deque] = {}   # stream -> FIFO of (event, Block | _Migration)
        self._later: list[Block] = []          # record_stream-ed blocks when there are no events
        self._users: dict[Any, int] = {}       # stream -> live blocks that record_stream named it for
        self._abandoned: str | None = None     # why this allocator's memory is unusable (see abandon)
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0     # COUNTERS
        self.num_device_alloc = self.num_device_free = 0
        self._configure(1 << 62 if conf.max_split_size is None else conf.max_split_size,
                        conf.roundup_power2_divisions)

    def __repr__(self) -> str:
        s = stats_dict(self._stat_values())
        return (f"<{type(self).__name__} {self.name}: {s['allocated_bytes.all.current']} bytes allocated, "
                f"{s['reserved_bytes.all.current']} reserved in {s['segment.all.current']} segments>")

    def abandon(self, why: str) -> None:
        """This allocator's memory is unusable from now on (e.g. in a process forked
        after it was made): malloc and an explicit free raise InvalidArgumentError
        saying ``why``, a finalizer's free does nothing, and neither touches the lock
        (another thread may have held it at the fork)."""
        self._abandoned = why
        self._cached_path = 0

    def _refuse(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{what} on {self.name}: {self._abandoned}")

    # -- locking ----------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock.acquire()
        self._busy += 1
        try:
            yield
        finally:
            self._unlock()

    def _unlock(self) -> None:
        """Leave the slow path: first free what finalizers queued meanwhile."""
        try:
            while self._deferred:
                with suppress(InvalidArgumentError):
                    self._free_locked(self._deferred.pop())
        finally:
            self._busy -= 1
            self._lock.release()

    def _list(self, stream: Any, small: bool) -> FreeList:
        lists = self._small if small else self._large
        fl = lists.get(stream)
        if fl is None:
            fl = lists[stream] = FreeList(stream, small)
        return fl

    # -- malloc -----------------------------------------------------------
    def _malloc_slow(self, nbytes: Any, stream: Any) -> Block:
        """malloc when the compiled cached path steps aside."""
        if self._abandoned:
            raise self._refuse("malloc")
        if nbytes.__class__ is not int or nbytes <= 0:
            nbytes = self._check_size(nbytes)
            if not nbytes:
                block = self._new_block(None, 0, 0, stream, None)
                block._state = ZERO
                return block
        with self._locked():
            if nbytes >= MAX_REQUEST:
                raise self._oom(nbytes, nbytes, None, "no device can hold it")
            if self._npending:
                self._process_events()
            return self._malloc_locked(nbytes, stream)

    @staticmethod
    def _check_size(nbytes: Any) -> int:
        if isinstance(nbytes, (bool, float)):
            raise InvalidArgumentError(f"allocation size must be an integer, got {nbytes!r}")
        try:
            n = _as_index(nbytes)
        except TypeError:
            raise InvalidArgumentError(f"allocation size must be an integer, got {nbytes!r}") from None
        if n < 0:
            raise InvalidArgumentError(f"allocation size must be >= 0, got {n}")
        return n

    def _malloc_locked(self, nbytes: int, stream: Any) -> Block:
        raise NotImplementedError

    def _before_retry(self) -> None:
        """raw_alloc failed: wait for every event, so that what they held is free."""
        self.num_alloc_retries += 1
        self._sync_events()

    def _raw_alloc_again(self, nbytes: int, seg: int) -> Any:
        """The last raw_alloc of a request; OutOfMemoryError with the statistics if it fails."""
        try:
            return self._raw_alloc(seg)
        except OutOfMemoryError as exc:
            raise self._oom(nbytes, seg, exc) from exc

    # -- free -------------------------------------------------------------
    def _free_slow(self, block: Any, explicit: bool = True) -> None:
        """free when the compiled path steps aside. A finalizer (``explicit=False``)
        never blocks: when the lock is taken the block is freed by its holder."""
        if self._abandoned:
            if explicit:
                raise self._refuse("free()")
            return
        if not self._lock.acquire(explicit):
            self._deferred.append(block)
            return
        self._busy += 1
        try:
            self._free_locked(block)
        finally:
            self._unlock()

    def _free_locked(self, block: Any) -> None:
        if not isinstance(block, Block):
            raise InvalidArgumentError(f"free() on {self.name} expects a Block, got {type(block).__name__}")
        if not self._owns(block):
            raise InvalidArgumentError(f"free() on {self.name} of {block!r}, which belongs to another allocator")
        state = block._state
        if state == ZERO:
            block._state = FREE
        elif state == PENDING:
            raise InvalidArgumentError(
                f"double free on {self.name}: {block!r} was already freed (its memory waits for other streams)")
        elif state == FREE:
            raise InvalidArgumentError(f"double free on {self.name}: {block!r} is not allocated")
        else:
            self._unallocate(block)
            if block._uses is not None:
                self._free_later(block)
            else:
                self._release_pending(block)

    def _release_pending(self, block: Block) -> None:
        """A freed block nothing waits for any more: free for reuse."""
        raise NotImplementedError

    # -- record_stream / events -------------------------------------------
    def record_stream(self, block: Block, stream: Any) -> None:
        """``block`` is also used on ``stream``: once freed, it is reused only after
        the work enqueued on ``stream`` up to the free has completed."""
        state = block._state if isinstance(block, Block) and self._owns(block) else None
        if state not in (ALLOCATED, ZERO):
            raise InvalidArgumentError(f"record_stream on {self.name} needs a block allocated there and "
                                       f"not freed, got {block!r}")
        if state == ZERO or stream == block.stream:
            return
        with self._locked():
            uses = block._uses
            if uses is None:
                uses = block._uses = set()
            if stream not in uses:
                uses.add(stream)
                self._users[stream] = self._users.get(stream, 0) + 1

    def _drop_user(self, stream: Any) -> None:
        n = self._users.pop(stream) - 1
        if n:
            self._users[stream] = n

    def _free_later(self, block: Block) -> None:
        """A freed block also used on other streams: reusable when their events complete."""
        uses = block._uses
        assert uses is not None
        block._uses = None
        if self._event_record is None:
            for s in uses:
                self._drop_user(s)
            self._later.append(block)
            return
        for s in uses:
            self._drop_user(s)
            self._pend(s, self._event_record(s), block)
        block._npend = len(uses)

    def _pend(self, stream: Any, event: Any, target: Block | _Migration) -> None:
        q = self._pending.get(stream)
        if q is None:
            q = self._pending[stream] = deque()
        q.append((event, target))
        self._npending += 1

    def _event_done(self, target: Block | _Migration) -> None:
        if isinstance(target, _Migration):
            self._migration_done(target)
        else:
            target._npend -= 1
            if not target._npend:
                self._release_pending(target)

    def _migration_done(self, mig: _Migration) -> None:
        pass

    def _finish(self, stream: Any, q: deque, wait: bool) -> None:
        """Release what the events of ``q`` held, in order: all of them (``wait``)
        or up to the first not yet complete."""
        query, sync, destroy = self._event_query, self._event_synchronize, self._event_destroy
        assert query is not None            # something is pending only where there are events
        while q:
            ev, target = q[0]
            if wait:
                if sync is not None:
                    sync(ev)
                else:
                    while not query(ev):
                        time.sleep(1e-5)
            elif not query(ev):
                break
            q.popleft()
            self._npending -= 1
            if destroy is not None:
                destroy(ev)
            self._event_done(target)
        if not q and self._pending.get(stream) is q:
            del self._pending[stream]

    def _process_events(self) -> None:
        """Release what completed events were holding (per stream, in order)."""
        for s, q in list(self._pending.items()):
            self._finish(s, q, False)

    def _wait_events(self) -> None:
        while self._pending:
            s, q = next(iter(self._pending.items()))
            self._finish(s, q, True)

    def _sync_events(self) -> None:
        """Wait for every pending event and release what they were holding."""
        self.num_sync_all_streams += 1
        self._wait_events()

    def synchronize_and_free_events(self) -> None:
        """Wait for all pending events and release the blocks they held; the device
        is idle (call it only after a device synchronize), so every free block
        now belongs to no stream."""
        with self._locked():
            self._sync_events()
            later, self._later = self._later, []
            for b in later:
                self._release_pending(b)
            self._idle()

    def _idle(self) -> None:
        pass

    def retire_stream(self, stream: Any) -> None:
        """``stream`` is about to be destroyed and its work is complete: wait for the
        events recorded on it, make its free blocks stream-less, forget it as an
        extra user of live blocks; its blocks still in use become stream-less when freed."""
        if not (stream in self._small or stream in self._large or stream in self._pending or stream in self._users):
            return      # nothing here refers to it (a finalizer's destroy must not wait for the lock)
        with self._locked():
            q = self._pending.get(stream)
            if q is not None:
                self._finish(stream, q, True)
            for small in (True, False):
                fl = (self._small if small else self._large).pop(stream, None)
                if fl is not None:
                    fl.retired = True
                    self._make_streamless(fl)
            for b in self._blocks() if stream in self._users else ():
                if b._uses is not None and stream in b._uses:
                    b._uses.discard(stream)
                    self._drop_user(stream)
                    if not b._uses:
                        b._uses = None

    def _make_streamless(self, fl: FreeList) -> None:
        pass

    def _blocks(self) -> Iterator[Block]:
        raise NotImplementedError

    # -- statistics -------------------------------------------------------
    def _memory_stats(self) -> dict[str, int]:
        out = stats_dict(self._stat_values())
        for counter in COUNTERS:
            out[counter] = getattr(self, counter)
        ms = self.conf.max_split_size
        out["max_split_size"] = -1 if ms is None else ms
        return out

    def memory_stats(self) -> dict[str, int]:
        """Statistics with PyTorch's dotted names, e.g. ``allocated_bytes.all.current``."""
        with self._locked():
            return self._memory_stats()

    def reset_peak_stats(self) -> None:
        with self._locked():
            self._reset_peaks()

    def reset_accumulated_stats(self) -> None:
        with self._locked():
            self._reset_accumulated()
            for counter in COUNTERS:
                setattr(self, counter, 0)

    def _new_segment_stats(self, small: bool, seg: int, sign: int) -> None:
        self._stat(Kind.RESERVED_BYTES, small, sign * seg)
        self._stat(Kind.SEGMENT, small, sign)
        if sign > 0:
            self.num_device_alloc += 1
        else:
            self.num_device_free += 1

    # -- out of memory ----------------------------------------------------
    def _device_mem(self) -> tuple[int | None, int | None]:
        if self._mem_info is None:
            return None, None
        try:
            info = self._mem_info()
        except Exception:  # noqa: BLE001 - the report goes on without the figures
            return None, None
        if not info:
            return None, None
        return int(info[0]), int(info[1])

    def _oom(self, nbytes: int, seg: int, exc: OutOfMemoryError | None, why: str = "") -> OutOfMemoryError:
        self.num_ooms += 1
        free, total = self._device_mem()
        stats = self._memory_stats()
        allocated = stats["allocated_bytes.all.current"]
        reserved = stats["reserved_bytes.all.current"]
        detail = f"{seg} bytes were requested from the device"
        if why:
            detail = f"{nbytes} bytes were requested: {why}"
        if total is None:
            detail += f"; {allocated} bytes allocated, {reserved} bytes reserved by the allocator"
        if reserved > allocated:
            detail += (f"; {reserved - allocated} bytes are reserved but unallocated: if that is large, "
                       f"try {ENV_VAR}=max_split_size_mb:N against fragmentation")
        return OutOfMemoryError(nbytes, free, total, stats, device=self.name,
                                backend=getattr(exc, "backend", None), code=getattr(exc, "code", None),
                                code_name=getattr(exc, "code_name", None), detail=detail)


# ---------------------------------------------------------------------------
# the caching allocator
# ---------------------------------------------------------------------------

class CachingAllocator(_AllocatorBase):
    """Caching allocator (see the module docstring for the policy). ``malloc`` and
    ``free`` are the compiled core's."""

    __slots__ = ("_segments",)

    def __init__(self, raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None], **kw: Any) -> None:
        super().__init__(raw_alloc, raw_free, **kw)
        self._segments: dict[Block, tuple[int, bool, Any]] = {}   # head block -> (size, small, stream)

    def _malloc_locked(self, nbytes: int, stream: Any) -> Block:
        size = self._round(nbytes)
        fl = self._list(stream, size <= SMALL_SIZE)
        block = self._lookup(fl, size)
        if block is None and self._cross_stream(fl):
            block = self._lookup(fl, size)
        if block is None:
            block = self._new_segment(fl, nbytes, size)
        return self._take(fl, block, nbytes, size)

    def _new_segment(self, fl: FreeList, nbytes: int, size: int) -> Block:
        """A new segment for the request (or, after an OOM and a sync, a cached block)."""
        seg = segment_size(size)
        if self.conf.garbage_collection_threshold is not None:
            self._garbage_collect()
        try:
            handle = self._raw_alloc(seg)
        except OutOfMemoryError:
            # every event waited for, other streams' blocks made stream-less: look again,
            # then return every unused segment and try once more
            self._before_retry()
            self._cross_stream(fl, wait=True)
            block = self._lookup(fl, size)
            if block is not None:
                return block
            self._release_cached()
            handle = self._raw_alloc_again(nbytes, seg)
        head = self._new_block(handle, 0, seg, fl.stream, fl)
        self._segments[head] = (seg, fl.small, fl.stream)
        self._new_segment_stats(fl.small, seg, 1)
        return head

    def _cross_stream(self, fl: FreeList, wait: bool = False) -> bool:
        """Start moving the free blocks of the pool's other streams to no stream (an
        event on each); finish the moves whose events are done (``wait``: all).
        True when some started."""
        if self._event_record is None:
            return False
        started = False
        for src in list((self._small if fl.small else self._large).values()):
            if src is fl or src.mig is not None or not len(src):
                continue
            src.mig = mig = _Migration(src, self._event_record(src.stream))
            self._pend(src.stream, mig.event, mig)
            started = True
        if started:
            self._wait_events() if wait else self._process_events()
        return started

    def _migration_done(self, mig: _Migration) -> None:
        src = mig.src
        if src.mig is mig:
            src.mig = None
        blocks, mig.blocks = mig.blocks, []
        for b in blocks:
            if b._mig is mig and b._state == FREE and b._fl is src:
                self._to_no_stream(b)

    def _to_no_stream(self, b: Block) -> None:
        """Move the free block ``b`` out of its list into the pool's stream-less one."""
        small = _list_of(b).small
        self._unlist(b)
        b._mig = None
        self._insert_free(b, self._any_small if small else self._any_large, _is_split(b))

    def _make_streamless(self, fl: FreeList) -> None:
        for b in fl.blocks():
            self._to_no_stream(b)

    def _idle(self) -> None:
        for lists in (self._small, self._large):
            for fl in lists.values():
                self._make_streamless(fl)

    def _release_pending(self, block: Block) -> None:
        fl = _list_of(block)
        small = fl.small
        if fl.retired:
            fl = self._any_small if small else self._any_large
        self._release(block, fl, small)

    # -- cache release ------------------------------------------------------
    def _segment_blocks(self, head: Block) -> Iterator[Block]:
        b: Block | None = head
        while b is not None:
            yield b
            b = b.next

    def _blocks(self) -> Iterator[Block]:
        for head in list(self._segments):
            yield from self._segment_blocks(head)

    def _unused_segments(self) -> list[Block]:
        """Heads of the segments whose blocks are all free, oldest first."""
        return [h for h in self._segments if all(b._state == FREE for b in self._segment_blocks(h))]

    def _release_segment(self, head: Block) -> int:
        """raw_free an unused segment (its free blocks first coalesce into one)."""
        for b in list(self._segment_blocks(head)):
            if b._fl is not None:           # not merged away by the moves before
                self._to_no_stream(b)
        seg, small, _ = self._segments.pop(head)
        self._unlist(head)
        self._raw_free(head.handle)
        self._new_segment_stats(small, seg, -1)
        return seg

    def _release_cached(self) -> int:
        """raw_free every unused segment; returns the bytes released."""
        return sum(self._release_segment(h) for h in self._unused_segments())

    def _garbage_collect(self) -> None:
        """Free unused segments, oldest first, while reserved > threshold * total."""
        _, total = self._device_mem()
        threshold = self.conf.garbage_collection_threshold
        if total is None or threshold is None:
            return
        limit = threshold * total
        reserved = stats_dict(self._stat_values())["reserved_bytes.all.current"]
        freed = 0
        for head in self._unused_segments():
            if reserved - freed <= limit:
                break
            freed += self._release_segment(head)

    def empty_cache(self) -> None:
        """Wait for pending events, then return every unused cached segment to raw_free."""
        with self._locked():
            self._sync_events()
            self._release_cached()

    # -- introspection ------------------------------------------------------
    def snapshot(self) -> list[dict]:
        """One dict per segment: handle (repr), total_size, pool, stream and
        blocks as (offset, size, state) in address order."""
        with self._locked():
            return [self._segment_info(head, *info) for head, info in self._segments.items()]

    def _segment_info(self, head: Block, seg: int, small: bool, stream: Any) -> dict:
        blocks = [(b.offset, b.size, _STATE_NAMES[b._state]) for b in self._segment_blocks(head)]
        live = [b for b in self._segment_blocks(head) if b._state == ALLOCATED]
        return {"device": self.name, "handle": repr(head.handle), "total_size": seg,
                "allocated_size": sum(b.size for b in live), "requested_size": sum(b.requested for b in live),
                "active_size": sum(size for _, size, state in blocks if state != "inactive"),
                "pool": "small" if small else "large", "stream": stream, "blocks": blocks}


# ---------------------------------------------------------------------------
# no caching
# ---------------------------------------------------------------------------

class NativeAllocator(_AllocatorBase):
    """No caching (``ANYCHIP_ALLOC_CONF=backend:native``): every malloc calls
    ``raw_alloc(nbytes)`` with the exact size, every free ``raw_free`` (after the
    events of ``record_stream``). Statistics as for the caching allocator, each
    allocation being its own segment."""

    __slots__ = ("_live",)

    def __init__(self, raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None], **kw: Any) -> None:
        super().__init__(raw_alloc, raw_free, **kw)
        self._live: dict[Block, None] = {}
        self._cached_path = 0          # malloc and free always come here

    def _malloc_locked(self, nbytes: int, stream: Any) -> Block:
        try:
            handle = self._raw_alloc(nbytes)
        except OutOfMemoryError:
            # blocks waiting for events are the only memory that can be given back
            self._before_retry()
            handle = self._raw_alloc_again(nbytes, nbytes)
        fl = self._list(stream, nbytes <= SMALL_SIZE)      # stays empty: it only names the pool and stream
        block = self._new_block(handle, 0, nbytes, stream, fl)
        self._live[block] = None
        self._new_segment_stats(fl.small, nbytes, 1)
        return self._take(fl, block, nbytes, nbytes)

    def _release_pending(self, block: Block) -> None:
        small = _list_of(block).small
        self._release(block, None, small)
        del self._live[block]
        self._raw_free(block.handle)
        self._new_segment_stats(small, block.size, -1)

    def _blocks(self) -> Iterator[Block]:
        return iter(list(self._live))

    def empty_cache(self) -> None:
        """Nothing is cached; waits for pending events and frees the blocks they held."""
        with self._locked():
            self._sync_events()

    def snapshot(self) -> list[dict]:
        out = []
        with self._locked():
            for b in self._live:
                live = b._state == ALLOCATED
                out.append({"device": self.name, "handle": repr(b.handle), "total_size": b.size,
                            "allocated_size": b.size if live else 0, "requested_size": b.requested if live else 0,
                            "active_size": b.size, "pool": "small" if b.size <= SMALL_SIZE else "large",
                            "stream": b.stream, "blocks": [(0, b.size, _STATE_NAMES[b._state])]})
        return out


def make_allocator(raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None],
                   **kw: Any) -> CachingAllocator | NativeAllocator:
    """The allocator the configuration asks for: keyword ``conf`` (an AllocatorConf
    or its text), else ``ANYCHIP_ALLOC_CONF`` from the environment."""
    conf = kw.pop("conf", None)
    if conf is None:
        conf = alloc_conf()
    elif isinstance(conf, str):
        conf = AllocatorConf.parse(conf)
    cls = NativeAllocator if conf.backend == "native" else CachingAllocator
    return cls(raw_alloc, raw_free, conf=conf, **kw)
