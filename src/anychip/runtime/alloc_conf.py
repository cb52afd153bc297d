"""``ANYCHIP_ALLOC_CONF``: the caching allocator's knobs, in PyTorch's syntax
(``PYTORCH_CUDA_ALLOC_CONF``)::

    max_split_size_mb:64,garbage_collection_threshold:0.8,roundup_power2_divisions:4
    roundup_power2_divisions:[256:1,512:2,>:4]
    backend:native

Numbers are plain ASCII digits (no signs, ``_`` separators or other scripts'
digits); each key and each interval bound may be given once.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from .errors import InvalidArgumentError

__all__ = ["ENV_VAR", "AllocatorConf", "ROUNDUP_POWER2_INTERVALS"]

ENV_VAR = "ANYCHIP_ALLOC_CONF"
ROUNDUP_POWER2_INTERVALS = 16   # intervals of roundup_power2_divisions: [1 MiB, 2 MiB), ... [32 GiB, 64 GiB)
MIN_MAX_SPLIT_MB = 20           # max_split_size_mb must exceed the large segment size (20 MiB)

_HELP = (
    "valid keys: backend (caching or native), max_split_size_mb (integer MiB > 20), "
    "garbage_collection_threshold (number in (0, 1)), roundup_power2_divisions "
    "(power of 2, or per size interval like [256:1,512:2,>:4]); "
    f"example: {ENV_VAR}=max_split_size_mb:64,garbage_collection_threshold:0.8"
)
_INT = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def _error(item: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{ENV_VAR}: bad item {item!r}: {why}; {_HELP}")


def _split_items(text: str) -> list[str]:
    """Split on the commas that are not inside [...]."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _error(text, "unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _error(text, "unbalanced '['")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _integer(item: str, text: str, what: str = "an integer") -> int:
    if not _INT.fullmatch(text):
        raise _error(item, f"{text!r} is not {what} (plain digits 0-9)")
    return int(text)


def _power_of_2(item: str, text: str) -> int:
    n = _integer(item, text)
    if n <= 0 or n & (n - 1):
        raise _error(item, f"{n} is not a power of 2")
    return n


def _divisions(item: str, value: str) -> tuple[int, ...] | None:
    """roundup_power2_divisions: one power of 2, or [size_mb:divisions,...,>:divisions]."""
    if not value.startswith("["):
        one = _power_of_2(item, value)
        return None if one == 1 else (one,) * ROUNDUP_POWER2_INTERVALS
    if not value.endswith("]"):
        raise _error(item, "expected [size_mb:divisions,...,>:divisions]")
    divs = [0] * ROUNDUP_POWER2_INTERVALS
    done = 0                                  # intervals below this index are set
    bounds: set[str] = set()
    for part in value[1:-1].split(","):
        bound, sep, count = (s.strip() for s in part.partition(":"))
        if not sep:
            raise _error(item, f"{part.strip()!r} is not size_mb:divisions")
        if bound in bounds:
            raise _error(item, f"bound {bound!r} is given twice")
        bounds.add(bound)
        n = _power_of_2(item, count)
        if bound == ">":
            end = ROUNDUP_POWER2_INTERVALS
        else:
            end = min(_power_of_2(item, bound).bit_length() - 1, ROUNDUP_POWER2_INTERVALS)
            if end <= done and done:
                raise _error(item, "interval bounds must increase")
        divs[done:end] = [n] * max(end - done, 0)
        done = max(done, end)
    return None if all(d <= 1 for d in divs) else tuple(divs)


def _backend(item: str, value: str) -> str:
    if value not in ("caching", "native"):
        raise _error(item, f"backend must be caching or native, not {value!r}")
    return value


def _max_split(item: str, value: str) -> int:
    mb = _integer(item, value, "an integer number of MiB")
    if mb <= MIN_MAX_SPLIT_MB:
        raise _error(item, f"max_split_size_mb must be > {MIN_MAX_SPLIT_MB}, got {mb}")
    return mb << 20


def _gc_threshold(item: str, value: str) -> float:
    if not _DECIMAL.fullmatch(value):
        raise _error(item, f"{value!r} is not a number (like 0.8)")
    t = float(value)
    if not 0.0 < t < 1.0:
        raise _error(item, f"garbage_collection_threshold must be in (0, 1), got {value}")
    return t


# key -> (attribute, parser of the value)
_KEYS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "backend": ("backend", _backend),
    "max_split_size_mb": ("max_split_size", _max_split),
    "garbage_collection_threshold": ("garbage_collection_threshold", _gc_threshold),
    "roundup_power2_divisions": ("roundup_power2_divisions", _divisions),
}


class AllocatorConf:
    """The allocator's knobs. ``AllocatorConf.parse(text)`` reads ``ANYCHIP_ALLOC_CONF``."""

    __slots__ = ("backend", "max_split_size", "garbage_collection_threshold", "roundup_power2_divisions")

    KEYS = tuple(_KEYS)

    def __init__(self, backend: str = "caching", max_split_size: int | None = None,
                 garbage_collection_threshold: float | None = None,
                 roundup_power2_divisions: tuple[int, ...] | None = None) -> None:
        self.backend = _backend(f"backend:{backend}", backend)
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
        seen: set[str] = set()
        for item in _split_items(text.strip()):
            key, sep, value = (s.strip() for s in item.partition(":"))
            if not sep or not key or not value:
                raise _error(item, "expected key:value")
            if key not in _KEYS:
                raise _error(item, f"unknown key {key!r}")
            if key in seen:
                raise _error(item, f"{key} is given twice")
            seen.add(key)
            attr, parse_value = _KEYS[key]
            setattr(conf, attr, parse_value(item, value))
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
