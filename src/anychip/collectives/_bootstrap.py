"""Who am I: rank, size and a job id from the launcher's environment.

Understood, in this order:

* ``anychip launch``: ``ANYCHIP_RANK``, ``ANYCHIP_WORLD_SIZE``, ``ANYCHIP_LOCAL_RANK``,
  ``ANYCHIP_LOCAL_SIZE``, ``ANYCHIP_JOB_ID`` (and ``ANYCHIP_LAUNCH_DEVICE``);
* torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (``TORCHELASTIC_RUN_ID``);
* Open MPI: ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK`` / ``_LOCAL_SIZE``;
* MPICH (Hydra) and other PMI launchers: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
  ``MPI_LOCALNRANKS``;
* nothing: a single process, rank 0 of 1.

The job id names the shared-memory communicator; every rank of one job must derive
the same one. Launchers that do not provide one are told apart by the parent
process (the launcher's agent or MPI proxy, shared by the ranks of a node) and,
for torchrun, the master address and port.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..runtime.env import job_id, launcher_int
from ..runtime.errors import InvalidArgumentError

# World is public (anychip.collectives.World); from_environment serves collectives.init
__all__ = ["World"]


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    job_id: str
    launcher: str


_SCHEMES = (
    ("anychip", "ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def from_environment() -> World:
    env = os.environ
    for launcher, rk, sz, lrk, lsz in _SCHEMES:
        if rk in env and sz in env:
            rank, size = launcher_int(rk), launcher_int(sz)
            local_rank = launcher_int(lrk) if lrk in env else rank
            local_size = launcher_int(lsz) if lsz in env else size
            if not (0 <= rank < size):
                raise InvalidArgumentError(f"{rk}={rank} is not in [0, {sz}={size})")
            if lrk in env and lsz in env and not local_rank < local_size:
                raise InvalidArgumentError(f"{lrk}={local_rank} is not in [0, {lsz}={local_size})")
            if lsz in env and not local_size <= size:
                raise InvalidArgumentError(f"{lsz}={local_size} is more than {sz}={size}")
            return World(rank, size, local_rank, local_size, _job_id(launcher), launcher)
    return World(0, 1, 0, 1, f"single-{os.getpid()}", "none")


def _job_id(launcher: str) -> str:
    if job_id():
        return job_id()
    env = os.environ
    parts = [launcher, str(os.getppid())]
    if launcher == "torchrun":
        parts += [env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), env.get("TORCHELASTIC_RUN_ID", "")]
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_KVSNAME"):
        if env.get(name):
            parts.append(env[name])
    return "-".join(p for p in parts if p)
