"""``anychip plugin``: start and check a plugin for a new chip.

* ``anychip plugin new NAME [--lang c|python] [--collectives] [--dir DIR]`` writes ``DIR/NAME``,
  a complete plugin project from the templates (``csrc/templates``, shipped in the package): a
  host-memory device with asynchronous streams and timed events that builds with
  ``pip install ./NAME``, registers itself and passes ``anychip conformance``. With
  ``--collectives`` (C) it also sets plugin.h's collective entries, over a stand-in library
  between the processes of one host (``src/collectives.c``).
* ``anychip plugin cflags`` prints the compiler flag that finds ``anychip/plugin.h``.
* ``anychip plugin check NAME|LIBRARY`` loads a C plugin library (an installed plugin's, by
  its backend name, or a file) as anychip would and says where it was found, what it
  offers, or why it is refused; a kernel table (plugin.h minor 1): what it leaves to the host
  (NULL entries, dtypes its masks leave out), then run entry by
  entry and dtype by dtype against NumPy (``conformance/kernel_table.py``).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from ._data import get_include, plugin_header, templates_dir
from .runtime.errors import AnychipError, InvalidArgumentError, PluginError

__all__ = ["new_plugin", "add_parser", "LANGUAGES"]

LANGUAGES = ("c", "python")
_NAME = re.compile(r"[a-z][a-z0-9_]*")          # the whole name (fullmatch: "$" would allow a trailing newline)
#: longest backend name: plugin.h's device_type holds ANYCHIP_DEVICE_TYPE_MAX (64) bytes with its NUL
MAX_NAME = 63
_RESERVED = frozenset({"cpu", "cuda", "opencl", "ascend", "kunlun", "hygon", "all"})


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


#: template files written only with an option (the option's name)
_OPTIONAL_FILES = {"src/collectives.c": "collectives"}
#: a template's lines between "@{OPTION" (or "@{!OPTION") and "@}" are kept only with (without) OPTION
_BLOCK = re.compile(r"^@\{(!?)(\w+)\n(.*?)^@\}\n", re.M | re.S)


def new_plugin(name: str, lang: str = "c", directory: str | Path = ".", collectives: bool = False) -> Path:
    """Write the plugin project ``directory/name`` and return its path (``collectives``: a C
    project's collective entries too)."""
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"plugin name {name!r} is not a backend name: want lower-case letters, digits "
                                   "and _, starting with a letter (e.g. mychip)")
    if len(name) > MAX_NAME:
        raise InvalidArgumentError(f"plugin name {name[:20]!r}... has {len(name)} characters; a backend name has at "
                                   f"most {MAX_NAME} (plugin.h's device_type)")
    if name in _RESERVED:
        raise InvalidArgumentError(f"plugin name {name!r} is taken by a built-in backend; choose another")
    if lang not in LANGUAGES:
        raise InvalidArgumentError(f"--lang {lang!r}: want one of {', '.join(LANGUAGES)}")
    if collectives and lang != "c":
        raise InvalidArgumentError("--collectives writes plugin.h's collective entries: it takes --lang c (a Python "
                                   "plugin's collectives are its native_ccl(); without one the host transport serves)")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise InvalidArgumentError(f"--dir {directory} is not a directory")
    target = Path(directory) / name
    if target.exists() and not target.is_dir():
        raise InvalidArgumentError(f"{target} exists and is not a directory; choose another --dir or remove it")
    if target.exists() and any(target.iterdir()):
        raise InvalidArgumentError(f"{target} exists and is not empty; choose another --dir or remove it")
    try:
        _write_project(target, name, lang, {"collectives": collectives})
    except OSError as exc:
        raise InvalidArgumentError(f"--dir {directory}: cannot write {exc.filename or target}: "
                                   f"{exc.strerror or exc}") from None
    return target


def _write_project(target: Path, name: str, lang: str, options: dict[str, bool]) -> None:
    tokens = {"@name@": name, "@NAME@": name.upper(), "@Name@": _class_name(name)}

    def subst(text: str) -> str:
        text = _BLOCK.sub(lambda m: m.group(3) if options[m.group(2)] != bool(m.group(1)) else "", text)
        for k, v in tokens.items():
            text = text.replace(k, v)
        return text

    source = templates_dir() / lang
    for path in sorted(source.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        option = _OPTIONAL_FILES.get(path.relative_to(source).as_posix())
        if option is not None and not options[option]:
            continue
        rel = subst(str(path.relative_to(source)))
        if Path(rel).name == "dot-gitignore":
            rel = str(Path(rel).with_name(".gitignore"))
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(subst(path.read_text()))
    if lang == "c":
        header = target / "include" / "anychip" / "plugin.h"
        header.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plugin_header(), header)


