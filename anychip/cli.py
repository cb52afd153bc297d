"""The ``anychip`` command: ``devices``, ``info``."""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .runtime import registry
from .runtime.device import devices as selected_devices
from .runtime.env import VARIABLES, in_effect
from .runtime.errors import AnychipError


def _mib(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(line.rstrip() for line in out)


def _device_rows(show_all: bool) -> tuple[list[dict], list[str]]:
    env = os.environ.get("ANYCHIP_DEVICES")
    sel = selected_devices()
    chosen = {d.name for d in sel}
    default = sel[0].name if sel else None
    rows: list[dict] = []
    notes: list[str] = []
    for b in registry.backends():
        if b.available:
            for i in range(b.device_count):
                name = f"{b.name}:{i}"
                if name not in chosen and not show_all:
                    continue
                try:
                    props = b.plugin.properties(i)
                except Exception as exc:  # noqa: BLE001
                    props = {"name": f"(properties failed: {exc})"}
                kind = "host" if not b.plugin.accelerator else ("simulated" if b.plugin.simulated else "real")
                status = "default" if name == default else ("selected" if name in chosen else "not selected")
                rows.append({"device": name, "kind": kind, "name": str(props.get("name", "")),
                             "memory": props.get("total_memory"), "status": status})
        elif env is None or show_all:
            rows.append({"device": f"{b.name}:-", "kind": "-", "name": "-", "memory": None,
                         "status": f"unavailable: {b.reason}"})
        else:
            notes.append(f"{b.name} (unavailable)")
    return rows, notes


def cmd_devices(args: argparse.Namespace) -> int:
    rows, notes = _device_rows(args.all)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_table([[r["device"], r["kind"], r["name"], _mib(r["memory"]), r["status"]] for r in rows],
                 ["DEVICE", "KIND", "NAME", "MEMORY", "STATUS"]))
    env = os.environ.get("ANYCHIP_DEVICES")
    if env is not None and not args.all:
        print(f"\nANYCHIP_DEVICES={env!r}; `anychip devices --all` lists every backend"
              + (f" ({', '.join(notes)} hidden)" if notes else ""))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import numpy

    info = {
        "anychip": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "backends": [
            {"name": b.name, "available": b.available, "simulated": b.simulated, "devices": b.device_count,
             "source": b.source, "status": b.reason}
            for b in registry.backends()
        ],
        "environment": {k: {"value": os.environ.get(k), "default": d, "meaning": m} for k, (d, m) in VARIABLES.items()},
        "unknown_variables": sorted(set(in_effect()) - set(VARIABLES)),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key in ("anychip", "python", "numpy", "platform"):
        print(f"{key:<9}{info[key]}")
    print()
    print("backends:")
    for b in info["backends"]:
        state = (f"{b['devices']} device(s){' (simulated)' if b['simulated'] else ''}" if b["available"]
                 else "unavailable")
        print(f"  {b['name']:<8} {state:<24} {b['status']}\n  {'':<8} from {b['source']}")
    print("\nenvironment (ANYCHIP_*):")
    for k, (d, m) in VARIABLES.items():
        v = os.environ.get(k)
        print(f"  {k} = {v!r}" if v is not None else f"  {k} (unset; default {d})")
        print(f"      {m}")
    for k in info["unknown_variables"]:
        print(f"  {k} = {os.environ[k]!r}   <- not a variable anychip knows; check the spelling")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anychip", description="anychip: one runtime API over many chips")
    p.add_argument("--version", action="version", version=f"anychip {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("devices", help="list backends and devices (honours ANYCHIP_DEVICES)")
    d.add_argument("--all", action="store_true", help="list every backend and device, selected or not")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_devices)
    i = sub.add_parser("info", help="version, Python, backends and the ANYCHIP_* variables in effect")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_info)
    from .collectives.launch import add_parser as add_launch_parser
    add_launch_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = os.environ.get("ANYCHIP_LOG_LEVEL", "WARNING").upper()
    if args.verbose:
        level = "DEBUG" if args.verbose > 1 else "INFO"
    logging.basicConfig(level=getattr(logging, level, logging.WARNING), format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AnychipError as exc:
        print(f"anychip: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
