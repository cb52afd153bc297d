"""Collectives: one :class:`Communicator` per process and device.

    >>> from anychip import collectives
    >>> comm = collectives.init()               # rank and size from the launcher
    >>> comm.all_reduce(buf, op="sum").wait()

Run with ``anychip launch -n 4 [--device ascend] prog.py`` (or mpiexec, or torchrun).
See docs/collectives.md.
"""
from __future__ import annotations

from typing import Any

from ..runtime.errors import InvalidArgumentError
from ._bootstrap import World, from_environment
from .communicator import DTYPES, REDUCE_OPS, Communicator, OpSpec, PreparedOp, Work
from .transports.base import Transport
from .transports.shm import ShmTransport

__all__ = ["init", "Communicator", "PreparedOp", "Work", "OpSpec", "Transport", "ShmTransport", "World", "DTYPES",
           "REDUCE_OPS", "default_device"]


_inits = 0


def default_device(world: World) -> Any:
    """``<backend>:<local rank>``: the backend of ``ANYCHIP_LAUNCH_DEVICE`` (set by
    ``anychip launch --device``) or of the default device. A backend with fewer devices
    than local ranks (cpu, a single OpenCL device) is shared: rank r uses device r mod count."""
    from ..runtime.device import default_device as first
    from ..runtime.device import device as lookup
    from ..runtime.env import launch_device
    from ..runtime.registry import backends
    backend = launch_device()
    if not backend:
        backend = first().backend
    if ":" in backend:
        return lookup(backend)
    info = next((b for b in backends() if b.name == backend), None)
    if info is None or not info.available:
        why = "unknown" if info is None else f"unavailable: {info.reason}"
        raise InvalidArgumentError(f"collectives.init: backend {backend!r} is {why}")
    count = info.device_count
    return lookup(f"{backend}:{world.local_rank % count}")


def init(device: Any = None, *, world: World | None = None, timeout: float | None = None) -> Communicator:
    """The communicator of every rank of the job (collective: every rank calls it).

    ``device`` (a Device or a name) defaults to :func:`default_device`. Rank and size
    come from the launcher's environment (see :mod:`anychip.collectives._bootstrap`).
    ``timeout``: seconds each of its ops (and its splits' ops) may wait for the peers before
    raising CollectiveTimeout (default: ``ANYCHIP_COLLECTIVE_TIMEOUT``, which, when set,
    overrides it)."""
    from ..runtime.device import Device
    from ..runtime.device import device as lookup
    world = world or from_environment()
    if device is None:
        dev = default_device(world)
    elif isinstance(device, Device):
        dev = device
    else:
        dev = lookup(device)
    global _inits
    _inits += 1      # every rank calls init equally often: the n-th init of a job has its own name
    # one host: the chip's native library where it has one, else the shared-memory engine;
    # several hosts: MPI between them (see transports/choose.py)
    from .transports.choose import choose
    transport = choose(dev, world, f"{world.job_id}.world{_inits}", timeout=timeout)
    return Communicator(transport, dev, "world")
