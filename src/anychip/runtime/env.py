"""Every environment variable anychip reads: the rule its values follow and the one function
that reads it. What each means and its default are declared once, in ``_variables.py``
(``anychip info`` shows them; setup.py writes the defaults the C parts take into
``anychip/env_defaults.h``).

Code elsewhere asks this module (``env.collective_timeout()``, ``env.simulate()``, ...)
rather than ``os.environ``. A reader refuses a bad value with an
:class:`InvalidArgumentError` naming the variable, the value and what would be right;
``anychip info`` applies the same rules (:func:`problems`) to what is set.

Some variables are read by the C parts too: the simulator (``csrc/sim``: the
``ANYCHIP_SIM_*`` variables, ``ANYCHIP_CCL_ZERO_COPY_MIN`` and ``ANYCHIP_COLLECTIVE_CHECK``
of its vendor collectives), the collective engine (``csrc/ccl``: ``ANYCHIP_CCL_SMALL``,
``_CHUNK``, ``_SPIN_US`` and ``ANYCHIP_COLLECTIVE_TIMEOUT``) and the Paddle bridge
(``ANYCHIP_PADDLE``, ``ANYCHIP_PADDLE_KERNELS``). They follow the rules written here
(whole numbers are digits, numbers are decimals with an optional exponent, blanks around
a value are ignored); a library cannot raise, so it ignores a bad value (the simulator
says so on stderr) and uses the default, and the Python side refuses it first
(:func:`check_engine` before a communicator is made).
"""
from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._variables import VARIABLES
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .alloc_conf import AllocatorConf

__all__ = ["VARIABLES", "in_effect", "problem", "problems", "parse_sim_memory", "log_level", "collective_check",
           "collective_timeout", "zero_copy_min", "collective_transport", "host_transport", "host_id", "launch_device",
           "check_engine", "devices", "plugin_path", "alloc_conf", "simulate", "paddle_chip", "torch_backend",
           "torch_c10d_direct", "torch_cache", "job_id", "launcher_int", "value", "set_backend_lookup", "NEVER_S"]


SIM_MIN_MEMORY = 1 << 20
SIM_MAX_MEMORY = 1 << 40
_SIZE = re.compile(r"^[ \t]*([0-9]+\.?[0-9]*|\.[0-9]+)[ \t]*(?:([kmgtKMGT])[iI]?)?[bB]?[ \t]*$")
_WHOLE = re.compile(r"^[ \t]*([0-9]+)[ \t]*$")
#: a decimal number: digits with an optional fraction and exponent (no sign, inf, nan or hex)
_DECIMAL = re.compile(r"^[ \t]*(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*$")
_UNITS = {"k": 1, "m": 2, "g": 3, "t": 4}
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _default(name: str) -> float:
    """The value the readers take where ``name`` is unset (declared in _variables.py)."""
    default = VARIABLES[name].value
    assert default is not None, f"{name} has no machine default in _variables.py"
    return default


def _value(name: str) -> str:
    """The variable's value without surrounding blanks ("" when unset)."""
    return os.environ.get(name, "").strip()


def value(name: str) -> str | None:
    """The raw value of the variable ``name`` (None when unset), for display; ``name`` must be
    one of :data:`VARIABLES`."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of anychip's variables (runtime/env.py VARIABLES)")
    return os.environ.get(name)


def _checked(name: str) -> str:
    """The variable's value without surrounding blanks ("" when unset); a value its rule
    refuses raises InvalidArgumentError naming the variable, the value and what would be right."""
    raw = _value(name)
    why = problem(name, raw)
    if why:
        raise InvalidArgumentError(f"{name}={os.environ[name]!r} is invalid: {why}")
    return raw


def in_effect() -> dict[str, str]:
    """The ANYCHIP_* variables set in this process (known or not)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ANYCHIP_")}


def parse_sim_memory(text: str) -> float | None:
    """Bytes named by an ``ANYCHIP_SIM_MEMORY`` value, or None when it is malformed.

    The simulator's rule: a decimal number (digits with an optional fraction; no
    sign, exponent, inf or nan), optional blanks, then an optional binary unit
    K, M, G or T (any case), optionally followed by ``i`` and/or ``B``, or a lone
    ``B``; blanks around the value are ignored.
    """
    m = _SIZE.match(text)
    if m is None:
        return None
    unit = m.group(2)
    return float(m.group(1)) * 1024 ** (_UNITS[unit.lower()] if unit else 0)


