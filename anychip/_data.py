"""Files anychip ships for plugin authors: the C headers (``csrc/include``, with
``anychip/plugin.h``) and the project templates of ``anychip plugin new``
(``csrc/templates``).

A source checkout (an editable install) reads them from ``csrc/`` beside the package; an
installed wheel carries them as ``anychip/_include`` and ``anychip/_templates`` (setup.py
copies them there).
"""
from __future__ import annotations

from pathlib import Path

from .runtime.errors import AnychipError

__all__ = ["get_include", "plugin_header", "templates_dir"]

_PACKAGE = Path(__file__).resolve().parent


def _first(kind: str, candidates: tuple[Path, ...], marker: str) -> Path:
    for path in candidates:
        if (path / marker).exists():
            return path
    raise AnychipError(f"anychip's {kind} are missing: none of {', '.join(map(str, candidates))} holds {marker}; "
                       "reinstall anychip")


def get_include() -> str:
    """The directory to add to a C compiler's include path (``-I``) for ``#include <anychip/plugin.h>``."""
    return str(_first("C headers", (_PACKAGE.parent / "csrc" / "include", _PACKAGE / "_include"),
                      "anychip/plugin.h"))


def plugin_header() -> Path:
    """Path of ``anychip/plugin.h``."""
    return Path(get_include()) / "anychip" / "plugin.h"


def templates_dir() -> Path:
    """The templates ``anychip plugin new`` copies (one directory per language)."""
    return _first("plugin templates", (_PACKAGE.parent / "csrc" / "templates", _PACKAGE / "_templates"), "c")
