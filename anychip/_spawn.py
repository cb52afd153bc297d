"""Child Python processes that import the same anychip as their parent.

``python -m mod`` and ``python -c code`` put the current directory first on ``sys.path``,
and ``python prog.py`` puts the program's directory there, ahead of ``PYTHONPATH`` and
site-packages. Started in a source checkout, such a child would import the checkout's
``anychip/`` (whose C parts an installed anychip has compiled elsewhere) instead of the
parent's. ``python -P`` would help only from Python 3.11, and it also drops the program's
own directory, which a user's program needs.

So every child anychip starts runs a small bootstrap (``python -c BOOT ROOT ...``) that
pins the top-level name ``anychip`` to the directory the parent imported it from and then
runs the target with the interpreter's own semantics: ``prog.py`` with its directory first
on ``sys.path``; ``-m module`` and ``-c code`` with the current directory first. Only the
name ``anychip`` is pinned; every other import resolves exactly as it would have.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["python_command", "anychip_root"]

# Runs in the child before anything else; kept to the standard library and to one screen.
_BOOT = """\
def _anychip_boot():
    import importlib.machinery, os, runpy, sys
    root = sys.argv.pop(1)
    class Pin:
        @staticmethod
        def find_spec(name, path=None, target=None):
            return importlib.machinery.PathFinder.find_spec(name, [root]) if name == "anychip" else None
    sys.meta_path.insert(0, Pin)
    main = sys.modules["__main__"].__dict__
    del main["_anychip_boot"], sys.argv[0]
    if sys.argv[0] == "-m":
        sys.path[0] = os.getcwd()
        del sys.argv[0]
        runpy._run_module_as_main(sys.argv[0])
    elif sys.argv[0] == "-c":
        exec(compile(sys.argv.pop(1), "<string>", "exec"), main)
    elif os.path.isfile(sys.argv[0]):
        sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
        with open(sys.argv[0], "rb") as f:
            code = compile(f.read(), sys.argv[0], "exec")
        main.update(__file__=sys.argv[0], __cached__=None)
        exec(code, main)
    elif os.path.isdir(sys.argv[0]):
        sys.path[0] = sys.argv[0]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        print(f"{sys.executable}: can't open file {sys.argv[0]!r}: no such file", file=sys.stderr)
        raise SystemExit(2)
_anychip_boot()
"""


def anychip_root() -> str:
    """The directory that holds the ``anychip`` package this process imported."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """The command line running ``python argv...`` (``prog.py args``, ``-m module args`` or
    ``-c code args``) in a child that imports this process's anychip."""
    if not argv:
        raise ValueError("python_command: no program given (prog.py, -m module or -c code)")
    if argv[0] in ("-m", "-c") and len(argv) < 2:
        raise ValueError(f"python_command: {argv[0]} needs an argument")
    return [python or sys.executable, "-c", _BOOT, anychip_root(), *argv]
