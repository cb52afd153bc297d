"""Reports: nccl-tests-style tables, the named cases, the summary, JSON and the plot.

A backend's result (from :func:`.runner.run_backend`) is a dict: ``backend``, ``kind``
(real, simulated, host), ``simulated``, ``ranks``, ``device``, ``transport``,
``seconds``, ``exit_code``, ``unavailable`` (the reason, when it could not run),
``cases`` (one per named case: ``name``, ``group``, ``status``, ``detail``,
``expected``, ``got``, ``seconds``, ``rank``) and ``rows`` (one per table line:
``op``, ``size``, ``count``, ``dtype``, ``redop``, ``root``, ``status``, and per
placement ``oop`` / ``ip``: ``time_us``, ``algbw``, ``busbw``, ``wrong``; or ``error``).
"""
from __future__ import annotations

import json
from typing import Any

from .._format import table as _table
from .cases import OPS

__all__ = ["tables", "cases_report", "summary", "counts", "verdict", "avg_busbw", "write_json", "plot"]


def counts(result: dict) -> dict[str, int]:
    cs = result.get("cases", [])
    return {"run": len(cs), "passed": sum(c["status"] == "passed" for c in cs),
            "failed": sum(c["status"] == "failed" for c in cs), "skipped": sum(c["status"] == "skipped" for c in cs)}


def verdict(result: dict) -> str:
    if "unavailable" in result:
        return "UNAVAILABLE"
    c = counts(result)
    return "FAIL" if c["failed"] or result.get("exit_code") or not c["run"] else "PASS"


def avg_busbw(rows: list[dict]) -> float | None:
    """Mean busbw over every measured row and placement (nccl-tests' "Avg bus bandwidth")."""
    vals = [r[p]["busbw"] for r in rows for p in ("oop", "ip") if p in r]
    return sum(vals) / len(vals) if vals else None


def _fmt_place(d: dict | None) -> str:
    if d is None:
        return f"{'n/a':>9} {'':>7} {'':>7} {'':>6}"
    return f"{d['time_us']:>9.1f} {d['algbw']:>7.3f} {d['busbw']:>7.3f} {d['wrong']:>6d}"


_HEAD = ("#{:>11} {:>12} {:>9} {:>6} {:>5}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}")


def tables(result: dict) -> str:
    """Per collective, the nccl-tests table: size, count, type, redop, root, then time, algbw,
    busbw and #wrong out of place and in place; a footer with the average busbw and the verdict."""
    out = []
    by_op: dict[str, list[dict]] = {}
    for r in result.get("rows", []):
        by_op.setdefault(r["op"], []).append(r)
    for op in OPS:
        rows = by_op.get(op)
        if not rows:
            continue
        out.append(f"# {op}: {result['ranks']} ranks on {result.get('device', result['backend'])} "
                   f"via {result.get('transport', '?')}")
        out.append("#" + " " * 54 + f"{'out-of-place':^33}  {'in-place':^33}".rstrip())
        out.append(_HEAD.format("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                                "time", "algbw", "busbw", "#wrong"))
        out.append(_HEAD.format("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                                "(GB/s)", "").rstrip())
        for r in rows:
            head = f"{r['size']:>12} {r['count']:>12} {r['dtype']:>9} {r['redop']:>6} {r['root']:>5}"
            if "error" in r:
                out.append(f"{head}  {r['status'].upper()}: {r['error']}")
            else:
                out.append(f"{head}  {_fmt_place(r.get('oop'))}  {_fmt_place(r.get('ip'))}".rstrip())
        bw = avg_busbw(rows)
        wrong = sum(r.get(p, {}).get("wrong", 0) for r in rows for p in ("oop", "ip"))
        bad = sum(r["status"] == "failed" for r in rows)
        out.append(f"# Avg bus bandwidth    : {bw:.3f} GB/s" if bw is not None else "# Avg bus bandwidth    : -")
        out.append(f"# #wrong               : {wrong} in {len(rows)} rows")
        out.append(f"# Verdict              : {'FAIL' if bad else 'PASS'}"
                   + (f" ({bad} rows failed)" if bad else "") + "\n")
    return "\n".join(out)


def cases_report(result: dict, only_problems: bool = False) -> str:
    """The named cases: name, result, time, and for a failure what was expected and what came."""
    lines = []
    for c in result.get("cases", []):
        if only_problems and c["status"] != "failed":
            continue
        mark = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[c["status"]]
        line = f"  {c['group']:<10} {c['name']:<18} {mark:<5} {c['seconds']:6.2f} s"
        if c["status"] == "failed":
            line += f"\n      {c['detail']}"
            if c.get("expected") or c.get("got"):
                line += f"\n      expected: {c['expected']}\n      got:      {c['got']}"
        elif c["status"] == "skipped":
            line += f"  ({c['detail']})"
        lines.append(line)
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    """One line per backend: real or simulated, cases run / passed / failed / skipped, average
    busbw, time and verdict (an unavailable backend with its reason)."""
    rows = []
    for res in results:
        if "unavailable" in res:
            rows.append([res["backend"], "-", "-", "-", "-", "-", "-", "-", "-", f"unavailable: {res['unavailable']}"])
            continue
        c = counts(res)
        bw = avg_busbw(res["rows"])
        rows.append([res["backend"], res.get("kind", "?"), str(res["ranks"]), str(c["run"]), str(c["passed"]),
                     str(c["failed"]), str(c["skipped"]), f"{bw:.3f}" if bw is not None else "-",
                     f"{res.get('seconds', 0):.1f} s", verdict(res)])
    return _table(rows, ["BACKEND", "KIND", "RANKS", "CASES", "PASSED", "FAILED", "SKIPPED", "BUSBW GB/s", "TIME",
                         "VERDICT"])


def write_json(path: str, results: list[dict], config: dict) -> None:
    from .. import __version__
    doc: dict[str, Any] = {"anychip": __version__, "config": config,
                           "passed": all(verdict(r) in ("PASS", "UNAVAILABLE") for r in results),
                           "backends": [{**r, "verdict": verdict(r), "counts": counts(r),
                                         "avg_busbw": avg_busbw(r.get("rows", []))} for r in results]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def plot(path: str, results: list[dict]) -> None:
    """busbw against size, one line per collective (out of place), one panel per backend."""
    from ..runtime.errors import UnsupportedError
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib: pip install 'anychip[plot]'") from None
    ran = [r for r in results if r.get("rows")]
    fig, axes = plt.subplots(1, max(1, len(ran)), figsize=(6 * max(1, len(ran)), 4.5), squeeze=False)
    for ax, res in zip(axes[0], ran or [{}], strict=False):
        for op in OPS:
            rows = [r for r in res.get("rows", []) if r["op"] == op and "oop" in r]
            first = (rows[0]["dtype"], rows[0]["redop"], rows[0]["root"]) if rows else None
            # the size sweep: the rows of the first (dtype, redop, root), without the coverage sizes
            sweep = [r for r in rows if (r["dtype"], r["redop"], r["root"]) == first]
            cut = next((i for i in range(1, len(sweep)) if sweep[i]["size"] <= sweep[i - 1]["size"]), len(sweep))
            pts = [(r["size"], r["oop"]["busbw"]) for r in sweep[:cut]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=op)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s), out of place")
        ax.set_title(f"{res.get('backend', '')}: {res.get('ranks', '')} ranks via {res.get('transport', '')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
