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
    "ANYCHIP_COLLECTIVE_TIMEOUT": ("300", "seconds a collective op may wait for its peers before it raises "
                                          "CollectiveTimeout on every waiting rank"),
    "ANYCHIP_COLLECTIVE_TRANSPORT": ("auto", "collectives on ascend / kunlun / hygon / cuda: auto = the chip's own "
                                             "library (HCCL, BKCL, RCCL, NCCL) when present, native = require "
                                             "it, host = always the shared-memory engine"),
    "ANYCHIP_COLLECTIVE_CHECK": ("0", "1 = ranks compare each collective's op, count, dtype, root and reduce op "
                                      "first and report a mismatch on every rank"),
    "ANYCHIP_CCL_SMALL": ("16384", "bytes per rank up to which a collective takes the one-round low-latency path"),
    "ANYCHIP_CCL_CHUNK": ("1048576", "bytes per rank and round of the chunked shared-memory path"),
    "ANYCHIP_CCL_ZERO_COPY_MIN": ("65536", "message bytes from which simulated chips reduce zero-copy from the "
                                           "peers' device memory"),
    "ANYCHIP_CCL_SPIN_US": ("200", "microseconds a collective wait spins before it sleeps on a futex"),
    "ANYCHIP_RANK": ("(set by anychip launch)", "this process's rank; also ANYCHIP_WORLD_SIZE, ANYCHIP_LOCAL_RANK, "
                                                "ANYCHIP_LOCAL_SIZE, ANYCHIP_JOB_ID"),
    "ANYCHIP_WORLD_SIZE": ("(set by anychip launch)", "number of ranks of the job"),
    "ANYCHIP_LOCAL_RANK": ("(set by anychip launch)", "rank among the ranks of this host"),
    "ANYCHIP_LOCAL_SIZE": ("(set by anychip launch)", "number of ranks on this host"),
    "ANYCHIP_JOB_ID": ("(set by anychip launch)", "names the job's shared-memory communicators"),
    "ANYCHIP_LAUNCH_DEVICE": ("(set by anychip launch --device)", "backend of the ranks' devices (rank r on "
                                                                  "BACKEND:r)"),
    "ANYCHIP_LOG_LEVEL": ("WARNING", "level of the 'anychip' logger in the anychip command "
                                      "(DEBUG, INFO, WARNING, ...)"),
}


def in_effect() -> dict[str, str]:
    """The ANYCHIP_* variables set in this process (known or not)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ANYCHIP_")}
