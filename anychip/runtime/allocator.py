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
the release): the backend must make that safe. Not thread-safe: the caller
(``Device``) serializes calls.

Policy (constants below, as in PyTorch):

* requests are rounded up to ``MIN_BLOCK_SIZE`` (512) bytes, or to a power-of-two
  division with ``roundup_power2_divisions``;
* requests of at most ``SMALL_SIZE`` (1 MiB) use the small pool, whose segments
  are ``SMALL_BUFFER`` (2 MiB); larger ones use the large pool, with segments of
  ``LARGE_BUFFER`` (20 MiB) for requests under ``MIN_LARGE_ALLOC`` (10 MiB), else
  the request rounded up to ``ROUND_LARGE`` (2 MiB);
* best fit per (pool, stream): free blocks sit in buckets of equal size (a dict
  size -> list) over a sorted list of sizes, so an exact-size hit is a dict
  lookup and any other is a bisect (O(log n)); equal sizes are reused last
  freed, first out. Empty buckets are dropped lazily;
* a block found is split when the remainder is >= 512 bytes (small pool) or
  > 1 MiB (large pool, and only for requests below ``max_split_size``); blocks of
  ``max_split_size`` or more are never split and serve only requests of at least
  ``max_split_size`` that waste less than ``LARGE_BUFFER``;
* on free a block coalesces with the address-adjacent free blocks of the same
  segment that sit in the same free list (same pool and stream).

Stream-ordered reuse. A block freed on stream A goes back to A's free list and
is reused on A at once. Stream B never takes it directly. When a request on B
misses B's list, the allocator records, for each other stream A of that pool
with free blocks (at most one outstanding per A), an event on A and marks A's
free blocks with that *migration*. Pending events are polled at the start of
every ``malloc`` (only when some are pending: one attribute test otherwise).
When A's event has completed, the marked blocks that are still untouched (A did
not reuse, split or merge them meanwhile: each of those clears the mark) move to
B's free list, where B reuses them. A can keep using its blocks while the event
is pending. ``record_stream(block, B)``: when the block is freed, an event is
recorded on every such extra stream, and the block returns to its free list only
when all of them have completed (it counts as active, not allocated, meanwhile).

Without event functions, blocks never cross streams by themselves: a
``record_stream``-ed block waits for :meth:`synchronize_and_free_events`, which in
that mode also lets any stream take every block that was free at that moment.
The caller must call it only when the device is idle (device synchronize).

Out of memory, in order: (1) completed events have already released their blocks
(polled at each ``malloc``; a miss also starts cross-stream migrations and takes
those already done); (2) with ``garbage_collection_threshold``, when reserved >
threshold * total (``mem_info``), unused cached segments are freed, oldest first,
until reserved <= threshold * total, before a new segment is requested;
(3) when ``raw_alloc`` raises ``OutOfMemoryError``: ``num_alloc_retries += 1``,
every pending event is synchronized (``event_synchronize``;
``num_sync_all_streams += 1``), other streams' free blocks of the pool move over
(events recorded and synchronized), the free list is searched again, then every
unused cached segment is returned (``raw_free``, oldest first) and ``raw_alloc``
is retried once; (4) then ``num_ooms += 1`` and
``OutOfMemoryError(requested, free, total, stats, device=name)`` is raised,
picklable, with the backend's code and code name.

Statistics use PyTorch's names (``allocated_bytes.all.current`` ...). They are
plain integer attributes updated inline (the dotted dict is built only by
``memory_stats()``); "all" values are sums of the two pools except the peaks;
"active" is "allocated" plus the blocks waiting for events; the
``allocated``/``freed`` totals come from the current value, one running total and
a base kept at reset.

Zero-byte requests return a ``Block`` of size 0 with handle ``None`` that takes no
memory and does not count in the statistics; it must still be freed once.
``free`` of anything that is not a block allocated here and not yet freed (a
double free, a block of another allocator, another object) raises
``InvalidArgumentError`` and changes nothing. Block objects are recycled: a cache
hit may return the very object that was freed before, so a caller must drop its
reference when it frees (a second free through a stale reference is caught only
while the object is not handed out again).

