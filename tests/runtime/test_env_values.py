"""Values of the collectives' environment variables: every invalid one is flagged by
``anychip info`` (exit 1) and refused with a clear error where it is read; ``inf`` is a
timeout that never expires."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import collectives

BAD = [
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "abc", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "-1", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_COLLECTIVE_CHECK", "maybe", "want one of 0, 1, true, false, yes, no, on, off"),
    ("ANYCHIP_COLLECTIVE_TRANSPORT", "nccl", "want one of auto, native, host"),
    ("ANYCHIP_HOST_TRANSPORT", "tcp", "want one of auto, shm, mpi"),
    ("ANYCHIP_CCL_SMALL", "abc", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_CHUNK", "0", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_SPIN_US", "-1", "want a number of microseconds > 0"),
    ("ANYCHIP_CCL_ZERO_COPY_MIN", "abc", "want a whole number of bytes >= 0"),
    ("ANYCHIP_COLLECTIVE_TIMEOUT", "1_0", "want a number of seconds > 0 (inf: never)"),
    ("ANYCHIP_CCL_SMALL", "4096.5", "want a whole number of bytes > 0"),
    ("ANYCHIP_CCL_SPIN_US", "0x10", "want a number of microseconds > 0"),
    ("ANYCHIP_TORCH_KERNELS", "fast", "want one of 0, 1, all"),
    ("ANYCHIP_TORCH_C10D_DIRECT", "yes", "want one of 0, 1"),
]
GOOD = [("ANYCHIP_COLLECTIVE_TIMEOUT", "inf"), ("ANYCHIP_COLLECTIVE_TIMEOUT", "0.5"),
        ("ANYCHIP_COLLECTIVE_CHECK", "ON"), ("ANYCHIP_CCL_SMALL", "4096"), ("ANYCHIP_CCL_SPIN_US", "2.5"),
        ("ANYCHIP_CCL_ZERO_COPY_MIN", "0"), ("ANYCHIP_HOST_TRANSPORT", "mpi"), ("ANYCHIP_COLLECTIVE_TIMEOUT", "1e1"),
        ("ANYCHIP_CCL_SMALL", " 4096 "), ("ANYCHIP_COLLECTIVE_CHECK", " off ")]


def _info(name: str, value: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYCHIP_")}
    env[name] = value
    return subprocess.run([sys.executable, "-m", "anychip.cli", "info"], capture_output=True, text=True, env=env,
                          timeout=CHILD_SECONDS)


@pytest.mark.parametrize(("name", "value", "why"), BAD)
@pytest.mark.slow
def test_anychip_info_flags_every_invalid_collectives_value(name, value, why):
    r = _info(name, value)
    assert r.returncode == 1, r.stdout
    assert f"anychip: error: {name}={value!r} is invalid: {why}\n" in r.stderr, r.stderr
    assert f"      <- INVALID: {why}" in r.stdout


@pytest.mark.parametrize(("name", "value"), GOOD)
@pytest.mark.slow
def test_anychip_info_accepts_valid_values(name, value):
    r = _info(name, value)
    assert r.returncode == 0, r.stderr
    assert "INVALID" not in r.stdout


def _single(device: str, monkeypatch: pytest.MonkeyPatch):
    world = collectives.World(0, 1, 0, 1, f"env-test-{os.getpid()}-{time.monotonic_ns()}", "none")
    return collectives.init(device, world=world)


def test_a_bad_zero_copy_threshold_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ANYCHIP_CCL_ZERO_COPY_MIN", "abc")
    with pytest.raises(anychip.InvalidArgumentError) as info:
        _single("cpu:0", monkeypatch)
    assert str(info.value) == "ANYCHIP_CCL_ZERO_COPY_MIN='abc' is not a whole number of bytes >= 0"


#: the variables the C engine reads itself: a bad value is refused before a communicator is made
ENGINE_BAD = [b for b in BAD if b[0] in ("ANYCHIP_CCL_SMALL", "ANYCHIP_CCL_CHUNK", "ANYCHIP_CCL_SPIN_US",
                                         "ANYCHIP_COLLECTIVE_CHECK")]


@pytest.mark.parametrize(("name", "value", "why"), ENGINE_BAD)
def test_a_bad_value_the_engine_would_ignore_is_refused_at_init(name, value, why, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        _single("cpu:0", monkeypatch)
    assert str(info.value) == f"{name}={value!r} is invalid: {why}"


def test_the_collective_check_flag_reads_every_spelling(monkeypatch):
    from anychip.runtime.env import collective_check
    for value, on in (("1", True), (" ON ", True), ("yes", True), ("true", True), ("off", False), ("0", False),
                      ("No", False), ("", False)):
        monkeypatch.setenv("ANYCHIP_COLLECTIVE_CHECK", value)
        assert collective_check() is on, value


SIM = [d for d in ("cpu:0", "ascend:0", "hygon:0") if any(x.name == d for x in anychip.devices())]


def test_a_groups_timeout_applies_unless_the_variable_is_set(monkeypatch):
    """env.collective_timeout(group): the variable, when set, overrides a group's own timeout; else
    the group's, else the default (300 s); inf is never (the engine's NEVER_S)."""
    from anychip.runtime.env import NEVER_S, collective_timeout
    monkeypatch.delenv("ANYCHIP_COLLECTIVE_TIMEOUT", raising=False)
    assert (collective_timeout(), collective_timeout(2.5), collective_timeout(float("inf"))) == (300.0, 2.5, NEVER_S)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(anychip.InvalidArgumentError, match=r"a collective timeout must be > 0 seconds, got "):
            collective_timeout(bad)
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "7")
    assert (collective_timeout(), collective_timeout(2.5)) == (7.0, 7.0)
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "inf")
    assert collective_timeout(2.5) == NEVER_S


def test_a_timeouts_source_is_named_as_it_applies(monkeypatch):
    """env.collective_timeout_from(group), the words every timeout error ends with: the variable
    with its value (and the group's own it overrides), the group's own, or the default."""
    from anychip.runtime.env import collective_timeout_from, collective_timeout_set
    monkeypatch.delenv("ANYCHIP_COLLECTIVE_TIMEOUT", raising=False)
    assert not collective_timeout_set()
    assert collective_timeout_from() == "the default; ANYCHIP_COLLECTIVE_TIMEOUT is unset"
    assert collective_timeout_from(2.5) == "the group's own timeout"
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", " 7 ")
    assert collective_timeout_set()
    assert collective_timeout_from() == "ANYCHIP_COLLECTIVE_TIMEOUT=7"
    assert collective_timeout_from(2.5) == "ANYCHIP_COLLECTIVE_TIMEOUT=7, which overrides the group's own 2.5 s"


@pytest.mark.parametrize("device", SIM)
def test_an_infinite_timeout_never_expires(device, monkeypatch):
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "inf")
    comm = _single(device, monkeypatch)
    try:
        buf = comm.device.alloc(16).copy_from(np.arange(4, dtype=np.float32))
        comm.all_reduce(buf).wait()
        assert buf.to_numpy(np.float32).tolist() == [0, 1, 2, 3]
    finally:
        comm.destroy()


PROG = """
import numpy as np
from anychip import collectives
comm = collectives.init()
buf = comm.device.alloc(16).copy_from(np.full(4, comm.rank + 1, np.float32))
comm.all_reduce(buf).wait()
print("sum", buf.to_numpy(np.float32).tolist(), comm.transport.name)
comm.destroy()
"""


@pytest.mark.parametrize("backend", [b for b in ("cpu", "ascend") if any(d.backend == b for d in anychip.devices())])
@pytest.mark.slow
def test_an_infinite_timeout_on_two_ranks(backend, tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    env["ANYCHIP_COLLECTIVE_TIMEOUT"] = "inf"
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", "--device", backend, str(prog)],
                       capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[{rank}] sum [3.0, 3.0, 3.0, 3.0]" in r.stdout, r.stdout


RANK_WHY = "want a rank: a whole number from 0 to 2147483646 (plain digits 0-9)"
SIZE_WHY = "want a number of ranks: a whole number from 1 to 2147483647 (plain digits 0-9)"
NAME_WHY = "want a backend name, optionally with a device index (e.g. ascend or ascend:1)"
#: the launcher's and the devices' variables: a huge number, -1, non-ASCII digits, nan, ...
LAUNCH_BAD = [(name, value, RANK_WHY if "RANK" in name else SIZE_WHY)
              for name in ("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE")
              for value in ("9" * 400, "9" * 5000, "-1", "\uff10", "\u0661", "nan", "1.0", "1e3", "2147483648", "0x1")]
LAUNCH_BAD += [(name, value, NAME_WHY) for name in ("ANYCHIP_LAUNCH_DEVICE", "ANYCHIP_TORCH")
               for value in ("9" * 400, "-1", "asc\u00e9nd", "ascend:-1", "ascend:\uff11", "ascend:1:2", "a b")]
LAUNCH_BAD += [("ANYCHIP_WORLD_SIZE", "0", SIZE_WHY), ("ANYCHIP_LOCAL_SIZE", "0", SIZE_WHY)]


@pytest.mark.parametrize(("name", "value", "why"), LAUNCH_BAD)
def test_the_launch_variables_refuse_bad_values(name, value, why, monkeypatch):
    """``anychip info``'s rule (problems) and the reader agree: a clear error naming the
    variable, the value and what is right (before: an OverflowError, or -1 taken as a rank)."""
    from anychip.runtime import env
    assert env.problems({name: value}) == {name: why}
    monkeypatch.setenv(name, value)
    read = {"ANYCHIP_LAUNCH_DEVICE": env.launch_device, "ANYCHIP_TORCH": env.torch_backend}.get(
        name, lambda: env.launcher_int(name))
    with pytest.raises(anychip.InvalidArgumentError) as info:
        read()
    assert str(info.value) == f"{name}={value!r} is invalid: {why}"


def test_the_launch_variables_take_good_values_and_are_checked_together(monkeypatch):
    from anychip.collectives._bootstrap import from_environment
    from anychip.runtime import env
    good = {"ANYCHIP_RANK": " 3 ", "ANYCHIP_WORLD_SIZE": "4", "ANYCHIP_LOCAL_RANK": "1", "ANYCHIP_LOCAL_SIZE": "2",
            "ANYCHIP_LAUNCH_DEVICE": "cpu", "ANYCHIP_TORCH": "cpu:0"}
    assert env.problems(good) == {}
    assert env.problems({**good, "ANYCHIP_RANK": "4"}) == {"ANYCHIP_RANK": "want below ANYCHIP_WORLD_SIZE=4"}
    assert env.problems({**good, "ANYCHIP_LOCAL_RANK": "2"}) == {
        "ANYCHIP_LOCAL_RANK": "want below ANYCHIP_LOCAL_SIZE=2"}
    assert env.problems({**good, "ANYCHIP_LOCAL_SIZE": "5"}) == {
        "ANYCHIP_LOCAL_SIZE": "want at most ANYCHIP_WORLD_SIZE=4"}
    names = ", ".join(b.name for b in anychip.backends())
    assert env.problems({"ANYCHIP_LAUNCH_DEVICE": "nan", "ANYCHIP_TORCH": "nosuchchip:1"}) == {
        "ANYCHIP_LAUNCH_DEVICE": f"no backend 'nan' here; want one of {names}",
        "ANYCHIP_TORCH": f"no backend 'nosuchchip' here; want one of {names}"}
    for k, v in good.items():
        monkeypatch.setenv(k, v)
    w = from_environment()
    assert (w.rank, w.size, w.local_rank, w.local_size) == (3, 4, 1, 2)
    assert (env.launch_device(), env.torch_backend()) == ("cpu", "cpu:0")
    monkeypatch.setenv("ANYCHIP_LOCAL_RANK", "2")
    with pytest.raises(anychip.InvalidArgumentError,
                       match=r"^ANYCHIP_LOCAL_RANK=2 is not in \[0, ANYCHIP_LOCAL_SIZE=2\)$"):
        from_environment()
    monkeypatch.setenv("ANYCHIP_LOCAL_RANK", "1")
    monkeypatch.setenv("ANYCHIP_LOCAL_SIZE", "5")
    with pytest.raises(anychip.InvalidArgumentError, match=r"^ANYCHIP_LOCAL_SIZE=5 is more than ANYCHIP_WORLD_SIZE=4$"):
        from_environment()
    monkeypatch.setenv("PMI_SIZE", "\uff12")       # another launcher's variables follow the same rule
    with pytest.raises(anychip.InvalidArgumentError, match=f"^PMI_SIZE='\uff12' is invalid: {re.escape(SIZE_WHY)}$"):
        env.launcher_int("PMI_SIZE")


@pytest.mark.slow
def test_anychip_info_flags_the_launch_variables():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYCHIP_")}
    env.update(ANYCHIP_RANK="-1", ANYCHIP_WORLD_SIZE="9" * 400, ANYCHIP_LOCAL_RANK="\uff10", ANYCHIP_LOCAL_SIZE="nan",
               ANYCHIP_LAUNCH_DEVICE="nan", ANYCHIP_TORCH="-1")
    r = subprocess.run([sys.executable, "-m", "anychip.cli", "info"], capture_output=True, text=True, env=env,
                       timeout=CHILD_SECONDS)
    assert r.returncode == 1, r.stdout
    names = ", ".join(b.name for b in anychip.backends())
    for name, why in (("ANYCHIP_RANK", RANK_WHY), ("ANYCHIP_WORLD_SIZE", SIZE_WHY), ("ANYCHIP_LOCAL_RANK", RANK_WHY),
                      ("ANYCHIP_LOCAL_SIZE", SIZE_WHY), ("ANYCHIP_TORCH", NAME_WHY),
                      ("ANYCHIP_LAUNCH_DEVICE", f"no backend 'nan' here; want one of {names}")):
        assert f"anychip: error: {name}={env[name]!r} is invalid: {why}\n" in r.stderr, r.stderr


def test_each_default_is_declared_once_and_the_c_parts_take_it(monkeypatch):
    """_variables.py declares every variable's default; the readers, `anychip info` and the C parts
    (through the generated anychip/env_defaults.h) take it from there, and no C reader of an
    ANYCHIP_ variable writes a default of its own."""
    from pathlib import Path

    from anychip._data import get_include
    from anychip.runtime import env
    from anychip.runtime._variables import VARIABLES, c_defaults_header

    numbers = {k: v for k, v in VARIABLES.items() if v.value is not None}
    assert set(numbers) == {"ANYCHIP_SIM_DEVICES", "ANYCHIP_SIM_MEMORY", "ANYCHIP_SIM_SPIN_US",
                            "ANYCHIP_COLLECTIVE_TIMEOUT", "ANYCHIP_CCL_SMALL", "ANYCHIP_CCL_CHUNK",
                            "ANYCHIP_CCL_ZERO_COPY_MIN", "ANYCHIP_CCL_SPIN_US"}
    for name, var in numbers.items():        # the shown default is the value, by the variable's own rule
        assert env.problem(name, var.default) is None, name
        shown = env.parse_sim_memory(var.default) if name == "ANYCHIP_SIM_MEMORY" else float(var.default)
        assert shown == var.value, name
    for name in ("ANYCHIP_COLLECTIVE_TIMEOUT", "ANYCHIP_CCL_ZERO_COPY_MIN"):
        monkeypatch.delenv(name, raising=False)
    assert env.collective_timeout() == 300.0 == VARIABLES["ANYCHIP_COLLECTIVE_TIMEOUT"].value
    assert env.zero_copy_min() == 65536 == VARIABLES["ANYCHIP_CCL_ZERO_COPY_MIN"].value
    root = Path(__file__).resolve().parents[2] / "csrc"
    # generated: under build/include in a checkout, with the headers in a wheel
    built = [p / "anychip" / "env_defaults.h" for p in (Path(get_include()), root.parent / "build" / "include")]
    header = next(p for p in built if p.exists()).read_text()
    assert header == c_defaults_header() and "#define ANYCHIP_DEFAULT_CCL_SMALL 16384ull\n" in header
    readers = re.compile(r"(getenv|env_\w+)\(\s*\"ANYCHIP_\w+\"\s*,\s*[0-9]")     # (-1: "is it set")
    own = [f"{p.relative_to(root)}:{i}" for p in [*root.glob("ccl/*.c"), *root.glob("sim/*.c")]
           for i, line in enumerate(p.read_text().splitlines(), 1) if readers.search(line)]
    assert own == []
