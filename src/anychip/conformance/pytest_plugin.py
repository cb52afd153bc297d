"""pytest plugin (entry point ``pytest11``): the conformance suite's options.

    pytest --pyargs anychip.conformance [--anychip-device ascend[,kunlun]] [--anychip-ranks 4] [--anychip-full]

The cases themselves are in :mod:`anychip.conformance.test_conformance` (collected by
``--pyargs anychip.conformance``): one test per named case, parametrized over the
backends. Where anychip is not installed as a package (only on ``PYTHONPATH``), load
the plugin by hand: ``pytest -p anychip.conformance.pytest_plugin --pyargs anychip.conformance``.
"""
from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("anychip", "anychip conformance suite")
    group.addoption("--anychip-device", action="append", default=[], metavar="NAME",
                    help="backend(s) the conformance cases run on (repeat or comma list; default: every available)")
    group.addoption("--anychip-ranks", type=int, default=None, metavar="N",
                    help="ranks of each run (default: 3 where the backend has 3 devices, else 2)")
    group.addoption("--anychip-full", action="store_true", help="the --full sizes and iterations")