Cost of a ``malloc`` + ``free`` pair on a cache hit, timeit on the development
machine (Python 3.11.7, AMD EPYC, 2 cores): 0.65 µs when the block is reused
whole (exact size, e.g. 64 MiB), 1.4 µs when it is split from and merged back
into a larger free block (e.g. 512 bytes from an otherwise free 2 MiB segment).
"""
from __future__ import annotations

import os
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from operator import index as _as_index
from typing import Any

from .errors import InvalidArgumentError, OutOfMemoryError

__all__ = [
    "AllocatorConf",
    "Block",
    "CachingAllocator",
    "NativeAllocator",
    "make_allocator",
    "ENV_VAR",
    "MIN_BLOCK_SIZE",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
]

ENV_VAR = "ANYCHIP_ALLOC_CONF"

MIN_BLOCK_SIZE = 512            # every block size is a multiple of this
SMALL_SIZE = 1 << 20            # requests up to this size use the small pool
SMALL_BUFFER = 2 << 20          # segment size of the small pool
LARGE_BUFFER = 20 << 20         # segment size for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20      # from this size a large request gets its own rounded segment
ROUND_LARGE = 2 << 20           # rounding of those segments
ROUNDUP_POWER2_INTERVALS = 16   # roundup_power2_divisions intervals: [1 MiB, 2 MiB), ... [32 GiB, 64 GiB)

_UNLIMITED = 1 << 63            # max_split_size when not set
_ALIGN_MASK = -MIN_BLOCK_SIZE


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------

_CONF_HELP = (
    "valid keys: backend (caching or native), max_split_size_mb (integer MiB > 20), "
    "garbage_collection_threshold (number in (0, 1)), roundup_power2_divisions "
    "(power of 2, or per size interval like [256:1,512:2,>:4]); "
    f"example: {ENV_VAR}=max_split_size_mb:64,garbage_collection_threshold:0.8"
)


def _conf_error(item: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{ENV_VAR}: bad item {item!r}: {why}; {_CONF_HELP}")


def _split_items(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _conf_error(text, "unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _conf_error(text, "unbalanced '['")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_divisions(item: str, value: str) -> tuple[int, ...] | None:
    def as_pow2(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise _conf_error(item, f"{text!r} is not an integer") from None
        if not _is_pow2(n):
            raise _conf_error(item, f"{n} is not a power of 2")
        return n

    if not value.startswith("["):
        d = as_pow2(value)
        return None if d == 1 else (d,) * ROUNDUP_POWER2_INTERVALS
    if not value.endswith("]"):
        raise _conf_error(item, "expected [size_mb:divisions,...,>:divisions]")
    divs = [0] * ROUNDUP_POWER2_INTERVALS
    done = 0                                  # intervals below this index are set
    for part in value[1:-1].split(","):
        bound, sep, d = (s.strip() for s in part.partition(":"))
        if not sep:
            raise _conf_error(item, f"{part.strip()!r} is not size_mb:divisions")
        n = as_pow2(d)
        if bound == ">":
            end = ROUNDUP_POWER2_INTERVALS
        else:
            end = min(as_pow2(bound).bit_length() - 1, ROUNDUP_POWER2_INTERVALS)
            if end < done:
                raise _conf_error(item, "interval bounds must increase")
        for i in range(done, end):
            divs[i] = n
        done = max(done, end)
    return None if all(d <= 1 for d in divs) else tuple(divs)


class AllocatorConf:
    """Allocator knobs, parsed from ``ANYCHIP_ALLOC_CONF`` (PyTorch's syntax)::

        max_split_size_mb:64,garbage_collection_threshold:0.8,roundup_power2_divisions:4
        backend:native
    """

    __slots__ = ("backend", "max_split_size", "garbage_collection_threshold", "roundup_power2_divisions")

    KEYS = ("backend", "max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")

    def __init__(self, backend: str = "caching", max_split_size: int | None = None,
                 garbage_collection_threshold: float | None = None,
                 roundup_power2_divisions: tuple[int, ...] | None = None) -> None:
        if backend not in ("caching", "native"):
            raise _conf_error(f"backend:{backend}", "backend must be caching or native")
        self.backend = backend
        #: bytes; blocks this large are never split (None: no limit)
        self.max_split_size = max_split_size
        #: fraction of total memory above which cached segments are freed before new ones are made
        self.garbage_collection_threshold = garbage_collection_threshold
        #: divisions per size interval (ROUNDUP_POWER2_INTERVALS of them), or None
        self.roundup_power2_divisions = roundup_power2_divisions

    @classmethod
    def parse(cls, text: str | None) -> AllocatorConf:
        conf = cls()
        if text is None or not text.strip():
            return conf
        seen = set()
        for item in _split_items(text.strip()):
            key, sep, value = (s.strip() for s in item.partition(":"))
            if not sep or not key or not value:
                raise _conf_error(item, "expected key:value")
            if key not in cls.KEYS:
                raise _conf_error(item, f"unknown key {key!r}")
            if key in seen:
                raise _conf_error(item, f"{key} given twice")
            seen.add(key)
            if key == "backend":
                if value not in ("caching", "native"):
                    raise _conf_error(item, f"backend must be caching or native, not {value!r}")
                conf.backend = value
            elif key == "max_split_size_mb":
                try:
                    mb = int(value)
                except ValueError:
                    raise _conf_error(item, f"{value!r} is not an integer number of MiB") from None
                if mb <= LARGE_BUFFER >> 20:
                    raise _conf_error(item, f"max_split_size_mb must be > {LARGE_BUFFER >> 20}, got {mb}")
                conf.max_split_size = mb << 20
            elif key == "garbage_collection_threshold":
                try:
                    t = float(value)
                except ValueError:
                    raise _conf_error(item, f"{value!r} is not a number") from None
                if not 0.0 < t < 1.0:
                    raise _conf_error(item, f"garbage_collection_threshold must be in (0, 1), got {value}")
                conf.garbage_collection_threshold = t
            else:
                conf.roundup_power2_divisions = _parse_divisions(item, value)
        return conf

    def _astuple(self) -> tuple:
        return (self.backend, self.max_split_size, self.garbage_collection_threshold,
                self.roundup_power2_divisions)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AllocatorConf):
            return NotImplemented
        return self._astuple() == other._astuple()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __repr__(self) -> str:
        return ("AllocatorConf(backend={!r}, max_split_size={!r}, garbage_collection_threshold={!r}, "
                "roundup_power2_divisions={!r})".format(*self._astuple()))


def round_size(nbytes: int, divisions: tuple[int, ...] | None = None) -> int:
    """Size of the block that serves a request of ``nbytes`` (>= 1) bytes."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    if divisions is not None:
        idx = min(max(nbytes.bit_length() - 21, 0), ROUNDUP_POWER2_INTERVALS - 1)
        d = divisions[idx]
        if d > 1 and nbytes > MIN_BLOCK_SIZE * d:
            if nbytes & (nbytes - 1) == 0:
                return nbytes
            floor = 1 << (nbytes.bit_length() - 1)
            step = floor // d
            return (nbytes + step - 1) // step * step
    return (nbytes + MIN_BLOCK_SIZE - 1) & _ALIGN_MASK


def segment_size(size: int) -> int:
    """Size of the raw segment made for a (rounded) request of ``size`` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


# ---------------------------------------------------------------------------
# blocks and free lists
# ---------------------------------------------------------------------------

class Block:
    """A range ``[offset, offset + size)`` of the raw segment ``handle``.

    ``requested`` is what the caller asked for, ``stream`` the stream token it was
    allocated on. The other slots belong to the allocator.
    """

    __slots__ = ("handle", "offset", "size", "requested", "stream",
                 "prev", "next",          # address neighbours in the same segment (None at the ends)
                 "_owner",                # the allocator while allocated; _PENDING; else None
                 "_fl",                   # free list (pool, stream) the block returns to; None once merged away
                 "_bi",                   # index in its size bucket while free
                 "_mig",                  # migration that marked it (see module docstring)
                 "_uses",                 # set of extra streams (record_stream) or None
                 "_npend")                # events still pending before it can be reused

    def __repr__(self) -> str:
        return (f"Block(handle={self.handle!r}, offset={self.offset}, size={self.size}, "
                f"requested={getattr(self, 'requested', 0)}, stream={self.stream!r})")


def _new_block(handle: Any, offset: int, size: int, stream: Any, fl: _FreeList | None) -> Block:
    b = Block.__new__(Block)
    b.handle = handle
    b.offset = offset
    b.size = size
    b.requested = 0
    b.stream = stream
    b.prev = None
    b.next = None
    b._owner = None
    b._fl = fl
    b._bi = 0
    b._mig = None
    b._uses = None
    b._npend = 0
    return b


class _Pending:
    """Marker owner of a freed block that waits for events."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<pending>"


_PENDING = _Pending()


class _FreeList:
    """Free blocks of one (pool, stream): buckets of equal size over a sorted list of sizes."""

    __slots__ = ("sizes", "buckets", "stream", "small", "st", "split_min", "mig", "limit", "spare")

    def __init__(self, stream: Any, small: bool, st: _Stats) -> None:
        self.sizes: list[int] = []          # sorted; may hold sizes whose bucket is empty
        self.buckets: dict[int, list[Block]] = {}
        self.stream = stream
        self.small = small
        self.st = st
        # smallest remainder worth a split (large pool: more than SMALL_SIZE)
        self.split_min = MIN_BLOCK_SIZE if small else SMALL_SIZE + 1
        self.mig: _Migration | None = None  # outstanding event-based migration away from this list
        self.limit = 64                     # compact `sizes` when it grows past this
        self.spare: Block | None = None     # a block object merged away, reused by the next split

    def blocks(self) -> list[Block]:
        return [b for s in self.sizes for b in self.buckets[s]]

    def __bool__(self) -> bool:
        return any(self.buckets.values())

    def drop(self, i: int, j: int) -> None:
        """Forget the sizes ``sizes[i:j]``, whose buckets are empty."""
        buckets = self.buckets
        for s in self.sizes[i:j]:
            del buckets[s]
        del self.sizes[i:j]

    def compact(self) -> None:
        buckets = self.buckets
        keep = [s for s in self.sizes if buckets[s]]
        for s in self.sizes:
            if not buckets[s]:
                del buckets[s]
        self.sizes = keep
        self.limit = max(64, 2 * len(keep))


class _Migration:
    """Free blocks of ``src`` that move to ``dst`` (None: to whichever stream asks
    first) once ``event`` has completed (None: already done)."""

    __slots__ = ("src", "dst", "blocks", "event")

    def __init__(self, src: _FreeList, dst: _FreeList | None, event: Any) -> None:
        self.src = src
        self.dst = dst
        self.event = event
        blocks = src.blocks()
        for b in blocks:
            b._mig = self
        self.blocks = blocks


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------

# (PyTorch name, attribute prefix) of the statistics kept directly
_TRACKED = (
    ("allocated_bytes", "ab"),
    ("requested_bytes", "qb"),
    ("allocation", "ac"),
    ("reserved_bytes", "rb"),
    ("segment", "sc"),
    ("inactive_split_bytes", "isb"),
    ("inactive_split", "isc"),
)
_STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
               "active_bytes", "inactive_split_bytes", "requested_bytes")