def _whole(text: str, lo: int, hi: int) -> int | None:
    m = _WHOLE.match(text)
    if m is None or len(m.group(1).lstrip("0")) > len(str(hi)):    # (int() refuses 4300 digits and more)
        return None
    v = int(m.group(1))
    return v if lo <= v <= hi else None


def _decimal(text: str) -> float | None:
    """The finite number ``text`` writes (the decimal grammar above), or None."""
    if _DECIMAL.match(text) is None:
        return None
    v = float(text)
    return v if math.isfinite(v) else None


def _seconds(text: str) -> float | None:
    """A timeout: a decimal number of seconds, or inf (never)."""
    return math.inf if text.strip().lower() == "inf" else _decimal(text)


def _sim_memory(text: str) -> str | None:
    v = parse_sim_memory(text)
    if v is None:
        return "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB (e.g. 16GiB)"
    if not SIM_MIN_MEMORY <= v <= SIM_MAX_MEMORY:
        return "want from 1MiB to 1TiB of memory per device"
    return None


def _sim_devices(text: str) -> str | None:
    return None if _whole(text, 0, 64) is not None else "want a whole number of devices from 0 to 64"


def _sim_spin(text: str) -> str | None:
    if _whole(text, 0, 1_000_000) is None:
        return "want a whole number of microseconds from 0 to 1000000"
    return None


def _simulate(text: str) -> str | None:
    return None if text.strip().lower() in ("", "auto", "always", "never") else "want auto, always or never"


# -- the readers --------------------------------------------------------------------------

def devices() -> str | None:
    """``ANYCHIP_DEVICES`` as set (None when unset); :mod:`.selection` parses it."""
    return os.environ.get("ANYCHIP_DEVICES")


def plugin_path() -> str:
    """``ANYCHIP_PLUGIN_PATH`` ("" when unset): directories and library files, ':'-separated."""
    return os.environ.get("ANYCHIP_PLUGIN_PATH", "")


def alloc_conf() -> AllocatorConf:
    """``ANYCHIP_ALLOC_CONF`` parsed (a bad item raises, naming the variable and the item)."""
    from .alloc_conf import AllocatorConf
    return AllocatorConf.parse(os.environ.get("ANYCHIP_ALLOC_CONF"))


def simulate() -> str:
    """``ANYCHIP_SIMULATE``: ``auto`` (default), ``always`` or ``never``."""
    name, modes = "ANYCHIP_SIMULATE", ("auto", "always", "never")
    mode = _value(name).lower()
    if not mode:
        return "auto"
    if mode not in modes:
        raise InvalidArgumentError(f"{name}={os.environ.get(name)!r} is not one of {', '.join(modes)}")
    return mode


#: the simulated chips the Paddle bridge can serve
PADDLE_CHIPS = ("ascend", "kunlun", "hygon")


def paddle_chip(text: str | None) -> str | None:
    """The simulated chip an ``ANYCHIP_PADDLE`` value selects: ascend when unset, else the
    first chip it names (blanks or commas between names), None for none. The bridge
    (csrc/paddle/init.c, ``chosen_simulator``) reads it the same way."""
    if text is None:
        return "ascend"
    for name in text.replace(",", " ").split():
        if name.lower() in PADDLE_CHIPS:
            return name.lower()
    return None


def collective_check() -> bool:
    """``ANYCHIP_COLLECTIVE_CHECK`` (1, true, yes, on; 0, false, no, off; any case): ranks compare
    every op's signature first (the backends' libraries have no such check, so a plugin's
    ``native_ccl()`` yields to the host transport)."""
    return _checked("ANYCHIP_COLLECTIVE_CHECK").lower() in ("1", "true", "yes", "on")


#: what the C engine reads itself (csrc/ccl/ccl.c, csrc/sim/collective.c), checked by check_engine
_ENGINE = ("ANYCHIP_CCL_SMALL", "ANYCHIP_CCL_CHUNK", "ANYCHIP_CCL_SPIN_US", "ANYCHIP_COLLECTIVE_CHECK")


def check_engine() -> None:
    """Refuse a bad value of a variable the C engine reads itself (it would ignore it)."""
    collective_timeout()
    zero_copy_min()
    for name in _ENGINE:
        _checked(name)


def torch_backend() -> str:
    """``ANYCHIP_TORCH`` ("" when unset): the backend (or ``backend:index``) of PyTorch's device;
    a value that names neither raises."""
    return _checked("ANYCHIP_TORCH")


def torch_kernels() -> int:
    """``ANYCHIP_TORCH_KERNELS`` as the PyTorch extension takes it: 0 (none), 1 (the ops whose
    values are the CPU's bit for bit; the default) or 2 (``all``); a bad value raises."""
    return {"": 1, "0": 0, "1": 1, "all": 2}[_checked("ANYCHIP_TORCH_KERNELS")]


