"""Files anychip ships for plugin authors: the C headers (``csrc/include``, with
``anychip/plugin.h``) and the project templates of ``anychip plugin new``
(``csrc/templates``).

An installed wheel carries them under ``anychip/_csrc`` (setup.py copies them there);
a source checkout (an editable install) reads them from ``csrc/`` beside the package.
"""
from __future__ import annotations

from pathlib import Path

from .runtime.errors import AnychipError

__all__ = ["data_root", "get_include", "plugin_header", "templates_dir"]

_PACKAGE = Path(__file__).resolve().parent


def data_root() -> Path:
    """The directory holding ``include/`` and ``templates/``."""
    for root in (_PACKAGE / "_csrc", _PACKAGE.parent / "csrc"):
        if (root / "include" / "anychip" / "plugin.h").is_file():
            return root
    raise AnychipError(f"anychip's plugin files are missing: neither {_PACKAGE / '_csrc'} nor "
                       f"{_PACKAGE.parent / 'csrc'} holds include/anychip/plugin.h; reinstall anychip")


def get_include() -> str:
    """The directory to add to a C compiler's include path (``-I``) for ``#include <anychip/plugin.h>``."""
    return str(data_root() / "include")


def plugin_header() -> Path:
    """Path of ``anychip/plugin.h``."""
    return data_root() / "include" / "anychip" / "plugin.h"


def templates_dir() -> Path:
    """The templates ``anychip plugin new`` copies (one directory per language)."""
    return data_root() / "templates"
