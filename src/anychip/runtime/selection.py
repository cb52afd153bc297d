"""The ``ANYCHIP_DEVICES`` grammar (after oneAPI's ``ONEAPI_DEVICE_SELECTOR``).

    ANYCHIP_DEVICES = term[;term...]
    term            = [!]backend:devices       (a bare "backend" means "backend:*")
    backend         = a backend name | *       (case-insensitive)
    devices         = device[,device...]
    device          = N | *                    (N: ASCII digits)

Accepting terms are taken in order; their order is the priority order and the
first device selected is the default device. Discard terms (``!``) must come
after every accepting term and win over them; a value made only of discard
terms means "every available device but these". Device indices are the
backend's own numbering (after the vendor's visibility variable); they are not
renumbered by the selection. Naming an unavailable backend explicitly is an
error that says why it is unavailable; ``*`` skips unavailable backends.

Deliberate differences from oneAPI: a bare backend name (``cpu``) and a bare
``*`` are accepted (oneAPI requires ``:devices``); blanks around names and
indices are ignored; device types (``gpu``, ``cpu``, ``acc``, ``fpga``...) and
sub-devices (``0.1``, ``*.*``) are refused as "not supported by anychip".
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .errors import SelectionError

__all__ = ["parse", "select", "Term", "GRAMMAR"]

GRAMMAR = (
    "ANYCHIP_DEVICES is a ';'-separated list of terms, term = [!]backend:devices, "
    "backend = a backend name (any case) or *, devices = N or * or a ','-separated list of them; "
    "discard terms (!) come last; the first device listed is the default. Examples: "
    "ANYCHIP_DEVICES='ascend:0,1;cpu:*', ANYCHIP_DEVICES='*:*;!opencl:*'"
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_INDEX = re.compile(r"^[0-9]+$")
_SUB_DEVICE = re.compile(r"^([0-9]+|\*)(\.([0-9]+|\*)){1,2}$")
#: oneAPI's device types (ONEAPI_DEVICE_SELECTOR accepts them in place of indices)
_DEVICE_TYPES = frozenset({"cpu", "gpu", "acc", "fpga", "npu", "mca", "vpu", "host"})


class _Backend(Protocol):
    name: str
    available: bool
    reason: str
    device_count: int


@dataclass(frozen=True)
class Term:
    text: str
    discard: bool
    backend: str            # a name in lower case, or "*"
    indices: tuple[int, ...] | None   # None = every device
    written: str = ""       # the backend name as written (for messages)


def _known(backends: Sequence[_Backend]) -> str:
    lines = []
    for b in backends:
        if b.available:
            lines.append(f"    {b.name}: {b.device_count} device{'s' if b.device_count != 1 else ''}")
        else:
            lines.append(f"    {b.name}: unavailable ({b.reason})")
    return "known backends:\n" + ("\n".join(lines) if lines else "    none")


def _names(backends: Sequence[_Backend]) -> str:
    return ", ".join(b.name for b in backends) or "none"


def _error(value: str, term: str, problem: str, backends: Sequence[_Backend]) -> SelectionError:
    """First paragraph: the whole message on one line; second: the grammar and the backends."""
    return SelectionError(
        f"bad ANYCHIP_DEVICES={value!r}: term {term!r}: {problem}\n\n  {GRAMMAR}\n  {_known(backends)}")


def _device_problem(item: str) -> str:
    """Why ``item`` is not a device of the grammar (it is not N or *)."""
    if not item:
        return "empty device entry (a stray ',')"
    if item.lower() in _DEVICE_TYPES:
        return (f"device type {item!r} is not supported by anychip; select devices by index "
                "(N, N,M or *)")
    if _SUB_DEVICE.match(item):
        return f"sub-device {item!r} is not supported by anychip; select whole devices (N or *)"
    return f"device {item!r} is not an index (ASCII digits) or *"


def _indices(devs: str) -> tuple[tuple[int, ...] | None, str | None]:
    """(indices or None for every device, None) or (None, the problem)."""
    items = [d.strip() for d in devs.split(",")]
    for item in items:
        if item != "*" and not _INDEX.match(item):
            return None, _device_problem(item)
    if "*" in items:
        return None, None
    return tuple(dict.fromkeys(int(d) for d in items)), None


def parse(value: str, backends: Sequence[_Backend] = ()) -> list[Term]:
    """Split ``value`` into terms, checking the syntax (not the backends)."""
    raw_terms = value.split(";")
    if raw_terms and raw_terms[-1].strip() == "" and len(raw_terms) > 1:
        raw_terms = raw_terms[:-1]          # one trailing ';' is tolerated
    terms: list[Term] = []
    seen_discard = False
    for raw in raw_terms:
        text = raw.strip()
        if not text:
            raise _error(value, raw, "empty term", backends)
        discard = text.startswith("!")
        body = text[1:].strip() if discard else text
        if discard and not body:
            raise _error(value, text, "'!' must be followed by backend:devices", backends)
        if body.count(":") > 1:
            raise _error(value, text, "more than one ':' (write backend:devices)", backends)
        name, colon, devs = body.partition(":")
        name, devs = name.strip(), devs.strip()
        if not name:
            raise _error(value, text, "missing backend name before ':'", backends)
        if name != "*" and not _NAME.match(name):
            raise _error(value, text, f"{name!r} is not a backend name", backends)
        if colon and not devs:
            raise _error(value, text, "missing devices after ':' (use *, N or N,M,...)", backends)
        indices, problem = _indices(devs) if colon else (None, None)
        if problem:
            raise _error(value, text, problem, backends)
        if discard:
            seen_discard = True
        elif seen_discard:
            raise _error(value, text, "accepting terms must come before every discard term (!)", backends)
        terms.append(Term(text=text, discard=discard, backend=name.lower(), indices=indices, written=name))
    return terms


def _accept(value: str, term: Term, by_name: dict[str, _Backend], usable: list[_Backend],
            backends: Sequence[_Backend]) -> list[tuple[str, int]]:
    """The devices one accepting term selects, in order."""
    if term.backend == "*":
        targets = usable
    else:
        b = by_name.get(term.backend)
        if b is None:
            raise _error(value, term.text, f"unknown backend {term.written!r} (known: {_names(backends)})", backends)
        if not b.available:
            raise _error(value, term.text, f"backend {b.name!r} is unavailable: {b.reason}", backends)
        targets = [b]
    chosen: list[tuple[str, int]] = []
    for b in targets:
        if term.indices is None:
            chosen.extend((b.name, i) for i in range(b.device_count))
            continue
        for i in term.indices:
            if i < b.device_count:
                chosen.append((b.name, i))
            elif term.backend != "*":
                raise _error(value, term.text,
                             f"{b.name} has {b.device_count} device{'s' if b.device_count != 1 else ''} "
                             f"(indices 0..{b.device_count - 1}), there is no {b.name}:{i}", backends)
    return chosen


def select(value: str | None, backends: Sequence[_Backend]) -> list[tuple[str, int]]:
    """The selected devices as (backend name, index), in priority order.

    ``backends`` must already be in default priority order; it is what an unset
    or discard-only value draws from.
    """
    by_name = {b.name.lower(): b for b in backends}
    usable = [b for b in backends if b.available]
    everything = [(b.name, i) for b in usable for i in range(b.device_count)]
    if value is None or not value.strip():
        if not everything:
            raise SelectionError(f"no device is available\n\n  {_known(backends)}")
        return everything
    terms = parse(value, backends)
    accepting = [t for t in terms if not t.discard]
    chosen: list[tuple[str, int]] = [] if accepting else list(everything)
    for term in accepting:
        chosen.extend(_accept(value, term, by_name, usable, backends))
    for term in terms:
        if not term.discard:
            continue
        if term.backend != "*" and term.backend not in by_name:
            raise _error(value, term.text, f"unknown backend {term.written!r} (known: {_names(backends)})",
                         backends)
        chosen = [(n, i) for n, i in chosen
                  if not ((term.backend == "*" or term.backend == n.lower())
                          and (term.indices is None or i in term.indices))]
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise SelectionError(f"ANYCHIP_DEVICES={value!r} selects no device\n\n  {_known(backends)}")
    return chosen
