"""Locate the shared libraries that setup.py builds into ``anychip/_lib``."""
from __future__ import annotations

import importlib.machinery
import os

_LIB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_lib")


def find_library(name: str) -> str | None:
    """Path of the built library ``name`` (e.g. ``"libacl_sim"``), or None when it was not built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = os.path.join(_LIB_DIR, name + suffix)
        if os.path.exists(path):
            return path
    return None
