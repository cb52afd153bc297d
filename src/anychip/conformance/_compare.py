"""What the framework compute checks share: comparing a program's results on the device with
the same program's on the framework's CPU, and turning a check into a report line."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

Report = Callable[[str, bool, str], None]


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400]


def compare(got: Any, want: Any, same: Callable[[Any, Any], str]) -> str:
    """'' when each of ``got`` (device results) matches ``want`` (the CPU's) by ``same``, a
    function of one pair that says what differs ('' when nothing), else the first difference."""
    gs = got if isinstance(got, (list, tuple)) else [got]
    ws = want if isinstance(want, (list, tuple)) else [want]
    if len(gs) != len(ws):
        return f"{len(gs)} results, want {len(ws)}"
    for i, (g, w) in enumerate(zip(gs, ws, strict=True)):
        if g is None or w is None:
            if (g is None) != (w is None):
                return f"result {i}: {g!r}, want {w!r}"
            continue
        problem = same(g, w)
        if problem:
            return f"result {i}: {problem}"
    return ""


def check(report: Report, name: str, fn: Callable[[], str]) -> None:
    """Runs one check (``fn`` says what is wrong, '' when nothing) and reports it; an exception
    raised on the device is the check's failure."""
    try:
        problem = fn()
    except Exception as exc:  # noqa: BLE001 - an error on the device is the check's failure
        problem = f"{type(exc).__name__}: {one_line(exc)}"
    report(name, not problem, problem)
