"""The caching allocator's statistics, by PyTorch's names.

The counters live in the allocator's compiled core (``csrc/alloc/stats.h``), as
PyTorch's ``DeviceStats``: for each kind below, a ``StatArray`` of three
:class:`Stat` (pools "all", "small_pool", "large_pool"), each with current,
peak, allocated (total of increases) and freed (total of decreases) since the
last reset; every change updates the pool and "all" together. This module
names them: ``allocated_bytes.all.current``, ``segment.large_pool.peak`` ...
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["Stat", "KINDS", "POOLS", "FIELDS", "COUNTERS", "Kind", "stats_dict"]

#: the kinds of statistic, in the order of the core's ``enum stat_kind``
KINDS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
         "active_bytes", "inactive_split_bytes", "requested_bytes")
POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
#: event counters kept beside the statistics (plain ints on the allocator)
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class Kind:
    """Indices of ``KINDS`` (the core's ``enum stat_kind``), for ``_stat(kind, small, delta)``."""

    ALLOCATION, SEGMENT, ACTIVE, INACTIVE_SPLIT, ALLOCATED_BYTES, RESERVED_BYTES, ACTIVE_BYTES, \
        INACTIVE_SPLIT_BYTES, REQUESTED_BYTES = range(len(KINDS))


class Stat(NamedTuple):
    """One statistic of one pool."""

    current: int
    peak: int
    allocated: int
    freed: int


def stats_dict(values: Sequence[int]) -> dict[str, int]:
    """The dotted dict from the core's flat ``_stat_values()`` (kind, then pool, then field)."""
    names = (f"{k}.{p}.{f}" for k in KINDS for p in POOLS for f in FIELDS)
    return dict(zip(names, values, strict=True))


def stat(values: Sequence[int], kind: str, pool: str = "all") -> Stat:
    """One :class:`Stat` out of the core's flat values."""
    i = (KINDS.index(kind) * len(POOLS) + POOLS.index(pool)) * len(FIELDS)
    return Stat(*values[i:i + len(FIELDS)])
