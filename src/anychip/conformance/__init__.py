"""The conformance suite: certify a backend's device API and collectives with one command.

    anychip conformance                       # quick pass, every available backend, 2 ranks
    anychip conformance --device ascend -n 4 --full --json out.json --plot out.png
    pytest --pyargs anychip.conformance --anychip-device ascend

:mod:`.cases` defines what is checked (exact-valued collective sweeps in nccl-tests'
form, named device API and fault cases), :mod:`.runner` launches the ranks and reads
what rank 0 gathers, :mod:`.report` prints the tables, the summary, JSON and the plot,
:mod:`.pytest_plugin` runs the same cases under pytest. See docs/conformance.md.
"""
from __future__ import annotations

from .cases import CASE_NAMES, DEVICE_CASES, FAULT_CASES, OPS, Config, parse_size, plan
from .command import run
from .runner import run_backend

__all__ = ["Config", "run", "run_backend", "plan", "parse_size", "CASE_NAMES", "DEVICE_CASES", "FAULT_CASES", "OPS"]
