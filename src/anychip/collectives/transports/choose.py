"""Which transport a communicator gets: the whole decision, in :func:`choose`.

Two variables steer it (both read and checked by :mod:`anychip.runtime.env`):

* ``ANYCHIP_HOST_TRANSPORT`` (``auto`` by default) decides how ranks reach each other:

  * ``auto``: every rank on one host: the one-host transport below; ranks spanning hosts
    (an MPI launcher is required then): the hierarchical transport (shared memory within
    a host, MPI between hosts), or flat MPI when the hosts hold different numbers of ranks;
  * ``shm``: the one-host transport (one host only);
  * ``mpi``: flat MPI between every pair of ranks (mpi4py), even on one host.

* ``ANYCHIP_COLLECTIVE_TRANSPORT`` (``auto`` by default) decides the one-host transport:

  * ``auto``: the chip's own library where the device's plugin gives one through
    ``DevicePlugin.native_ccl()`` (a :class:`~anychip.runtime.native_ccl.NativeLibrary`:
    :class:`NativeTransport`; ``cupy.cuda.nccl``: :class:`NcclTransport`), else the
    shared-memory engine (:class:`ShmTransport`);
  * ``native``: the chip's own library, an error when the device has none;
  * ``host``: always the shared-memory engine.

  What the plugin gives decides, never the backend's name.

Ranks are grouped by host: the host name, or ``ANYCHIP_HOSTID`` when set (as NCCL's
``NCCL_HOSTID``; it also lets one machine play several hosts). Only the launcher's
count of local ranks and, under an MPI launcher, the host keys gathered over MPI are
used, so a one-host job never initialises MPI.
"""
from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from ...runtime.env import check_engine, collective_transport, host_id, host_transport
from ...runtime.errors import UnsupportedError
from ...runtime.native_ccl import NativeLibrary
from .base import Transport
from .hier import HierTransport
from .mpi import MpiTransport
from .native import NativeTransport, NcclTransport, why_no_library
from .shm import ShmTransport

if TYPE_CHECKING:
    from ...runtime.device import Device
    from .._bootstrap import World

__all__ = ["choose", "one_host", "over_mpi", "host_key"]

#: the launchers under which ranks on several hosts can reach each other (through MPI)
MPI_LAUNCHERS = ("mpich", "openmpi")


def choose(device: Device, world: World, comm_id: str | None = None, label: str = "world",
           timeout: float | None = None) -> Transport:
    """The transport of every rank of ``world`` on ``device`` (collective: every rank calls
    it); ``comm_id`` names the shared-memory communicator on one host (default: the job's
    world). ``timeout``: the seconds each of its ops may wait for the peers (None: the
    default; ``ANYCHIP_COLLECTIVE_TIMEOUT``, when set, overrides it: env.collective_timeout);
    it is the communicator's own, and its sub-groups'. See the module docstring."""
    comm_id = comm_id or f"{world.job_id}.world"
    check_engine()                    # what the C parts read themselves, refused here rather than ignored
    mode = host_transport()
    spans = world.local_size != world.size
    if mode == "mpi":
        return MpiTransport.world(device, world, timeout=timeout)
    if spans and mode == "shm":
        raise UnsupportedError(
            f"ANYCHIP_HOST_TRANSPORT=shm: the job spans more than one host ({world.size} ranks, {world.local_size} on "
            "this one) and the shared-memory engine works within one host; use auto or mpi under mpiexec")
    if mode == "shm" or world.launcher not in MPI_LAUNCHERS:
        if spans:
            raise UnsupportedError(
                f"the job spans more than one host ({world.size} ranks, {world.local_size} on this one, launched by "
                f"{world.launcher}); between hosts anychip uses MPI: launch with mpiexec and install anychip[mpi]")
        return one_host(device, world.rank, world.size, comm_id, label, timeout)
    if not spans and not host_id():
        return one_host(device, world.rank, world.size, comm_id, label, timeout)
    # under mpiexec, ranks on several hosts (or host ids set): what MPI says about the hosts decides
    return over_mpi(device, MpiTransport.world(device, world, timeout=timeout), "world")


def one_host(device: Device, rank: int, size: int, comm_id: str, label: str = "world",
             timeout: float | None = None) -> Transport:
    """The transport of ranks that share a host: the chip's own library or the engine
    (``ANYCHIP_COLLECTIVE_TRANSPORT``)."""
    choice = collective_transport()
    if choice != "host":
        lib = device.plugin.native_ccl()
        if isinstance(lib, NativeLibrary):
            return NativeTransport(device, rank, size, comm_id, label, library=lib, timeout=timeout)
        if lib is not None and hasattr(lib, "NcclCommunicator"):        # cupy.cuda.nccl (cuda)
            return NcclTransport(device, rank, size, comm_id, label, nccl=lib, timeout=timeout)
        if choice == "native":
            raise UnsupportedError(f"ANYCHIP_COLLECTIVE_TRANSPORT=native but {device} has no native collective "
                                   f"library: {why_no_library(device.plugin, lib)}")
    return ShmTransport(device, rank, size, comm_id, label, timeout)


def over_mpi(device: Device, flat: MpiTransport, label: str) -> Transport:
    """The transport for the ranks of ``flat`` (an MPI transport, collective over it): the
    engine when they share a host, hierarchical when every host has as many ranks, else
    ``flat`` itself (each with ``flat``'s timeout)."""
    keys = flat.comm.allgather(host_key())
    token = flat.comm.bcast(os.urandom(6).hex() if flat.rank == 0 else None, root=0)
    hosts = list(dict.fromkeys(keys))
    members = [[r for r, k in enumerate(keys) if k == h] for h in hosts]
    if len(hosts) == 1:
        shm = ShmTransport(device, flat.rank, flat.size, f"mpi{token}", label, flat.own_timeout)
        flat.close()
        return shm
    if len({len(m) for m in members}) != 1:
        return flat
    return HierTransport(device, flat, members, token, label, regroup=over_mpi)


def host_key() -> str:
    """What groups ranks by host: ``ANYCHIP_HOSTID`` when set, else the host name."""
    hid = host_id()
    return f"id:{hid}" if hid else f"host:{socket.gethostname()}"