_PK = {p: p + "_pk" for _, p in _TRACKED}
_FR = {p: p + "_fr" for _, p in _TRACKED}


class _AllPeaks:
    """Peaks of the "all" statistics (their other values are sums over the two pools),
    and the number of blocks waiting for events."""

    __slots__ = tuple(_PK.values()) + ("act_pk", "acn_pk", "pc")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


class _Stats:
    """Counters of one pool (small or large).

    For a statistic ``x``: ``x`` is the current value, ``x_pk`` the peak, ``x_fr``
    the total of decreases since the last reset and ``x_b`` the value at that reset
    (so the total of increases is ``x + x_fr - x_b``). ``pb``/``pc`` are the bytes /
    blocks freed but waiting for events (active = allocated + pending: active grows
    only when allocated does); ``act_pk``/``acn_pk`` the active peaks seen while
    something was pending. ``o`` is the other pool, ``A`` the peaks of "all".
    """

    __slots__ = tuple(p + s for _, p in _TRACKED for s in ("", "_pk", "_fr", "_b")) + (
        "pb", "pb_b", "pc", "pc_b", "act_pk", "acn_pk", "o", "A")

    def __init__(self, A: _AllPeaks) -> None:
        for name in self.__slots__[:-2]:
            setattr(self, name, 0)
        self.A = A
        self.o = self


def _stat_inc(st: _Stats, p: str, delta: int) -> None:
    """Slow-path increase of statistic ``p`` of pool ``st`` (and of "all")."""
    v = getattr(st, p) + delta
    setattr(st, p, v)
    pk = _PK[p]
    if v > getattr(st, pk):
        setattr(st, pk, v)
    v += getattr(st.o, p)
    if v > getattr(st.A, pk):
        setattr(st.A, pk, v)


def _stat_dec(st: _Stats, p: str, delta: int) -> None:
    """Slow-path decrease of statistic ``p`` of pool ``st`` by ``delta`` (>= 0)."""
    setattr(st, p, getattr(st, p) - delta)
    fr = _FR[p]
    setattr(st, fr, getattr(st, fr) + delta)


def _stat_add(st: _Stats, p: str, delta: int) -> None:
    if delta > 0:
        _stat_inc(st, p, delta)
    elif delta < 0:
        _stat_dec(st, p, -delta)


def _active_peaks(st: _Stats) -> None:
    """Active peaks after an allocation while some blocks wait for events."""
    o, A = st.o, st.A
    v = st.ab + st.pb
    if v > st.act_pk:
        st.act_pk = v
    v += o.ab + o.pb
    if v > A.act_pk:
        A.act_pk = v
    v = st.ac + st.pc
    if v > st.acn_pk:
        st.acn_pk = v
    v += o.ac + o.pc
    if v > A.acn_pk:
        A.acn_pk = v


# ---------------------------------------------------------------------------
# common part of both allocators
# ---------------------------------------------------------------------------

