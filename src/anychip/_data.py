"""Files anychip ships: the public C headers (``csrc/include``, with ``anychip/plugin.h``), the
project templates of ``anychip plugin new`` (``csrc/templates``), and the C / C++ sources that
are compiled at the user's site (the PyTorch extension, the Paddle bridge) or against a vendor's
SDK (the plugin.h adapters): ``csrc/{torch,paddle,adapters,ccl}``, which are not headers and so
are not on the include path.

A source checkout (an editable install) reads them from the checkout's ``csrc/`` (the package is ``src/anychip``); an
installed wheel carries them as ``anychip/_include``, ``anychip/_templates`` and
``anychip/_src`` (setup.py copies them there).
"""
from __future__ import annotations

from pathlib import Path

from .runtime.errors import AnychipError

__all__ = ["get_include", "plugin_header", "sources_dir", "templates_dir"]

_PACKAGE = Path(__file__).resolve().parent


def _csrc() -> Path:
    """csrc/ of a source checkout, whose package is src/anychip."""
    return _PACKAGE.parent.parent / "csrc"


def _first(kind: str, candidates: tuple[Path, ...], marker: str) -> Path:
    for path in candidates:
        if (path / marker).exists():
            return path
    raise AnychipError(f"anychip's {kind} are missing: none of {', '.join(map(str, candidates))} holds {marker}; "
                       "reinstall anychip")


def get_include() -> str:
    """The directory to add to a C compiler's include path (``-I``) for ``#include <anychip/plugin.h>``."""
    return str(_first("C headers", (_csrc() / "include", _PACKAGE / "_include"),
                      "anychip/plugin.h"))


def plugin_header() -> Path:
    """Path of ``anychip/plugin.h``."""
    return Path(get_include()) / "anychip" / "plugin.h"


def templates_dir() -> Path:
    """The templates ``anychip plugin new`` copies (one directory per language)."""
    return _first("plugin templates", (_csrc() / "templates", _PACKAGE / "_templates"), "c")


#: the source folders a wheel ships under anychip/_src (setup.py keeps the same list)
SHIPPED_SOURCES = ("torch", "paddle", "adapters", "ccl")


def sources_dir() -> Path:
    """The folder holding the shipped C / C++ sources (``torch/``, ``paddle/``, ``adapters/``,
    ``ccl/``): ``csrc`` in a source checkout, ``anychip/_src`` in a wheel."""
    return _first("C sources", (_csrc(), _PACKAGE / "_src"), "ccl/ccl.h")
