"""``anychip conformance``: certify a backend's device API and collectives.

With no arguments: a quick pass on every available backend with 2 ranks, then a summary
table. ``--device NAME`` runs one backend (or a comma list) and prints the nccl-tests
tables. Exits 1 when any case fails.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from typing import Any

from ._stop import Stopped
from .cases import DTYPES, OPS, REDOPS, Config, parse_size

__all__ = ["add_parser", "config_from_args", "run"]

QUICK = Config()
FULL = Config(min_bytes=8, max_bytes=64 << 20, factor=2, iters=10, warmup=2, checks=3,
              boundary=(4 << 20, 12 << 20), boundary_dtypes=DTYPES, largest_copy=(64 << 20) + 1, mode="full")


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    from ..runtime.errors import InvalidArgumentError
    if text.strip().lower() == "all":
        return known
    names = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in known]
    if bad or not names:
        raise InvalidArgumentError(f"{what} {', '.join(bad) or repr(text)} unknown; use all or a comma list of "
                                   f"{', '.join(known)}")
    return names


def _roots(text: str, ranks: int) -> tuple[int, ...] | None:
    from ..runtime.errors import InvalidArgumentError
    if text.strip().lower() == "all":
        return None
    try:
        root = int(text)
    except ValueError:
        raise InvalidArgumentError(f"--root {text!r}: want all or a rank number") from None
    if not 0 <= root < ranks:
        raise InvalidArgumentError(f"--root {root} is out of range for {ranks} ranks (0..{ranks - 1})")
    return (root,)


def _sizes(cfg: Config, args: argparse.Namespace) -> None:
    from ..runtime.errors import InvalidArgumentError
    if args.minbytes is not None:
        cfg.min_bytes = parse_size(args.minbytes)
    if args.maxbytes is not None:
        cfg.max_bytes = parse_size(args.maxbytes)
    if args.stepfactor is not None:
        cfg.factor = args.stepfactor
    if cfg.min_bytes < 1 or cfg.max_bytes < cfg.min_bytes or cfg.factor < 1:
        raise InvalidArgumentError(f"conformance: want 1 <= -b ({cfg.min_bytes}) <= -e ({cfg.max_bytes}) and "
                                   f"-f >= 1 ({cfg.factor})")


#: ranks of one communicator of the collective engine (CCL_MAX_RANKS, csrc/ccl/ccl.h)
MAX_RANKS = 64


def _check_output(flag: str, path: str | None) -> None:
    """An output file must be writable before the run, not found unwritable after it: it is
    opened (created when missing) here, as the run will (``os.access`` says yes to root for
    files that cannot be made, as in /proc)."""
    import os

    from ..runtime.errors import InvalidArgumentError
    if path is None:
        return
    if not path:
        raise InvalidArgumentError(f"conformance: {flag} needs a file name")
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidArgumentError(f"conformance: {flag} {path} is a directory; give a file name")
    if not os.path.isdir(where):
        raise InvalidArgumentError(f"conformance: {flag} {path}: the directory {where} does not exist")
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise InvalidArgumentError(f"conformance: {flag} {path} cannot be written: {exc.strerror or exc}") from None


def _write_output(flag: str, path: str, write: Any) -> None:
    """``write(path)``; a failure (a full disk, /dev/full) is an error naming the file, not a traceback."""
    from ..runtime.errors import AnychipError
    try:
        write(path)
    except OSError as exc:
        raise AnychipError(f"conformance: writing {flag} {path} failed: {exc.strerror or exc} (the results above "
                           "are complete)") from None


def config_from_args(args: argparse.Namespace) -> Config:
    """The run's Config: ``--quick`` (default) or ``--full`` defaults, then every flag given."""
    from ..runtime.errors import InvalidArgumentError
    cfg = replace(FULL if args.full else QUICK, ranks=args.nprocs or QUICK.ranks)
    if args.nprocs is not None and not 1 <= args.nprocs <= MAX_RANKS:
        raise InvalidArgumentError(f"conformance: -n must be from 1 to {MAX_RANKS} (the collective engine's limit), "
                                   f"got {args.nprocs}")
    for flag in ("json", "plot"):
        _check_output(f"--{flag}", getattr(args, flag, None))
    _sizes(cfg, args)
    if args.collective is not None:
        cfg.ops = _names(args.collective, OPS, "collective")
    explicit = False
    if args.op is not None:
        cfg.redops, explicit = _names(args.op, REDOPS, "reduce op"), True
    if args.dtype is not None:
        aliases = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16"}
        raw = ",".join(aliases.get(t.strip().lower(), t) for t in args.dtype.split(","))
        cfg.dtypes, explicit = _names(raw, DTYPES, "dtype"), True
    if args.root is not None:
        cfg.roots, explicit = _roots(args.root, cfg.ranks), True
    if explicit:
        cfg.coverage = cfg.boundary = ()          # the rows are exactly the ones asked for
    for name in ("iters", "warmup", "timeout", "deadline"):
        v = getattr(args, name)
        if v is not None:
            if not (v >= 0 and math.isfinite(v)):          # (nan is neither < 0 nor >= 0)
                raise InvalidArgumentError(f"--{name} must be a finite number >= 0, got {v}")
            if name == "timeout" and v == 0:
                raise InvalidArgumentError("--timeout must be a number of seconds > 0 (ANYCHIP_COLLECTIVE_TIMEOUT), "
                                           "got 0")
            setattr(cfg, name, v)
    cfg.faults = not args.no_faults
    return cfg


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("conformance", help="certify backends: device API, collectives (nccl-tests tables), faults",
                       description=__doc__.split("\n\n")[0] if __doc__ else None,
                       epilog="Sizes as nccl-tests writes them: 8, 64K, 64M, 1G. --quick (default): "
                              "8 B..4 MiB x8, float32 sum, 5 iterations, plus every dtype x reduce op x root at "
                              "4 KiB and 133000 B. --full: 8 B..64 MiB x2, 10 iterations, 3 checks. "
                              "Giving -d, -o or -r measures exactly the rows asked for.")
    p.add_argument("--device", default=None, help="backend(s) to certify, comma separated (default: every available)")
    p.add_argument("-n", "--nprocs", type=int, default=None,
                   help="ranks (default: 3 where the backend has 3 devices or more, so that rooted and point-to-point "
                        "cases tell peers apart; else 2)")
    p.add_argument("-b", "--minbytes", default=None, help="smallest size")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=None, help="size multiplication factor")
    p.add_argument("-c", "--collective", default=None, help=f"all or some of {','.join(OPS)}")
    p.add_argument("-o", "--op", default=None, help=f"reduce ops: all or some of {','.join(REDOPS)}")
    p.add_argument("-d", "--dtype", default=None, help=f"all or some of {','.join(DTYPES)}")
    p.add_argument("-r", "--root", default=None, help="root of broadcast / reduce: all or a rank")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per row")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations first")
    p.add_argument("--timeout", type=float, default=None, help="ANYCHIP_COLLECTIVE_TIMEOUT of the run (default 60)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds a case may take on a rank before it fails with 'no answer' (default: 3/4 of "
                        "--timeout, at least 10: before the other ranks' collectives time out)")
    p.add_argument("--no-faults", action="store_true", help="skip the fault cases (timeout, killed rank, ...)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the short defaults (the default)")
    mode.add_argument("--full", action="store_true", help="sizes to 64 MiB, more iterations")
    p.add_argument("--json", default=None, metavar="FILE", help="write every case and figure as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw busbw against size (needs matplotlib)")
    p.add_argument("--tables", action=argparse.BooleanOptionalAction, default=None,
                   help="print the nccl-tests tables (default: when --device is given)")
    p.add_argument("--framework", choices=("anychip", "paddle", "torch"), default="anychip",
                   help="paddle / torch: certify the framework on the chip: what it computes (ops forward and "
                        "backward, optimizers, a Transformer eager and compiled / to_static, AMP, streams and "
                        "devices) against its CPU, then the collective cases through paddle.distributed under "
                        "Paddle's launcher (docs/paddle.md) / torch.distributed on the anychip c10d backend "
                        "(docs/torch.md)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=_cmd)
    return p


def _backends(arg: str | None) -> list[str]:
    from ..runtime.errors import InvalidArgumentError
    from .runner import available_backends
    known = available_backends()
    if arg is None:
        return [name for name, ok, _ in known if ok]
    names = [t.strip().lower() for t in arg.split(",") if t.strip()]
    by = {name: (ok, why) for name, ok, why in known}
    for name in names:
        if name not in by:
            raise InvalidArgumentError(f"conformance: unknown backend {name!r}; known: {', '.join(by)}")
        if not by[name][0]:
            raise InvalidArgumentError(f"conformance: backend {name!r} is unavailable: {by[name][1]}")
    return names


def default_ranks(backend: str) -> int:
    """3 ranks where the backend has 3 devices or more, else 2 (sharing its devices)."""
    from ..runtime.registry import backend as lookup
    info = lookup(backend)
    try:
        count = info.plugin.device_count() if info is not None and info.available and info.plugin else 0
    except Exception:  # noqa: BLE001 - the run itself reports a backend that cannot count its devices
        count = 0
    return 3 if count >= 3 else 2


def run(backends: list[str], cfg: Config, progress: bool = False, ranks: int | None = None) -> list[dict]:
    """Each backend in turn (with ``ranks`` ranks, or :func:`default_ranks`); a job ended by SIGTERM
    or Ctrl-C (the launcher's 143 / 130), or one arriving between jobs, stops the whole run
    (:class:`Stopped`)."""
    import signal
    import threading

    from .runner import Progress, run_backend
    bar = Progress() if progress else None

    def on_term(signum: int, frame: object) -> None:
        raise Stopped(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        results = []
        for b in backends:
            res = run_backend(b, replace(cfg, ranks=ranks or default_ranks(b)), bar)
            results.append(res)
            if res.get("exit_code") in (130, 143):
                raise Stopped(res["exit_code"])
        return results
    except KeyboardInterrupt:
        raise Stopped(130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _cmd(args: argparse.Namespace) -> int:
    from . import report
    cfg = config_from_args(args)
    if args.framework in ("paddle", "torch"):
        from .framework import run as run_framework
        try:
            return run_framework(args.framework, args.device, args.nprocs or 2, cfg.min_bytes,
                                 min(cfg.max_bytes, 4 << 20), cfg.factor, cfg.timeout * 4 if cfg.timeout else 600)
        except Stopped as stop:
            print(f"conformance: {stop}; the remaining backends were not run", file=sys.stderr)
            return stop.code
    names = _backends(args.device)
    if args.nprocs is None and cfg.roots:        # -r without -n: valid for every backend's default ranks
        _roots(str(cfg.roots[0]), min((default_ranks(b) for b in names), default=cfg.ranks))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            from ..runtime.errors import UnsupportedError
            raise UnsupportedError("--plot needs matplotlib: pip install 'anychip[plot]'") from None
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    try:
        results = run(names, cfg, progress, args.nprocs)
    except Stopped as stop:
        print(f"conformance: {stop}; the remaining backends were not run", file=sys.stderr)
        return stop.code
    show_tables = args.tables if args.tables is not None else args.device is not None
    for res in results:
        if "unavailable" in res:
            continue
        print(f"# anychip conformance: {res['backend']} ({res.get('kind')}), {res['ranks']} ranks on "
              f"{res.get('device')} via {res.get('transport')}, {cfg.mode}")
        if show_tables:
            print(report.tables(res))
        problems = not show_tables and report.verdict(res) != "PASS"
        text = report.cases_report(res, only_problems=problems)
        if text and (show_tables or problems):
            print(text)
        if show_tables:
            print()
    if not args.device:
        from .runner import available_backends
        results_all = results + [{"backend": n, "ranks": cfg.ranks, "unavailable": why}
                                 for n, ok, why in available_backends() if not ok]
    else:
        results_all = results
    print(report.summary(results_all))
    failed = [r["backend"] for r in results if report.verdict(r) == "FAIL"]
    print(f"\nconformance: {'FAIL on ' + ', '.join(failed) if failed else 'PASS'}")
    if args.json:
        _write_output("--json", args.json, lambda path: report.write_json(path, results_all, cfg.to_json()))
    if args.plot:
        _write_output("--plot", args.plot, lambda path: report.plot(path, results))
    return 1 if failed else 0