class _AllocatorBase:
    __slots__ = ("name", "conf", "_raw_alloc", "_raw_free", "_mem_info", "_event_record", "_event_query",
                 "_event_synchronize", "_event_destroy", "_small_st", "_large_st", "_all",
                 "_pending", "_npending", "_deferred", "_zero",
                 "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "__weakref__")

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
        self._all = A = _AllPeaks()
        self._small_st = s = _Stats(A)
        self._large_st = ls = _Stats(A)
        s.o, ls.o = ls, s
        self._pending: dict[Any, deque] = {}   # stream -> FIFO of (event, Block | _Migration)
        self._npending = 0                     # events in _pending
        self._deferred: list[Block] = []       # record_stream-ed blocks when there are no events
        self._zero = object()                  # owner of size-0 blocks
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def __repr__(self) -> str:
        s, ls = self._small_st, self._large_st
        return (f"<{type(self).__name__} {self.name}: {s.ab + ls.ab} bytes allocated, "
                f"{s.rb + ls.rb} reserved in {s.sc + ls.sc} segments>")

    def _pool_st(self, size: int) -> _Stats:
        return self._small_st if size <= SMALL_SIZE else self._large_st

    # -- argument checks --------------------------------------------------
    def _odd_size(self, nbytes: Any, stream: Any) -> Block | None:
        """malloc sizes off the fast path (not an int, 0, negative): a size-0 block
        for 0, None for a valid positive size, else InvalidArgumentError."""
        if isinstance(nbytes, (bool, float)):
            raise InvalidArgumentError(f"allocation size must be an integer, got {nbytes!r}")
        try:
            n = _as_index(nbytes)
        except TypeError:
            raise InvalidArgumentError(f"allocation size must be an integer, got {nbytes!r}") from None
        if n < 0:
            raise InvalidArgumentError(f"allocation size must be >= 0, got {n}")
        if n:
            return None
        b = _new_block(None, 0, 0, stream, None)
        b._owner = self._zero
        return b

    def _bad_free(self, block: Any) -> None:
        """free() of something that is not a block allocated here: raises (nothing
        changes), except for a size-0 block of this allocator, which is freed."""
        if not isinstance(block, Block):
            raise InvalidArgumentError(f"free() on {self.name} expects a Block, got {type(block).__name__}")
        owner = block._owner
        if owner is self._zero:
            block._owner = None
            return
        if owner is None:
            raise InvalidArgumentError(f"double free on {self.name}: {block!r} is not allocated")
        if owner is _PENDING:
            raise InvalidArgumentError(
                f"double free on {self.name}: {block!r} was already freed (its memory waits for other streams)")
        raise InvalidArgumentError(f"free() on {self.name} of {block!r}, which belongs to another allocator "
                                   f"({getattr(owner, 'name', owner)!r})")

    # -- record_stream / events -------------------------------------------
    def record_stream(self, block: Block, stream: Any) -> None:
        """``block`` is also used on ``stream``: once freed, it is reused only after
        the work enqueued on ``stream`` up to the free has completed."""
        owner = getattr(block, "_owner", None)
        if not isinstance(block, Block) or (owner is not self and owner is not self._zero):
            raise InvalidArgumentError(f"record_stream on {self.name} needs a block allocated there and "
                                       f"not freed, got {block!r}")
        if owner is self._zero or stream == block.stream:
            return
        uses = block._uses
        if uses is None:
            block._uses = {stream}
        else:
            uses.add(stream)

    def _free_later(self, block: Block, st: _Stats) -> None:
        """A freed block also used on other streams: reusable when their events complete."""
        uses = block._uses
        block._uses = None
        block._owner = _PENDING
        st.pb += block.size
        st.pc += 1
        st.A.pc += 1
        record = self._event_record
        if record is None:
            self._deferred.append(block)
            return
        pending = self._pending
        n = 0
        for s in uses:
            ev = record(s)
            q = pending.get(s)
            if q is None:
                q = pending[s] = deque()
            q.append((ev, block))
            n += 1
        block._npend = n
        self._npending += n

    @staticmethod
    def _unpend(block: Block, st: _Stats) -> None:
        """Statistics of a pending block that is released."""
        st.pb -= block.size
        st.pc -= 1
        st.A.pc -= 1

    def _event_done(self, target: Any) -> None:
        if target.__class__ is Block:
            target._npend -= 1
            if not target._npend:
                self._release_pending(target)
        else:
            self._migration_done(target)

    def _release_pending(self, block: Block) -> None:
        raise NotImplementedError

    def _migration_done(self, mig: _Migration) -> None:
        raise NotImplementedError

    def _process_events(self) -> None:
        """Release what completed events were holding (per stream, in order)."""
        query = self._event_query
        destroy = self._event_destroy
        pending = self._pending
        for s in list(pending):
            q = pending[s]
            while q:
                ev, target = q[0]
                if not query(ev):
                    break
                q.popleft()
                self._npending -= 1
                if destroy is not None:
                    destroy(ev)
                self._event_done(target)
            if not q:
                del pending[s]

    def _sync_events(self) -> None:
        """Wait for every pending event and release what they were holding."""
        self.num_sync_all_streams += 1
        self._wait_events()

    def _wait_events(self) -> None:
        sync = self._event_synchronize
        query = self._event_query
        destroy = self._event_destroy
        pending = self._pending
        while pending:
            s = next(iter(pending))
            q = pending[s]
            while q:
                ev, target = q.popleft()
                self._npending -= 1
                if sync is not None:
                    sync(ev)
                else:
                    while not query(ev):
                        time.sleep(1e-5)
                if destroy is not None:
                    destroy(ev)
                self._event_done(target)
            pending.pop(s, None)

    def synchronize_and_free_events(self) -> None:
        """Wait for all pending events and release the blocks they held.

        Without event functions this releases the ``record_stream``-ed blocks (and,
        in the caching allocator, lets free blocks cross streams): call it only when
        the device is idle (after a device synchronize)."""
        self._sync_events()
        if self._event_record is None:
            deferred, self._deferred = self._deferred, []
            for b in deferred:
                self._release_pending(b)

    # -- statistics -------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """Statistics with PyTorch's dotted names, e.g. ``allocated_bytes.all.current``."""
        s, ls, A = self._small_st, self._large_st, self._all
        vals: dict[tuple[str, str], tuple[int, int, int, int]] = {}   # (name, pool) -> cur, peak, alloc, freed
        for name, p in _TRACKED:
            pk, fr, b = _PK[p], _FR[p], p + "_b"
            tot = [0, 0, 0]
            for pool, st in (("small_pool", s), ("large_pool", ls)):
                cur, f, base = getattr(st, p), getattr(st, fr), getattr(st, b)
                vals[name, pool] = (cur, getattr(st, pk), cur + f - base, f)
                tot[0] += cur
                tot[1] += f
                tot[2] += base
            vals[name, "all"] = (tot[0], getattr(A, pk), tot[0] + tot[1] - tot[2], tot[1])
        # active = allocated + pending; it grows only when allocated grows
        for name, src, pend, pend_b, pk in (("active_bytes", "allocated_bytes", "pb", "pb_b", "act_pk"),
                                            ("active", "allocation", "pc", "pc_b", "acn_pk")):
            base_p = "ab" if src == "allocated_bytes" else "ac"
            tot = [0, 0]   # pending current, base of active
            for pool, st in (("small_pool", s), ("large_pool", ls)):
                cur_a, peak_a, alloc_a, _ = vals[src, pool]
                cur = cur_a + getattr(st, pend)
                base = getattr(st, base_p + "_b") + getattr(st, pend_b)
                vals[name, pool] = (cur, max(getattr(st, pk), peak_a), alloc_a, alloc_a - cur + base)
                tot[0] += getattr(st, pend)
                tot[1] += base
            cur_a, peak_a, alloc_a, _ = vals[src, "all"]
            cur = cur_a + tot[0]
            vals[name, "all"] = (cur, max(getattr(A, pk), peak_a), alloc_a, alloc_a - cur + tot[1])
        out: dict[str, int] = {}
        for name in _STAT_NAMES:
            for pool in ("all", "small_pool", "large_pool"):
                cur, peak, alloc, freed = vals[name, pool]
                out[f"{name}.{pool}.current"] = cur
                out[f"{name}.{pool}.peak"] = peak
                out[f"{name}.{pool}.allocated"] = alloc
                out[f"{name}.{pool}.freed"] = freed
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        ms = self.conf.max_split_size
        out["max_split_size"] = -1 if ms is None else ms
        return out

    def reset_peak_stats(self) -> None:
        s, ls, A = self._small_st, self._large_st, self._all
        for _, p in _TRACKED:
            pk = _PK[p]
            setattr(s, pk, getattr(s, p))
            setattr(ls, pk, getattr(ls, p))
            setattr(A, pk, getattr(s, p) + getattr(ls, p))
        for st in (s, ls):
            st.act_pk = st.ab + st.pb
            st.acn_pk = st.ac + st.pc
        A.act_pk = s.act_pk + ls.act_pk
        A.acn_pk = s.acn_pk + ls.acn_pk

    def reset_accumulated_stats(self) -> None:
        for st in (self._small_st, self._large_st):
            for _, p in _TRACKED:
                setattr(st, _FR[p], 0)
                setattr(st, p + "_b", getattr(st, p))
            st.pb_b = st.pb
            st.pc_b = st.pc
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # -- out of memory ----------------------------------------------------
    def _device_mem(self) -> tuple[int | None, int | None]:
        if self._mem_info is None:
            return None, None
        try:
            info = self._mem_info()
        except Exception:
            return None, None
        if not info:
            return None, None
        return int(info[0]), int(info[1])

    def _oom(self, nbytes: int, seg: int, exc: OutOfMemoryError) -> OutOfMemoryError:
        self.num_ooms += 1
        free, total = self._device_mem()
        stats = self.memory_stats()
        allocated = stats["allocated_bytes.all.current"]
        reserved = stats["reserved_bytes.all.current"]
        detail = f"{seg} bytes were requested from the device"
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
    """Caching allocator (see the module docstring for the policy)."""

    __slots__ = ("_small", "_large", "_segments", "_max_split", "_divs", "_gc", "_neutral")

    def __init__(self, raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None], **kw: Any) -> None:
        super().__init__(raw_alloc, raw_free, **kw)
        conf = self.conf
        self._small: dict[Any, _FreeList] = {}      # stream -> free list of the small pool
        self._large: dict[Any, _FreeList] = {}
        self._segments: dict[Block, tuple[int, bool, Any]] = {}   # head block -> (size, small, stream)
        self._max_split = _UNLIMITED if conf.max_split_size is None else conf.max_split_size
        self._divs = conf.roundup_power2_divisions
        self._gc = conf.garbage_collection_threshold
        self._neutral: dict[_FreeList, _Migration] = {}   # blocks any stream may take (no-event mode)

    # -- allocation -------------------------------------------------------
    def malloc(self, nbytes: int, stream: Any = None) -> Block:
        """A block of at least ``nbytes`` bytes usable on ``stream``."""
        if self._npending:
            self._process_events()
        if nbytes.__class__ is not int or nbytes <= 0:
            zero = self._odd_size(nbytes, stream)
            if zero is not None:
                return zero
            nbytes = _as_index(nbytes)
        if self._divs is None:
            size = (nbytes + 511) & -512
        else:
            size = round_size(nbytes, self._divs)
        fl = (self._small if size <= SMALL_SIZE else self._large).get(stream)
        if fl is None:
            return self._malloc_miss(nbytes, size, stream, None)
        buckets = fl.buckets
        b = buckets.get(size)
        st = fl.st
        if b:
            # exact fit, reused whole
            block = b.pop()
            if block.prev is not None or block.next is not None:
                st.isb -= size
                st.isb_fr += size
                st.isc -= 1
                st.isc_fr += 1
        else:
            sizes = fl.sizes
            i = j = bisect_left(sizes, size)
            n = len(sizes)
            while j < n:
                bsize = sizes[j]
                b = buckets[bsize]
                if b:
                    break
                j += 1
            else:
                return self._malloc_miss(nbytes, size, stream, fl)
            if j - i > 4:
                fl.drop(i, j)
            max_split = self._max_split
            if bsize >= max_split and (size < max_split or bsize >= size + LARGE_BUFFER):
                return self._malloc_miss(nbytes, size, stream, fl)
            block = b.pop()
            rem = bsize - size
            if rem >= fl.split_min and size < max_split:
                # split: the rest stays free after the block
                r = fl.spare
                if r is None:
                    r = Block.__new__(Block)
                    r.stream = fl.stream
                    r._owner = None
                    r._fl = fl
                    r._mig = None
                    r._uses = None
                else:
                    fl.spare = None
                r.handle = block.handle
                r.offset = block.offset + size
                r.size = rem
                r.prev = block
                r.next = n = block.next
                block.next = r
                block.size = size
                b = buckets.get(rem)
                if b is None:
                    buckets[rem] = [r]
                    r._bi = 0
                    sizes = fl.sizes
                    insort(sizes, rem)
                    if len(sizes) > fl.limit:
                        fl.compact()
                else:
                    r._bi = len(b)
                    b.append(r)
                if n is not None:
                    n.prev = r
                    st.isb -= size          # an inactive split block shrinks
                    st.isb_fr += size
                elif block.prev is not None:
                    st.isb -= size
                    st.isb_fr += size
                else:
                    # a new inactive split block of `rem` bytes
                    A = st.A
                    o = st.o
                    v = st.isb + rem
                    st.isb = v
                    if v > st.isb_pk:
                        st.isb_pk = v
                        v += o.isb
                        if v > A.isb_pk:
                            A.isb_pk = v
                    elif o.isb:
                        v += o.isb
                        if v > A.isb_pk:
                            A.isb_pk = v
                    v = st.isc + 1
                    st.isc = v
                    if v > st.isc_pk:
                        st.isc_pk = v
                        v += o.isc
                        if v > A.isc_pk:
                            A.isc_pk = v
                    elif o.isc:
                        v += o.isc
                        if v > A.isc_pk:
                            A.isc_pk = v
            else:
                size = bsize
                if block.prev is not None or block.next is not None:
                    st.isb -= size
                    st.isb_fr += size
                    st.isc -= 1
                    st.isc_fr += 1
        block._owner = self
        block._mig = None
        block.requested = nbytes
        A = st.A
        o = st.o
        v = st.ab + size
        st.ab = v
        if v > st.ab_pk:
            st.ab_pk = v
            v += o.ab
            if v > A.ab_pk:
                A.ab_pk = v
        elif o.ab:
            v += o.ab
            if v > A.ab_pk:
                A.ab_pk = v
        v = st.qb + nbytes
        st.qb = v
        if v > st.qb_pk:
            st.qb_pk = v
            v += o.qb
            if v > A.qb_pk:
                A.qb_pk = v
        elif o.qb:
            v += o.qb
            if v > A.qb_pk:
                A.qb_pk = v
        v = st.ac + 1
        st.ac = v
        if v > st.ac_pk:
            st.ac_pk = v
            v += o.ac
            if v > A.ac_pk:
                A.ac_pk = v
        elif o.ac:
            v += o.ac
            if v > A.ac_pk:
                A.ac_pk = v
        if A.pc:
            _active_peaks(st)
        return block

    def _find(self, fl: _FreeList, size: int) -> Block | None:
        """Remove and return the best-fit free block of ``fl`` for ``size`` (with
        PyTorch's max_split_size rules), or None."""
        sizes, buckets = fl.sizes, fl.buckets
        i = j = bisect_left(sizes, size)
        n = len(sizes)
        while j < n:
            bsize = sizes[j]
            b = buckets[bsize]
            if b:
                break
            j += 1
        if j - i > 4:
            fl.drop(i, j)
        if j == n:
            return None
        max_split = self._max_split
        if bsize >= max_split and (size < max_split or bsize >= size + LARGE_BUFFER):
            return None
        return b.pop()

    def _take(self, fl: _FreeList, block: Block, nbytes: int, size: int) -> Block:
        """Hand out ``block`` (just taken out of ``fl``, or a new segment): split, statistics.
        The slow-path twin of the inline code in malloc."""
        st = fl.st
        bsize = block.size
        in_split = block.prev is not None or block.next is not None
        if bsize - size >= fl.split_min and size < self._max_split:
            r = _new_block(block.handle, block.offset + size, bsize - size, block.stream, fl)
            r.prev = block
            r.next = n = block.next
            if n is not None:
                n.prev = r
            block.next = r
            block.size = size
            self._add_free(r, fl)
            if in_split:
                _stat_dec(st, "isb", size)
            else:
                _stat_inc(st, "isb", r.size)
                _stat_inc(st, "isc", 1)
        else:
            size = bsize
            if in_split:
                _stat_dec(st, "isb", bsize)
                _stat_dec(st, "isc", 1)
        block._owner = self
        block._mig = None
        block.requested = nbytes
        _stat_inc(st, "ab", size)
        _stat_inc(st, "qb", nbytes)
        _stat_inc(st, "ac", 1)
        if st.A.pc:
            _active_peaks(st)
        return block

    def _list(self, stream: Any, small: bool) -> _FreeList:
        pools = self._small if small else self._large
        fl = pools.get(stream)
        if fl is None:
            fl = pools[stream] = _FreeList(stream, small, self._small_st if small else self._large_st)
        return fl

    def _malloc_miss(self, nbytes: int, size: int, stream: Any, fl: _FreeList | None) -> Block:
        if fl is None:
            fl = self._list(stream, size <= SMALL_SIZE)
        # (1) blocks other streams freed, once their events show them done
        if self._migrate_into(fl):
            block = self._find(fl, size)
            if block is not None:
                return self._take(fl, block, nbytes, size)
        block = self._new_segment(fl, nbytes, size)
        return self._take(fl, block, nbytes, size)

    def _migrate_into(self, fl: _FreeList, wait: bool = False) -> bool:
        """Start (and finish, if their events are done; ``wait``: synchronize them)
        moving other streams' free blocks of fl's pool into ``fl``. True when
        something may have moved."""
        moved = False
        if self._neutral:
            for src, mig in list(self._neutral.items()):
                if src is not fl and src.small == fl.small:
                    del self._neutral[src]
                    mig.dst = fl
                    self._migration_done(mig)
                    moved = True
        record = self._event_record
        if record is None:
            return moved
        started = False
        for src in list((self._small if fl.small else self._large).values()):
            if src is fl or src.mig is not None or not src:
                continue
            mig = _Migration(src, fl, None)
            mig.event = ev = record(src.stream)
            src.mig = mig
            q = self._pending.get(src.stream)
            if q is None:
                q = self._pending[src.stream] = deque()
            q.append((ev, mig))
            self._npending += 1
            started = True
        if started:
            if wait:
                self._wait_events()
            else:
                self._process_events()
            moved = True
        return moved

    def _migration_done(self, mig: _Migration) -> None:
        src, dst = mig.src, mig.dst
        if src.mig is mig:
            src.mig = None
        blocks, mig.blocks = mig.blocks, []
        if dst is None:
            return
        for b in blocks:
            if b._mig is mig and b._owner is None and b._fl is src:
                self._unlist(b, src)
                b._mig = None
                b.stream = dst.stream
                b._fl = dst
                self._insert_free(b, dst, b.prev is not None or b.next is not None)

    def _new_segment(self, fl: _FreeList, nbytes: int, size: int) -> Block:
        """A new segment for the request (or, after an OOM and a sync, a cached block)."""
        seg = segment_size(size)
        # (2) garbage collection
        if self._gc is not None:
            self._garbage_collect()
        try:
            handle = self._raw_alloc(seg)
        except OutOfMemoryError:
            # (3) wait for every event, look again, return the whole cache, retry once
            self.num_alloc_retries += 1
            self._sync_events()
            self._migrate_into(fl, wait=True)
            block = self._find(fl, size)
            if block is not None:
                return block
            self._release_cached()
            try:
                handle = self._raw_alloc(seg)
            except OutOfMemoryError as exc:
                # (4)
                raise self._oom(nbytes, seg, exc) from exc
        self.num_device_alloc += 1
        head = _new_block(handle, 0, seg, fl.stream, fl)
        self._segments[head] = (seg, fl.small, fl.stream)
        _stat_inc(fl.st, "rb", seg)
        _stat_inc(fl.st, "sc", 1)
        return head

    # -- free -------------------------------------------------------------
    def free(self, block: Block) -> None:
        """Return ``block`` to its free list (reused at once on its stream)."""
        try:
            owner = block._owner
        except AttributeError:
            owner = None
        if owner is not self:
            return self._bad_free(block)
        block._owner = None
        fl = block._fl
        st = fl.st
        size = block.size
        st.ab -= size
        st.ab_fr += size
        v = block.requested
        st.qb -= v
        st.qb_fr += v
        st.ac -= 1
        st.ac_fr += 1
        if block._uses is not None:
            return self._free_later(block, st)
        buckets = fl.buckets
        prev = block.prev
        n = block.next
        if prev is not None or n is not None:
            # merge with the free neighbours of the same list (same inline code as _insert_free)
            d_cnt = d_bytes = 0
            if prev is not None and prev._owner is None and prev._fl is fl:
                b = buckets[prev.size]
                i = prev._bi
                last = b.pop()
                if last is not prev:
                    b[i] = last
                    last._bi = i
                v = prev.size
                d_cnt = -1
                d_bytes = -v
                size += v
                prev.size = size
                prev.next = n
                if n is not None:
                    n.prev = prev
                prev._mig = None
                block = prev               # the freed block object is dead now
                prev = block.prev
            if n is not None and n._owner is None and n._fl is fl:
                b = buckets[n.size]
                i = n._bi
                last = b.pop()
                if last is not n:
                    b[i] = last
                    last._bi = i
                v = n.size
                d_cnt -= 1
                d_bytes -= v
                size += v
                block.size = size
                block.next = nn = n.next
                if nn is not None:
                    nn.prev = block
                n._mig = None              # dead: kept for the next split of this list
                fl.spare = n
                n = nn
            if prev is not None or n is not None:
                d_cnt += 1
                d_bytes += size
            if d_bytes > 0:
                A = st.A
                v = st.isb + d_bytes
                st.isb = v
                if v > st.isb_pk:
                    st.isb_pk = v
                    v += st.o.isb
                    if v > A.isb_pk:
                        A.isb_pk = v
                elif st.o.isb:
                    v += st.o.isb
                    if v > A.isb_pk:
                        A.isb_pk = v
            elif d_bytes:
                st.isb += d_bytes
                st.isb_fr -= d_bytes
            if d_cnt > 0:
                A = st.A
                v = st.isc + d_cnt
                st.isc = v
                if v > st.isc_pk:
                    st.isc_pk = v
                    v += st.o.isc
                    if v > A.isc_pk:
                        A.isc_pk = v
                elif st.o.isc:
                    v += st.o.isc
                    if v > A.isc_pk:
                        A.isc_pk = v
            elif d_cnt:
                st.isc += d_cnt
                st.isc_fr -= d_cnt
        b = buckets.get(size)
        if b is None:
            buckets[size] = [block]
            block._bi = 0
            sizes = fl.sizes
            insort(sizes, size)
            if len(sizes) > fl.limit:
                fl.compact()
        else:
            block._bi = len(b)
            b.append(block)

    @staticmethod
    def _unlist(nb: Block, fl: _FreeList) -> None:
        """Remove the free block ``nb`` from ``fl`` (swapped with its bucket's last)."""
        b = fl.buckets[nb.size]
        i = nb._bi
        last = b.pop()
        if last is not nb:
            b[i] = last
            last._bi = i

    @staticmethod
    def _add_free(block: Block, fl: _FreeList) -> None:
        size = block.size
        buckets = fl.buckets
        b = buckets.get(size)
        if b is None:
            buckets[size] = [block]
            block._bi = 0
            insort(fl.sizes, size)
            if len(fl.sizes) > fl.limit:
                fl.compact()
        else:
            block._bi = len(b)
            b.append(block)

    def _insert_free(self, block: Block, fl: _FreeList, counted: bool) -> None:
        """Put ``block`` (free, in no list) into ``fl``, merged with its free neighbours
        in ``fl``. ``counted``: it is already counted as an inactive split block.
        The slow-path twin of the inline code in free."""
        d_cnt = d_bytes = 0
        if counted:
            d_cnt = -1
            d_bytes = -block.size
        prev = block.prev
        if prev is not None and prev._owner is None and prev._fl is fl:
            self._unlist(prev, fl)
            d_cnt -= 1
            d_bytes -= prev.size
            prev.size += block.size
            prev.next = n = block.next
            if n is not None:
                n.prev = prev
            prev._mig = None
            block._fl = None
            block.prev = block.next = None
            block = prev
        n = block.next
        if n is not None and n._owner is None and n._fl is fl:
            self._unlist(n, fl)
            d_cnt -= 1
            d_bytes -= n.size
            block.size += n.size
            block.next = nn = n.next
            if nn is not None:
                nn.prev = block
            n._fl = None
            n._mig = None
            n.prev = n.next = None
        if block.prev is not None or block.next is not None:
            d_cnt += 1
            d_bytes += block.size
        self._add_free(block, fl)
        _stat_add(fl.st, "isb", d_bytes)
        _stat_add(fl.st, "isc", d_cnt)

    def _release_pending(self, block: Block) -> None:
        fl = block._fl
        self._unpend(block, fl.st)
        block._owner = None
        self._insert_free(block, fl, False)

    # -- cache release ------------------------------------------------------
    def _release_segment(self, head: Block) -> int:
        seg = self._segments.pop(head)[0]
        fl = head._fl
        self._unlist(head, fl)
        head._fl = None
        head._mig = None
        self._raw_free(head.handle)
        self.num_device_free += 1
        _stat_dec(fl.st, "rb", seg)
        _stat_dec(fl.st, "sc", 1)
        return seg

    def _unused_segments(self) -> list[Block]:
        """Heads of the segments that are one free block, oldest first."""
        return [h for h in self._segments if h.next is None and h._owner is None and h._fl is not None]

    def _release_cached(self) -> int:
        """raw_free every segment that is one free block; returns the bytes released."""
        return sum(self._release_segment(h) for h in self._unused_segments())

    def _garbage_collect(self) -> None:
        """Free unused segments, oldest first, while reserved > threshold * total."""
        _, total = self._device_mem()
        if total is None:
            return
        limit = self._gc * total
        reserved = self._small_st.rb + self._large_st.rb
        if reserved <= limit:
            return
        target = reserved - limit
        freed = 0
        for head in self._unused_segments():
            if freed >= target:
                break
            freed += self._release_segment(head)

    def empty_cache(self) -> None:
        """Wait for pending events, then return every unused cached segment to raw_free."""
        self._sync_events()
        self._release_cached()

    def synchronize_and_free_events(self) -> None:
        super().synchronize_and_free_events()
        if self._event_record is None:
            # the device is idle: every free block may serve any stream
            for pools in (self._small, self._large):
                for fl in pools.values():
                    if fl:
                        self._neutral[fl] = _Migration(fl, None, None)

    # -- introspection ------------------------------------------------------
    def snapshot(self) -> list[dict]:
        """One dict per segment: handle (repr), total_size, pool, stream and
        blocks as (offset, size, state) in address order."""
        out = []
        for head, (seg, small, stream) in self._segments.items():
            blocks = []
            allocated = requested = active = 0
            b: Block | None = head
            while b is not None:
                if b._owner is self:
                    state = "active_allocated"
                    allocated += b.size
                    requested += b.requested
                    active += b.size
                elif b._owner is _PENDING:
                    state = "active_pending_free"
                    active += b.size
                else:
                    state = "inactive"
                blocks.append((b.offset, b.size, state))
                b = b.next
            out.append({"device": self.name, "handle": repr(head.handle), "total_size": seg,
                        "allocated_size": allocated, "requested_size": requested, "active_size": active,
                        "pool": "small" if small else "large", "stream": stream, "blocks": blocks})
        return out


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

    def malloc(self, nbytes: int, stream: Any = None) -> Block:
        if self._npending:
            self._process_events()
        if nbytes.__class__ is not int or nbytes <= 0:
            zero = self._odd_size(nbytes, stream)
            if zero is not None:
                return zero
            nbytes = _as_index(nbytes)
        try:
            handle = self._raw_alloc(nbytes)
        except OutOfMemoryError:
            # blocks waiting for events are the only memory that can be given back
            self.num_alloc_retries += 1
            self._sync_events()
            try:
                handle = self._raw_alloc(nbytes)
            except OutOfMemoryError as exc:
                raise self._oom(nbytes, nbytes, exc) from exc
        self.num_device_alloc += 1
        block = _new_block(handle, 0, nbytes, stream, None)
        block._owner = self
        block.requested = nbytes
        self._live[block] = None
        st = self._pool_st(nbytes)
        for p in ("ab", "qb", "rb"):
            _stat_inc(st, p, nbytes)
        _stat_inc(st, "ac", 1)
        _stat_inc(st, "sc", 1)
        if st.A.pc:
            _active_peaks(st)
        return block

    def free(self, block: Block) -> None:
        try:
            owner = block._owner
        except AttributeError:
            owner = None
        if owner is not self:
            return self._bad_free(block)
        block._owner = None
        size = block.size
        st = self._pool_st(size)
        _stat_dec(st, "ab", size)
        _stat_dec(st, "qb", block.requested)
        _stat_dec(st, "ac", 1)
        if block._uses is not None:
            self._free_later(block, st)
            return
        self._raw_release(block, st)

    def _raw_release(self, block: Block, st: _Stats) -> None:
        del self._live[block]
        self._raw_free(block.handle)
        self.num_device_free += 1
        _stat_dec(st, "rb", block.size)
        _stat_dec(st, "sc", 1)

    def _release_pending(self, block: Block) -> None:
        st = self._pool_st(block.size)
        self._unpend(block, st)
        block._owner = None
        self._raw_release(block, st)

    def empty_cache(self) -> None:
        """Nothing is cached; waits for pending events and frees the blocks they held."""
        self._sync_events()

    def snapshot(self) -> list[dict]:
        out = []
        for b in self._live:
            live = b._owner is self
            out.append({"device": self.name, "handle": repr(b.handle), "total_size": b.size,
                        "allocated_size": b.size if live else 0, "requested_size": b.requested if live else 0,
                        "active_size": b.size, "pool": "small" if b.size <= SMALL_SIZE else "large",
                        "stream": b.stream,
                        "blocks": [(0, b.size, "active_allocated" if live else "active_pending_free")]})
        return out


def make_allocator(raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None],
                   **kw: Any) -> CachingAllocator | NativeAllocator:
    """The allocator the configuration asks for: keyword ``conf`` (an AllocatorConf
    or its text), else ``ANYCHIP_ALLOC_CONF`` from the environment."""
    conf = kw.pop("conf", None)
    if conf is None:
        conf = AllocatorConf.parse(os.environ.get(ENV_VAR))
    elif isinstance(conf, str):
        conf = AllocatorConf.parse(conf)
    cls = NativeAllocator if conf.backend == "native" else CachingAllocator
    return cls(raw_alloc, raw_free, conf=conf, **kw)