def _cmd_new(args: argparse.Namespace) -> int:
    try:
        path = new_plugin(args.name, args.lang, args.dir, args.collectives)
    except AnychipError as exc:
        print(f"anychip plugin new: error: {exc}", file=sys.stderr)
        return 2
    where = str(path) if path.is_absolute() else f".{os.sep}{path}"     # (a bare name would be looked up on PyPI)
    kind = "C, anychip/plugin.h" + (", with collectives" if args.collectives else "") if args.lang == "c" else \
        "Python, DevicePlugin"
    print(f"wrote {where} ({kind})\n"
          f"next:\n  pip install {where}\n  anychip devices --all\n"
          f"  anychip conformance --device {args.name} -n {3 if args.collectives else 2}\n"
          f"then replace the functions marked DRIVER with your chip's calls (see {path / 'README.md'})")
    return 0


def _cmd_cflags(args: argparse.Namespace) -> int:
    print(f"-I{get_include()}")
    return 0


_CHECK_CHILD_ENV = "ANYCHIP_PLUGIN_CHECK_CHILD"


def _cmd_check(args: argparse.Namespace) -> int:
    if os.environ.get(_CHECK_CHILD_ENV) != "1":
        return _check_in_child(args.library)
    from .chips.cplugin import probe
    from .runtime.registry import initialise_named
    try:
        path, how = library_argument(args.library)
        name, loader = initialise_named(path, probe)
    except PluginError as exc:
        print(f"anychip plugin check: {args.library} refused: {exc}", file=sys.stderr)
        return 1
    plugin = loader()
    print(f"library:     {path} ({how})")
    ok, reason = plugin.available()
    t, ffi = plugin.t, plugin.ffi
    unset = [f for f in ("set_device", "device_name", "device_synchronize", "copy_async", "copy_peer", "fill",
                         "fill_async", "stream_query", "stream_wait_event", "event_create", "event_query",
                         "event_elapsed_ms", "get_error_string", "get_last_error")
             if getattr(t, f) == ffi.NULL]
    print(f"backend:     {name} ({'simulated' if plugin.simulated else 'real'})")
    print(f"ABI:         {plugin.abi[0]}.{plugin.abi[1]}" + (f", {plugin.plugin_version}"
                                                              if plugin.plugin_version else ""))
    print(f"status:      {'available' if ok else 'unavailable'}: {reason}")
    print(f"optional entries not set (anychip falls back): {', '.join(unset) or 'none'}")
    problem = plugin.collectives_problem()
    kinds = "" if problem else ", ".join(sorted(plugin.native_ccl().kinds))
    print(f"collectives: {problem or 'native (' + kinds + ')'}; the host transport runs the rest")
    kernels_ok = _check_kernels(plugin) if ok else True
    return 0 if ok and kernels_ok else 1


def library_argument(arg: str) -> tuple[str, str]:
    """(absolute path, how it was found) of the C plugin library ``arg`` names: a file path, or
    a backend name (``mychip``), found as anychip finds it (the installed package's entry point,
    then ``ANYCHIP_PLUGIN_PATH``; runtime/registry.py find_library). Raises PluginError."""
    from .runtime.registry import find_library
    if _NAME.fullmatch(arg) and not os.path.isfile(arg):
        path, how = find_library(arg)
        return str(Path(path).resolve()), f"from {how}"
    if not os.path.isfile(arg):
        lib = re.fullmatch(r"lib([a-z][a-z0-9_]*)\.so", os.path.basename(arg))
        hint = f"; an installed plugin is named by its backend name: {lib.group(1)}" if lib else ""
        raise PluginError(f"no such file{hint}")
    return str(Path(arg).resolve()), "the path given"


def left_to_host(masks: dict[str, int | None] | None) -> str:
    """What a kernel table (entry -> its dtype mask, None for a NULL entry; None: no table used)
    leaves to the host: the NULL entries, and per set entry the dtypes plugin.h allows it that
    its mask leaves out. (Ops plugin.h has no entry for, such as pow, run on the host anyway.)"""
    from .chips._plugin_kernels import BINARY_OPS, ENTRIES, KERNEL_DTYPES, REDUCE_OPS, UNARY_OPS, allowed
    if masks is None:
        return f"every tensor op (no kernel table used: {', '.join(ENTRIES)})"
    ops = {"binary": BINARY_OPS, "unary": UNARY_OPS, "reduce": REDUCE_OPS, "gemm": ("matmul",)}
    null = [e for e in ENTRIES if masks[e] is None]
    parts = [f"{', '.join(null)} (NULL)"] if null else []
    for entry in ENTRIES:
        mask = masks[entry]
        if mask is not None:
            left = [dt for bit, dt in enumerate(KERNEL_DTYPES) if not mask & (1 << bit) and
                    (entry == "fill" or any(allowed(entry, op, dt) for op in ops[entry]))]
            if left:
                parts.append(f"{entry} for {', '.join(left)} (not in {entry}_dtypes)")
    return "; ".join(parts) if parts else "nothing: every entry is set, for every dtype plugin.h allows it"


