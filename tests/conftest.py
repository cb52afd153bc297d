"""Shared fixtures: one test body runs against every selected device.

``device`` is parametrized over the first selected device of each available
backend (``ANYCHIP_DEVICES`` narrows it, e.g. ``ANYCHIP_DEVICES=opencl:0 ci/test``).
"""
from __future__ import annotations

import os

import pytest

import anychip


def _first_device_of_each_backend() -> list[str]:
    seen: dict[str, str] = {}
    try:
        for d in anychip.devices():
            seen.setdefault(d.backend, d.name)
    except anychip.SelectionError:
        return []
    return list(seen.values())


DEVICE_NAMES = _first_device_of_each_backend()


@pytest.fixture(params=DEVICE_NAMES)
def device(request: pytest.FixtureRequest) -> anychip.Device:
    return anychip.device(request.param)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No ANYCHIP_DEVICES from the outside; registry and selection rebuilt after the test."""
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    yield monkeypatch
    anychip.runtime.registry.reset()


def pytest_report_header(config: pytest.Config) -> str:
    lines = [f"anychip devices under test: {', '.join(DEVICE_NAMES) or 'none'}"]
    for b in anychip.backends():
        if not b.available:
            lines.append(f"  {b.name}: skipped, unavailable ({b.reason})")
    if os.environ.get("ANYCHIP_DEVICES"):
        lines.append(f"  ANYCHIP_DEVICES={os.environ['ANYCHIP_DEVICES']!r}")
    return "\n".join(lines)
