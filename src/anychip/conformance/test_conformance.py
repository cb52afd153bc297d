"""The conformance cases under pytest: ``pytest --pyargs anychip.conformance``.

One test per named case (device API, each collective, each fault), parametrized over the
backends (``--anychip-device``; default every available one). Each backend's suite runs
once, the first time one of its cases is asked for; a case the backend does not support
is skipped with the reason, never passed.
"""
from __future__ import annotations

from typing import Any

import pytest

from anychip.conformance.cases import CASE_NAMES

_results: dict[tuple, dict] = {}


def _backends(config: Any) -> list[str]:
    from anychip.conformance.runner import available_backends
    asked = [t.strip().lower() for v in config.getoption("anychip_device", default=[]) or [] for t in v.split(",")
             if t.strip()]
    if asked:
        return asked
    return [name for name, ok, _ in available_backends() if ok]


def pytest_generate_tests(metafunc: Any) -> None:
    if "anychip_backend" in metafunc.fixturenames:
        metafunc.parametrize("anychip_backend", _backends(metafunc.config))


def _config(pytestconfig: Any, backend: str) -> Any:
    from dataclasses import replace

    from anychip.conformance.command import FULL, QUICK, default_ranks
    full = pytestconfig.getoption("anychip_full", default=False)
    known = {n for n, ok, _ in _available()}
    ranks = pytestconfig.getoption("anychip_ranks", default=None) or (
        default_ranks(backend) if backend in known else QUICK.ranks)
    return replace(FULL if full else QUICK, ranks=ranks)


def _available() -> list:
    from anychip.conformance.runner import available_backends
    return [b for b in available_backends() if b[1]]


def _suite(backend: str, pytestconfig: Any) -> dict:
    from anychip.conformance.runner import available_backends, run_backend
    cfg = _config(pytestconfig, backend)
    key = (backend, cfg.ranks, cfg.mode)
    if key not in _results:
        known = {n: (ok, why) for n, ok, why in available_backends()}
        if backend not in known:
            _results[key] = {"unavailable": f"unknown backend {backend!r}; known: {', '.join(known)}"}
        elif not known[backend][0]:
            _results[key] = {"unavailable": f"{backend} is unavailable: {known[backend][1]}"}
        else:
            _results[key] = run_backend(backend, cfg)
    return _results[key]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_case(anychip_backend: str, case: str, pytestconfig: Any) -> None:
    res = _suite(anychip_backend, pytestconfig)
    if "unavailable" in res:
        pytest.skip(res["unavailable"])
    found = next((c for c in res["cases"] if c["name"] == case), None)
    assert found is not None, f"{case} was not run on {anychip_backend}"
    if found["status"] == "skipped":
        pytest.skip(found["detail"])
    if found["status"] == "failed":
        msg = found["detail"]
        if found.get("expected") or found.get("got"):
            msg += f"\nexpected: {found['expected']}\ngot:      {found['got']}"
        pytest.fail(msg, pytrace=False)
    assert found["status"] == "passed", found
