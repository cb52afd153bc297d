"""Reshard planning: the collective for each placement change, one mesh axis at a time.

| from \\ to   | Replicate   | Shard(j)                    | Partial(op)              |
|-------------|-------------|-----------------------------|--------------------------|
| Replicate   | -           | slice (local)               | to_partial (local)       |
| Shard(i)    | all_gather  | all_to_all (i != j)         | all_gather, to_partial   |
| Partial(op) | all_reduce  | reduce_scatter              | all_reduce, to_partial   |

Nested shards: when several axes shard one tensor dimension, axis a's chunk is a
chunk of the chunks of the axes before it. A step on axis a that touches dimension d
is therefore only done while no later axis shards d; otherwise the latest such axis is
gathered first (and sliced again when its target asks for it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .placement import Partial, Placement, Replicate, Shard


@dataclass(frozen=True)
class Step:
    """One collective (or local) step on one mesh axis."""
    axis: int
    kind: str           # all_reduce, all_gather, slice, reduce_scatter, all_to_all, to_partial
    src: Placement
    dst: Placement


def transition(src: Placement, dst: Placement) -> list[tuple[str, Placement, Placement]]:
    """The steps that take one mesh axis from ``src`` to ``dst``."""
    if src == dst:
        return []
    r = Replicate()
    if isinstance(dst, Replicate):
        return [("all_reduce" if isinstance(src, Partial) else "all_gather", src, dst)]
    if isinstance(dst, Shard):
        kind = {Replicate: "slice", Partial: "reduce_scatter", Shard: "all_to_all"}[type(src)]
        return [(kind, src, dst)]
    # to Partial: through Replicate unless already there
    if isinstance(src, Replicate):
        return [("to_partial", src, dst)]
    return transition(src, r) + [("to_partial", r, dst)]


def _dims(*ps: Placement) -> set[int]:
    return {p.dim for p in ps if isinstance(p, Shard)}


def _blocked(cur: Sequence[Placement], axis: int, dims: set[int]) -> list[int]:
    """Later axes that shard one of ``dims``."""
    return [b for b in range(axis + 1, len(cur)) if _dims(cur[b]) & dims]


def plan(src: Sequence[Placement], dst: Sequence[Placement]) -> list[Step]:
    """The steps from placements ``src`` to ``dst`` (same mesh), last mesh axis first."""
    cur = list(src)
    steps: list[Step] = []
    for _ in range(4 * len(cur) + 4):
        pending = [a for a in reversed(range(len(cur))) if cur[a] != dst[a]]
        if not pending:
            return steps
        ready = [a for a in pending if not _blocked(cur, a, _dims(cur[a], dst[a]))]
        # a new shard on dimension d waits while an earlier axis still has to move d
        preferred = [a for a in ready if not any(_dims(dst[a]) & _dims(cur[e], dst[e]) for e in pending if e < a)]
        blocked = [a for a in pending if a not in ready]
        if preferred or not blocked:
            a = (preferred or ready)[0]
            steps += [Step(a, k, s, d) for k, s, d in transition(cur[a], dst[a])]
            cur[a] = dst[a]
        else:
            # an axis waits for a later axis sharding the same dimension: gather the last of
            # those (nothing after it shards that dimension, so this is always possible)
            a = blocked[0]
            b = max(_blocked(cur, a, _dims(cur[a], dst[a])))
            steps.append(Step(b, "all_gather", cur[b], Replicate()))
            cur[b] = Replicate()
    raise AssertionError(f"reshard plan from {list(src)} to {list(dst)} did not converge")
