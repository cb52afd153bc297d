"""What the conformance cases share with one another: their outcomes (a failure that says what
was expected and what came, a skip), byte comparisons and patterns, communicators made under
given variables, and whether an error names a rank."""
from __future__ import annotations

import os
from typing import Any

import numpy as np


class Failure(Exception):
    """A case failed: what was expected and what came."""

    def __init__(self, what: str, expected: Any, got: Any) -> None:
        super().__init__(f"{what}: expected {expected}, got {got}")
        self.what, self.expected, self.got = what, str(expected), str(got)


class Skip(Exception):
    """The backend does not support what the case checks (the reason is the message)."""


def _same(what: str, got: np.ndarray, expect: np.ndarray) -> None:
    if got.shape != expect.shape or not np.array_equal(got, expect):
        bad = np.flatnonzero(got != expect) if got.shape == expect.shape else np.array([0])
        i = int(bad[0])
        raise Failure(f"{what} ({len(bad)} bytes differ, first at {i})", f"byte {int(expect.flat[i])}",
                      f"byte {int(got.flat[i])}" if got.size > i else f"{got.size} bytes")


def _pattern(n: int, salt: int) -> np.ndarray:
    return np.resize(np.roll(np.arange(251, dtype=np.uint8), salt % 251), n)


def _comm_with(env: dict[str, str]) -> Any:
    """A new communicator of every rank, made while ``env`` is in effect."""
    from .. import collectives
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return collectives.init()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def names_rank(message: str, rank: int) -> bool:
    """Whether an error message names ``rank`` (as "rank 3", "peer 3", "ranks [1, 3]", ...): the
    library's own words are its business, the rank is what is checked."""
    import re
    return re.search(rf"(?<![\w.]){rank}(?![\w.])", message) is not None