def _check_kernels(plugin: Any) -> bool:
    """Print the kernel table's verdict (plugin.h minor 1): whether it is used, and every entry
    and claimed dtype compared with NumPy on device 0. False when it is refused or disagrees."""
    from .conformance.kernel_table import check_kernel_table
    from .runtime import registry
    from .runtime.device import device as get_device

    problem = plugin.kernels_problem()
    table = None if problem is not None else plugin.kernels
    k, ffi = plugin.t.kernels, plugin.ffi
    masks = None if table is None else \
        {e: int(getattr(k, f"{e}_dtypes")) if getattr(k, e) != ffi.NULL else None for e in table.masks}
    print(f"on the host: {left_to_host(masks)}")
    if problem is not None:
        print(f"kernels:     refused, every tensor op runs on the host: {problem}")
        return False
    if table is None:
        why = "the plugin is of ABI 1.0" if plugin.abi[1] < 1 else "no kernel table (kernels is NULL)"
        print(f"kernels:     none ({why}): every tensor op runs on the host")
        return True
    info = registry.backend(plugin.name)
    if info is None:
        registry.register_plugin(plugin, source=f"anychip plugin check {plugin.path}")
    elif os.path.realpath(getattr(info.plugin, "path", "") or "") != os.path.realpath(plugin.path):
        print(f"kernels:     not checked: the backend name {plugin.name} is taken by {info.source} here")
        return False
    if plugin.device_count() == 0:
        print("kernels:     not checked: the plugin has no device")
        return True
    report = check_kernel_table(get_device(f"{plugin.name}:0"))
    print(f"kernels:     {report.summary()}")
    return report.failure is None


def _cmd_paddle(args: argparse.Namespace) -> int:
    from .paddle_provider import build_bridge, kernels_summary
    path, how = args.library, "the path given"          # (build_bridge says what is wrong with a path)
    if _NAME.fullmatch(path) and not os.path.isfile(path):
        try:
            path, how = library_argument(args.library)
        except PluginError as exc:
            print(f"anychip plugin paddle: {args.library} refused: {exc}", file=sys.stderr)
            return 1
    out = build_bridge(path, args.dest)
    path = str(Path(path).resolve())
    print(f"{out}: the Paddle device type {out.name[len('lib'):-len('.so')]} over {path} ({how})\n"
          f"Paddle loads it when CUSTOM_DEVICE_ROOT names {out.parent} (or, unset, when that is "
          "<site-packages>/paddle_custom_device)")
    print(kernels_summary(out))
    return 0


def _check_in_child(library: str) -> int:
    """The check runs in a child process (the library's code runs there): a plugin that
    crashes is refused with the signal, and this command still reports."""
    import signal
    import subprocess
    env = dict(os.environ, **{_CHECK_CHILD_ENV: "1"})
    rc = subprocess.run([sys.executable, "-m", "anychip", "plugin", "check", library], env=env).returncode
    if rc < 0:
        try:
            how = signal.Signals(-rc).name
        except ValueError:
            how = f"signal {-rc}"
        print(f"anychip plugin check: {library} refused: it crashed the process that loaded and checked it "
              f"({how})", file=sys.stderr)
        return 1
    return rc


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugin", help="start a plugin for a new chip (new), build flags (cflags), check a library")
    psub = p.add_subparsers(dest="plugin_command", metavar="ACTION", required=True)
    n = psub.add_parser("new", help="write a complete plugin project for a new chip")
    n.add_argument("name", help="backend name of the chip (lower-case letters, digits, _)")
    n.add_argument("--lang", choices=LANGUAGES, default="c",
                   help="c: a shared library implementing anychip/plugin.h; python: a DevicePlugin package")
    n.add_argument("--collectives", action="store_true",
                   help="(C) also set plugin.h's collective entries, over a stand-in shared-memory library "
                        "(src/collectives.c) whose calls you replace with your collective library's")
    n.add_argument("--dir", default=".", help="where to create the project directory NAME (default: .)")
    n.set_defaults(func=_cmd_new)
    c = psub.add_parser("cflags", help="print the compiler flag that finds anychip/plugin.h")
    c.set_defaults(func=_cmd_cflags)
    pd = psub.add_parser("paddle", help="build the Paddle bridge for a C plugin: its chip becomes the Paddle "
                                        "device type anychip_NAME")
    pd.add_argument("library", help="the backend name of an installed C plugin (mychip: the bridge binds the "
                                    "library anychip loads), or the path of a C plugin library (anychip/plugin.h)")
    pd.add_argument("--dest", help="directory for libanychip_NAME.so (default: where Paddle looks, "
                                   "CUSTOM_DEVICE_ROOT or <site-packages>/paddle_custom_device)")
    pd.set_defaults(func=_cmd_paddle)
    k = psub.add_parser("check", help="load a C plugin library as anychip would and report on it (its kernel "
                                      "table compared with NumPy)")
    k.add_argument("library", help="the backend name of an installed C plugin (mychip), or the path of its "
                                   "shared library")
    k.set_defaults(func=_cmd_check)
