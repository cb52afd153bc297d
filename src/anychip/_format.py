"""Plain-text tables, as `anychip devices` and the conformance summary print them."""
from __future__ import annotations


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns two blanks apart, a rule of dashes under the header."""
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(line.rstrip() for line in out)
