"""The ``anychip`` command: ``devices``, ``info``."""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from ._format import table as _table
from .runtime import registry
from .runtime.device import devices as selected_devices
from .runtime.env import VARIABLES, in_effect, log_level, problems, value
from .runtime.env import devices as devices_variable
from .runtime.errors import AnychipError, SelectionError
from .runtime.selection import GRAMMAR


def _mib(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _device_rows(show_all: bool) -> tuple[list[dict], list[str]]:
    env = devices_variable()
    sel = selected_devices()
    chosen = {d.name for d in sel}
    default = sel[0].name if sel else None
    rows: list[dict] = []
    notes: list[str] = []
    for b in registry.backends():
        plugin = b.plugin
        if b.available and plugin is not None:
            for i in range(b.device_count):
                name = f"{b.name}:{i}"
                if name not in chosen and not show_all:
                    continue
                try:
                    props = plugin.properties(i)
                except Exception as exc:  # noqa: BLE001
                    props = {"name": f"(properties failed: {exc})"}
                kind = "host" if not plugin.accelerator else ("simulated" if plugin.simulated else "real")
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
    for what, why in registry.refused():
        print(f"refused: {what}: {why}")
    from .paddle_provider import status as paddle_status
    pd = paddle_status(kernels=False)
    if pd["bridge"]:
        types = ", ".join(f"{t} = {b}" for b, t in pd["device_types"].items())
        print(f"\nPaddle device types: {types}; Paddle's device here: {pd['device_type'] or 'none'} "
              f"(ANYCHIP_PADDLE); {'found' if pd['found'] else 'not found'}: {pd['status']}")
    env = devices_variable()
    if env is not None and not args.all:
        print(f"\nANYCHIP_DEVICES={env!r}; `anychip devices --all` lists every backend"
              + (f" ({', '.join(notes)} hidden)" if notes else ""))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import numpy

    from .paddle_provider import main_info as paddle_info
    from .paddle_provider import status as paddle_status

    if args.cflags is not None:
        from .chips._headers import cflags
        print(cflags(args.cflags))
        return 0

    info: dict[str, Any] = {
        "anychip": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "backends": [
            {"name": b.name, "available": b.available, "simulated": b.simulated, "devices": b.device_count,
             "source": b.source, "status": b.reason}
            for b in registry.backends()
        ],
        "refused_plugins": [{"what": w, "why": y} for w, y in registry.refused()],
        "environment": {k: {"value": value(k), "default": var.default, "meaning": var.meaning}
                        for k, var in VARIABLES.items()},
        "unknown_variables": sorted(set(in_effect()) - set(VARIABLES)),
        "invalid_variables": problems(),
        "paddle": paddle_status(),
    }
    bad = info["invalid_variables"]
    if args.json:
        print(json.dumps(info, indent=2))
        return 1 if bad else 0
    for key in ("anychip", "python", "numpy", "platform"):
        print(f"{key:<9}{info[key]}")
    print()
    print("backends:")
    for b in info["backends"]:
        state = (f"{b['devices']} device(s){' (simulated)' if b['simulated'] else ''}" if b["available"]
                 else "unavailable")
        print(f"  {b['name']:<8} {state:<24} {b['status']}\n  {'':<8} from {b['source']}")
    for r in info["refused_plugins"]:
        print(f"  refused: {r['what']}: {r['why']}")
    paddle_info()
    print("\nenvironment (ANYCHIP_*):")
    for k, var in VARIABLES.items():
        v = value(k)
        print(f"  {k} = {v!r}" if v is not None else f"  {k} (unset; default {var.default})")
        if k in bad:
            print(f"      <- INVALID: {bad[k]}")
        print(f"      {var.meaning}")
    set_now = in_effect()
    for k in info["unknown_variables"]:
        print(f"  {k} = {set_now[k]!r}   <- not a variable anychip knows; check the spelling")
    for k, why in bad.items():
        print(f"anychip: error: {k}={set_now[k]!r} is invalid: {why}", file=sys.stderr)
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anychip", description="anychip: one runtime API over many chips")
    p.add_argument("--version", action="version", version=f"anychip {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("devices", help="list backends and devices (honours ANYCHIP_DEVICES)",
                       epilog=GRAMMAR + ". Backend names match in any case; device types (gpu, ...) and "
                              "sub-devices (0.1) of oneAPI's selector are not supported.")
    d.add_argument("--all", action="store_true", help="list every backend and device, selected or not")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_devices)
    i = sub.add_parser("info", help="version, Python, backends and the ANYCHIP_* variables in effect")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--cflags", metavar="BACKEND", help="print the compiler and linker flags that build a C program "
                   "written for BACKEND's vendor API (ascend, kunlun or hygon) against the library it uses")
    i.set_defaults(func=cmd_info)
    from .collectives.launch import add_parser as add_launch_parser
    add_launch_parser(sub)
    from .conformance.command import add_parser as add_conformance_parser
    add_conformance_parser(sub)
    from .scaffold import add_parser as add_plugin_parser
    add_plugin_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    raw = value("ANYCHIP_LOG_LEVEL")
    level = log_level(raw)
    if level is None:
        print(f"anychip: warning: ignoring ANYCHIP_LOG_LEVEL={raw!r}: want one of DEBUG, INFO, WARNING, ERROR, "
              "CRITICAL; using WARNING", file=sys.stderr)
        level = logging.WARNING
    if args.verbose:
        level = logging.DEBUG if args.verbose > 1 else logging.INFO
    logging.basicConfig(level=level, format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AnychipError as exc:
        # the first paragraph of an anychip error is the whole message; the rest
        # (grammar, backend list) is shown with -v
        first, _, detail = str(exc).partition("\n\n")
        print(f"anychip: error: {first}", file=sys.stderr)
        if detail and args.verbose:
            print(detail, file=sys.stderr)
        elif isinstance(exc, SelectionError):
            print("anychip: `anychip devices --help` shows the ANYCHIP_DEVICES grammar, "
                  "`anychip devices --all` every backend", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
