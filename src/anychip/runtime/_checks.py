"""Argument checks shared by the front ends (one rule, one wording)."""
from __future__ import annotations

from typing import Any

from .errors import InvalidArgumentError


def non_negative_int(value: Any, what: str) -> int:
    """``value`` as an int >= 0 (NumPy integers and other ``__index__`` types accepted;
    ``bool`` is an int, as in Python), or InvalidArgumentError naming ``what``."""
    if type(value) is not int:
        try:
            value = value.__index__()
        except (AttributeError, TypeError):
            raise InvalidArgumentError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None
    if value < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, got {value}")
    return value
