"""The environment variables anychip reads, declared once: name -> :class:`Variable` (the default
as ``anychip info`` shows it, what it means, and, for a variable with a machine default, the
value every reader takes when it is unset).

Pure data with no imports of anychip, so that setup.py can read it from the source tree: it
writes the machine defaults as ``anychip/env_defaults.h`` (``ANYCHIP_DEFAULT_<NAME>`` without
the ``ANYCHIP_`` prefix, e.g. ``ANYCHIP_DEFAULT_CCL_SMALL``) for the C parts that read variables
themselves (the collective engine, the simulator), and runtime/env.py holds the rules and the
readers. A default is written here and nowhere else.
"""
from __future__ import annotations

from typing import NamedTuple

__all__: list[str] = []      # read by env.py (which exports VARIABLES) and setup.py


class Variable(NamedTuple):
    default: str                          # as shown (a sentence where there is no single value)
    meaning: str
    value: int | float | None = None      # what the readers take when it is unset (None: no number)


VARIABLES: dict[str, Variable] = {
    "ANYCHIP_DEVICES": Variable(
        "(unset: every available device)",
        "which devices to use and in what order: term;term, term = [!]backend:devices (e.g. "
        "'ascend:0,1;cpu:*'); the first is the default device"),
    "ANYCHIP_SIMULATE": Variable(
        "auto",
        "vendor backends without their library: auto = use the simulator, always = always the simulator, "
        "never = unavailable"),
    "ANYCHIP_SIM_DEVICES": Variable(
        "8",
        "number of devices of each simulated chip (0 to 64)",
        8),
    "ANYCHIP_SIM_MEMORY": Variable(
        "16GiB",
        "memory capacity of each simulated device, 1MiB to 1TiB (bytes, or a number with a binary unit "
        "K, M, G or T, e.g. 512MiB or 1.5G)",
        16 << 30),
    "ANYCHIP_SIM_SPIN_US": Variable(
        "20",
        "microseconds a simulated stream worker spins for its next op before it sleeps (0 to 1000000); a "
        "synchronizing thread spins 10 times as long",
        20),
    "ANYCHIP_PLUGIN_PATH": Variable(
        "(unset)",
        "C plugin libraries (anychip/plugin.h, or Paddle CustomDevice plugins exporting InitPlugin) to "
        "load: directories (every shared library in them) and library files, separated by ':' (Paddle's "
        "CUSTOM_DEVICE_ROOT directory is read too, see docs/paddle.md)"),
    "ANYCHIP_PADDLE": Variable(
        "ascend",
        "the simulated chip Paddle sees as its device anychip_<chip>: ascend, kunlun, hygon or none "
        "(Paddle's launcher takes one device type; docs/paddle.md)"),
    "ANYCHIP_PADDLE_KERNELS": Variable(
        "1",
        "0 = the Paddle bridges (the simulated chips' and C plugins') register none of their device "
        "kernels (every op then takes Paddle's CPU fallback; docs/paddle.md)"),
    "ANYCHIP_PADDLE_PROFILE": Variable(
        "0",
        "1 = the Paddle bridge writes, at exit, the calls and host time of each of its entries "
        "(docs/paddle.md)"),
    "ANYCHIP_ALLOC_CONF": Variable(
        "(unset)",
        "caching allocator knobs: max_split_size_mb:N,garbage_collection_threshold:F, or backend:native "
        "to turn caching off"),
    "ANYCHIP_COLLECTIVE_TIMEOUT": Variable(
        "300",
        "seconds a collective op may wait for its peers (on a chip's own library: run) before it raises "
        "CollectiveTimeout on every waiting rank; when set, it also overrides each torch.distributed "
        "group's own timeout (docs/torch.md)",
        300.0),
    "ANYCHIP_COLLECTIVE_TRANSPORT": Variable(
        "auto",
        "collectives on ascend / kunlun / hygon / cuda: auto = the chip's own library (HCCL, BKCL, RCCL, "
        "NCCL) when present, native = require it, host = always the shared-memory engine"),
    "ANYCHIP_COLLECTIVE_CHECK": Variable(
        "0",
        "1 = ranks compare each collective's op, count, dtype, root and reduce op first and report a "
        "mismatch on every rank"),
    "ANYCHIP_HOST_TRANSPORT": Variable(
        "auto",
        "host transport of devices without a native library: auto = the shared-memory engine on one "
        "host, MPI between hosts; shm; mpi"),
    "ANYCHIP_HOSTID": Variable(
        "(the host name)",
        "groups ranks by host for the hierarchical collectives, as NCCL_HOSTID"),
    "ANYCHIP_CCL_SMALL": Variable(
        "16384",
        "bytes per rank up to which a collective takes the one-round low-latency path",
        16384),
    "ANYCHIP_CCL_CHUNK": Variable(
        "1048576",
        "bytes per rank and round of the chunked shared-memory path",
        1 << 20),
    "ANYCHIP_CCL_ZERO_COPY_MIN": Variable(
        "65536",
        "message bytes from which simulated chips reduce zero-copy from the peers' device memory",
        65536),
    "ANYCHIP_CCL_SPIN_US": Variable(
        "200",
        "microseconds a collective wait spins before it sleeps on a futex",
        200.0),
    "ANYCHIP_RANK": Variable(
        "(set by anychip launch)",
        "this process's rank; also ANYCHIP_WORLD_SIZE, ANYCHIP_LOCAL_RANK, ANYCHIP_LOCAL_SIZE, "
        "ANYCHIP_JOB_ID"),
    "ANYCHIP_WORLD_SIZE": Variable(
        "(set by anychip launch)",
        "number of ranks of the job"),
    "ANYCHIP_LOCAL_RANK": Variable(
        "(set by anychip launch)",
        "rank among the ranks of this host"),
    "ANYCHIP_LOCAL_SIZE": Variable(
        "(set by anychip launch)",
        "number of ranks on this host"),
    "ANYCHIP_JOB_ID": Variable(
        "(set by anychip launch)",
        "names the job's shared-memory communicators"),
    "ANYCHIP_LAUNCH_DEVICE": Variable(
        "(set by anychip launch --device)",
        "backend of the ranks' devices (rank r on BACKEND:r)"),
    "ANYCHIP_TORCH": Variable(
        "(the launch device's backend, else the first built one)",
        "the backend PyTorch's device 'anychip' is bound to (docs/torch.md)"),
    "ANYCHIP_TORCH_AUTOLOAD": Variable(
        "(1 once a process has imported anychip.torch)",
        "1 = `import torch` binds the 'anychip' device (torch's backend autoload); set by anychip.torch "
        "for the processes it starts, 0 = never (docs/torch.md)"),
    "ANYCHIP_TORCH_CACHE": Variable(
        "~/.cache/anychip/torch",
        "where the PyTorch extension is compiled and kept"),
    "ANYCHIP_TORCH_KERNELS": Variable(
        "1",
        "ops of PyTorch's device on the chip's kernel table: 1 = those whose values are the CPU's bit "
        "for bit, all = also mm and float sums (rounded differently), 0 = none (docs/torch.md)"),
    "ANYCHIP_TORCH_C10D_DIRECT": Variable(
        "1",
        "1 = the c10d backend issues its hot ops (all_reduce, broadcast, all_gather_into_tensor, "
        "reduce_scatter_tensor of device tensors) in C++, straight to the chip's collective library; 0 = "
        "through anychip's communicator, as every other op (docs/torch.md)"),
    "ANYCHIP_STRESS_SECONDS": Variable(
        "(short)",
        "tests: how long each stress test runs"),
    "ANYCHIP_LOG_LEVEL": Variable(
        "WARNING",
        "level of the 'anychip' logger in the anychip command (DEBUG, INFO, WARNING, ERROR or CRITICAL)"),
}


def c_defaults_header() -> str:
    """The C header of the machine defaults (setup.py writes it as anychip/env_defaults.h)."""
    rows = []
    for name, var in VARIABLES.items():
        if var.value is not None:
            c = repr(float(var.value)) if isinstance(var.value, float) else f"{var.value}ull"
            rows.append(f"#define ANYCHIP_DEFAULT_{name.removeprefix('ANYCHIP_')} {c}\n")
            rows.append(f"#define ANYCHIP_DEFAULT_{name.removeprefix('ANYCHIP_')}_TEXT \"{var.default}\"\n")
    return ("/* Generated by setup.py from anychip/runtime/_variables.py: the defaults of the variables */\n"
            "/* the C parts read themselves (anychip info shows them with their meaning). */\n"
            "#ifndef ANYCHIP_ENV_DEFAULTS_H\n#define ANYCHIP_ENV_DEFAULTS_H\n" + "".join(rows) + "#endif\n")
