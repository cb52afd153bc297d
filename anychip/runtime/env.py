"""Every environment variable anychip reads, in one place (shown by ``anychip info``)."""
from __future__ import annotations

import os

__all__ = ["VARIABLES", "in_effect"]

#: name -> (default, meaning)
VARIABLES: dict[str, tuple[str, str]] = {
    "ANYCHIP_DEVICES": ("(unset: every available device)",
                        "which devices to use and in what order: term;term, term = [!]backend:devices "
                        "(e.g. 'ascend:0,1;cpu:*'); the first is the default device"),
    "ANYCHIP_SIMULATE": ("auto", "vendor backends without their library: auto = use the simulator, "
                                 "always = always the simulator, never = unavailable"),
    "ANYCHIP_SIM_DEVICES": ("8", "number of devices of each simulated chip"),
    "ANYCHIP_SIM_MEMORY": ("16GiB", "memory capacity of each simulated device (bytes or with K/M/G units)"),
    "ANYCHIP_SIM_SPIN_US": ("20", "microseconds a simulated stream worker or a synchronizing thread spins "
                                  "before it sleeps"),
    "ANYCHIP_ALLOC_CONF": ("(unset)", "caching allocator knobs: max_split_size_mb:N,"
                                      "garbage_collection_threshold:F, or backend:native to turn caching off"),
    "ANYCHIP_LOG_LEVEL": ("WARNING", "level of the 'anychip' logger in the anychip command "
                                      "(DEBUG, INFO, WARNING, ...)"),
}


def in_effect() -> dict[str, str]:
    """The ANYCHIP_* variables set in this process (known or not)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ANYCHIP_")}