def torch_c10d_direct() -> bool:
    """``ANYCHIP_TORCH_C10D_DIRECT`` (default 1): whether the c10d backend's hot ops take its
    C++ path; a bad value raises."""
    return _checked("ANYCHIP_TORCH_C10D_DIRECT") != "0"


def torch_autoload() -> bool:
    """``ANYCHIP_TORCH_AUTOLOAD``: whether ``import torch`` binds the ``anychip`` device; a bad
    value raises."""
    return _checked("ANYCHIP_TORCH_AUTOLOAD") == "1"


def mark_torch_autoload() -> None:
    """Set ``ANYCHIP_TORCH_AUTOLOAD=1`` (unless set) for the processes this one starts."""
    os.environ.setdefault("ANYCHIP_TORCH_AUTOLOAD", "1")


def torch_cache() -> str:
    """``ANYCHIP_TORCH_CACHE`` ("" when unset): where the PyTorch extension is built."""
    return os.environ.get("ANYCHIP_TORCH_CACHE", "")


def job_id() -> str:
    """``ANYCHIP_JOB_ID`` as set ("" when unset): names the job's shared-memory communicators."""
    return os.environ.get("ANYCHIP_JOB_ID", "")


#: the most ranks a job may have (the vendors' libraries and MPI count ranks in a C int)
MAX_RANKS = 2**31 - 1
#: the launchers' variables that hold a number of ranks (the others hold a rank)
_SIZES = frozenset({"ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_SIZE", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"})


def launcher_int(name: str) -> int:
    """A launcher's rank or size variable (``ANYCHIP_RANK``, ``RANK``, ``PMI_SIZE``, ...) as an int:
    plain digits, a rank from 0 and a size from 1, at most :data:`MAX_RANKS`; anything else
    raises, naming the variable, the value and what would be right (for anychip's own, the rule
    ``anychip info`` applies)."""
    raw = os.environ[name]
    why = (_CHECKS.get(name) or (_ranks if name in _SIZES else _rank))(raw)    # (set but empty is refused too)
    if why:
        raise InvalidArgumentError(f"{name}={raw!r} is invalid: {why}")
    return int(raw.strip())


#: what the engine is given for "never" (its deadlines are nanoseconds in 64 bits): 31 years
NEVER_S = 1e9


def collective_timeout(group: float | None = None) -> float:
    """Seconds an op of a communicator may wait for its peers: ``ANYCHIP_COLLECTIVE_TIMEOUT`` when
    set (it overrides every group's own), else ``group`` (the timeout a communicator was made with:
    a ``torch.distributed`` group's), else the default in _variables.py. ``inf`` is never, given to
    the engine as :data:`NEVER_S`."""
    name = "ANYCHIP_COLLECTIVE_TIMEOUT"
    raw = _value(name)
    if not raw:
        if group is not None:
            if not group > 0:
                raise InvalidArgumentError(f"a collective timeout must be > 0 seconds, got {group!r}")
            return min(float(group), NEVER_S)
        return float(_default(name))
    value = _seconds(raw)
    if value is None:
        raise InvalidArgumentError(f"{name}={raw!r} is not a number of seconds (inf: never)")
    if not value > 0:
        raise InvalidArgumentError(f"{name}={raw!r} must be > 0 seconds (inf: never)")
    return min(value, NEVER_S)


def collective_timeout_set() -> bool:
    """Whether ``ANYCHIP_COLLECTIVE_TIMEOUT`` is set: it then overrides every group's own timeout,
    and a library that reads it (the engine, the simulator's HCCL / BKCL / RCCL) is given none,
    so that its timeout errors name the variable."""
    return bool(_value("ANYCHIP_COLLECTIVE_TIMEOUT"))


def collective_timeout_from(group: float | None = None) -> str:
    """Where :func:`collective_timeout` ``(group)`` comes from, as timeout errors name it:
    ``ANYCHIP_COLLECTIVE_TIMEOUT=V`` when set (and the group's own it overrides), else the
    group's own timeout, else the default."""
    name = "ANYCHIP_COLLECTIVE_TIMEOUT"
    raw = _value(name)
    if raw:
        return f"{name}={raw}" + ("" if group is None else f", which overrides the group's own {group:g} s")
    if group is not None:
        return "the group's own timeout"
    return f"the default; {name} is unset"


def zero_copy_min() -> int:
    """``ANYCHIP_CCL_ZERO_COPY_MIN``: message bytes from which simulated chips reduce zero-copy
    (default in _variables.py)."""
    name = "ANYCHIP_CCL_ZERO_COPY_MIN"
    raw = _value(name)
    if not raw:
        return int(_default(name))
    value = _whole(raw, 0, 2**63)
    if value is None:
        raise InvalidArgumentError(f"{name}={raw!r} is not a whole number of bytes >= 0")
    return value


def collective_transport() -> str:
    """``ANYCHIP_COLLECTIVE_TRANSPORT``: auto (default), native or host."""
    name, choices = "ANYCHIP_COLLECTIVE_TRANSPORT", ("auto", "native", "host")
    raw = _value(name)
    mode = raw.lower() or "auto"
    if mode not in choices:
        raise InvalidArgumentError(f"{name}={os.environ[name]!r} is not one of {', '.join(choices)}")
    return mode


def host_transport() -> str:
    """``ANYCHIP_HOST_TRANSPORT``: auto (default), shm or mpi."""
    name = "ANYCHIP_HOST_TRANSPORT"
    mode = _value(name).lower() or "auto"
    if mode not in ("auto", "shm", "mpi"):
        raise InvalidArgumentError(f"{name}={mode!r} is not understood; use auto, shm or mpi")
    return mode


def host_id() -> str:
    """``ANYCHIP_HOSTID`` (blanks stripped; "" when unset): what groups ranks by host."""
    return _value("ANYCHIP_HOSTID")


def launch_device() -> str:
    """``ANYCHIP_LAUNCH_DEVICE`` (set by ``anychip launch --device``): the ranks' backend, or a
    device name; "" when unset; a value that names neither raises."""
    return _checked("ANYCHIP_LAUNCH_DEVICE")


def log_level(text: str | None) -> int | None:
    """The logging level an ``ANYCHIP_LOG_LEVEL`` value names (any case), None when it names none."""
    if text is None or not text.strip():
        return logging.WARNING
    name = text.strip().upper()
    return getattr(logging, name) if name in _LEVELS else None


def _log_level(text: str) -> str | None:
    return None if log_level(text) is not None else f"want one of {', '.join(_LEVELS)}"


def _alloc_conf(text: str) -> str | None:
    from .alloc_conf import AllocatorConf
    from .errors import AnychipError
    try:
        AllocatorConf.parse(text)
    except AnychipError as exc:
        return str(exc).partition("\n\n")[0]
    return None


#: the backends ANYCHIP_DEVICES is checked against, installed by the registry when it loads
#: (every runtime module asks this one, so it is handed the lookup instead of importing it)
_backend_lookup: Callable[[], Sequence[Any]] | None = None


def set_backend_lookup(lookup: Callable[[], Sequence[Any]]) -> None:
    """Install the registry's ``backends`` (the registry does, at import)."""
    global _backend_lookup
    _backend_lookup = lookup


def _devices(text: str) -> str | None:
    from .errors import SelectionError
    from .selection import parse, select
    try:
        if _backend_lookup is None:
            parse(text)                       # no registry loaded: the grammar only
        else:
            select(text, _backend_lookup())
    except SelectionError as exc:
        return str(exc).partition("\n\n")[0]
    return None


def _paddle(text: str) -> str | None:
    names = [t for t in text.replace(",", " ").split() if t]
    unknown = [t for t in names if t.lower() not in (*PADDLE_CHIPS, "none")]
    if unknown:
        return f"{', '.join(unknown)}: want one simulated chip (ascend, kunlun or hygon) or none"
    if len(names) > 1:
        return f"names {len(names)} chips; Paddle's bridge serves one per process (the first, {names[0]}, is used)"
    return None


def _timeout(text: str) -> str | None:
    v = _seconds(text)
    return None if v is not None and v > 0 else "want a number of seconds > 0 (inf: never)"


def _choice(*choices: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        return None if text.strip().lower() in choices else f"want one of {', '.join(choices)}"
    return check


def _engine_number(what: str, whole: bool) -> Callable[[str], str | None]:
    """A value the collective engine takes: a whole number > 0, or a decimal number > 0 (the
    engine replaces anything else by its default)."""
    def check(text: str) -> str | None:
        v = _whole(text, 1, 2**63) if whole else _decimal(text)
        return None if v is not None and v > 0 else f"want {'a whole number of ' if whole else 'a number of '}" \
            f"{what} > 0"
    return check


def _rank(text: str) -> str | None:
    if _whole(text, 0, MAX_RANKS - 1) is None:
        return f"want a rank: a whole number from 0 to {MAX_RANKS - 1} (plain digits 0-9)"
    return None


def _ranks(text: str) -> str | None:
    if _whole(text, 1, MAX_RANKS) is None:
        return f"want a number of ranks: a whole number from 1 to {MAX_RANKS} (plain digits 0-9)"
    return None


#: a backend, or one of its devices (``ascend``, ``ascend:1``): the grammar of ANYCHIP_DEVICES' names
_BACKEND = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(?::[0-9]+)?", re.ASCII)


def _backend_name(text: str) -> str | None:
    if _BACKEND.fullmatch(text.strip()) is None:
        return "want a backend name, optionally with a device index (e.g. ascend or ascend:1)"
    return None


def _no_such_backend(text: str) -> str | None:
    """For ``anychip info``: a backend name the registry does not know (the readers' callers say
    it themselves, with what the backend lacks)."""
    if _backend_lookup is None:
        return None
    names = [b.name for b in _backend_lookup()]
    name = text.strip().partition(":")[0].lower()
    return None if name in names else f"no backend {name!r} here; want one of {', '.join(names)}"


def _zero_copy(text: str) -> str | None:
    return None if _whole(text, 0, 2**63) is not None else "want a whole number of bytes >= 0"


_CHECKS: dict[str, Callable[[str], str | None]] = {
    "ANYCHIP_COLLECTIVE_TIMEOUT": _timeout,
    "ANYCHIP_COLLECTIVE_TRANSPORT": _choice("auto", "native", "host"),
    "ANYCHIP_COLLECTIVE_CHECK": _choice("0", "1", "true", "false", "yes", "no", "on", "off"),
    "ANYCHIP_HOST_TRANSPORT": _choice("auto", "shm", "mpi"),
    "ANYCHIP_CCL_SMALL": _engine_number("bytes", True),
    "ANYCHIP_CCL_CHUNK": _engine_number("bytes", True),
    "ANYCHIP_CCL_SPIN_US": _engine_number("microseconds", False),
    "ANYCHIP_CCL_ZERO_COPY_MIN": _zero_copy,
    "ANYCHIP_DEVICES": _devices,
    "ANYCHIP_SIMULATE": _simulate,
    "ANYCHIP_SIM_DEVICES": _sim_devices,
    "ANYCHIP_SIM_MEMORY": _sim_memory,
    "ANYCHIP_SIM_SPIN_US": _sim_spin,
    "ANYCHIP_PADDLE": _paddle,
    "ANYCHIP_PADDLE_KERNELS": _choice("0", "1"),
    "ANYCHIP_PADDLE_PROFILE": _choice("0", "1"),
    "ANYCHIP_TORCH_KERNELS": _choice("0", "1", "all"),
    "ANYCHIP_TORCH_C10D_DIRECT": _choice("0", "1"),
    "ANYCHIP_TORCH_AUTOLOAD": _choice("0", "1"),
    "ANYCHIP_ALLOC_CONF": _alloc_conf,
    "ANYCHIP_LOG_LEVEL": _log_level,
    "ANYCHIP_RANK": _rank,
    "ANYCHIP_WORLD_SIZE": _ranks,
    "ANYCHIP_LOCAL_RANK": _rank,
    "ANYCHIP_LOCAL_SIZE": _ranks,
    "ANYCHIP_LAUNCH_DEVICE": _backend_name,
    "ANYCHIP_TORCH": _backend_name,
}
#: (a rank or size, the size it must be below (True) or at most (False)), for problems()
_BELOW = (("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", True), ("ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE", True),
          ("ANYCHIP_LOCAL_SIZE", "ANYCHIP_WORLD_SIZE", False))


def problem(name: str, value: str) -> str | None:
    """What is wrong with ``value`` for the variable ``name`` (None: nothing, or not checked).
    An empty value means "unset" for every variable."""
    check = _CHECKS.get(name)
    if check is None or not value.strip():
        return None
    return check(value)


def problems(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every known ANYCHIP_* variable set to a value anychip (or its simulator) refuses or ignores."""
    env = os.environ if environ is None else environ
    found = {}
    for name in VARIABLES:
        value = env.get(name)
        if value is not None:
            why = problem(name, value)
            if not why and value.strip() and name in ("ANYCHIP_LAUNCH_DEVICE", "ANYCHIP_TORCH"):
                why = _no_such_backend(value)
            if why:
                found[name] = why
    for low, high, strict in _BELOW:
        a, b = env.get(low, "").strip(), env.get(high, "").strip()
        if a and b and low not in found and high not in found and (int(a) >= int(b) if strict else int(a) > int(b)):
            found[low] = f"want {'below' if strict else 'at most'} {high}={b}"
    return found
