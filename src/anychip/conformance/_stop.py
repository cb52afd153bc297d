"""How a conformance run stopped by a signal ends (shared by the device-level and the framework runs)."""
from __future__ import annotations


class Stopped(Exception):
    """The run was stopped by a signal (SIGTERM, SIGINT): no further backend is started."""

    def __init__(self, code: int) -> None:
        super().__init__(f"stopped by signal {code - 128}")
        self.code = code
