"""anychip plugin @name@: the C library ``lib@name@.so`` installed beside this file.

anychip finds it through the ``anychip.plugin_libraries`` entry point (see pyproject.toml),
which names :func:`library`.
"""
from __future__ import annotations

import os

__all__ = ["library"]


def library() -> str:
    """Path of the plugin library built by ``pip install``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib@name@.so")
