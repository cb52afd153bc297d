"""The anychip command, run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import CHILD_SECONDS


def run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "anychip.cli", *args], capture_output=True, text=True, env=e,
                          timeout=CHILD_SECONDS)


def test_devices_table_lists_every_backend():
    r = run("devices")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["DEVICE", "KIND", "NAME", "MEMORY", "STATUS"]
    assert any(line.startswith("cpu:0") and " host " in line for line in lines)
    for name in ("cuda", "opencl", "ascend", "kunlun", "hygon"):
        assert any(line.startswith(name + ":") for line in lines), name


def test_devices_honours_selection():
    r = run("devices", env={"ANYCHIP_DEVICES": "cpu:0"})
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines()[2:]
            if line and not line.startswith(("ANYCHIP_DEVICES", "Paddle device types:"))]
    assert [row.split()[0] for row in rows] == ["cpu:0"]
    assert "default" in rows[0]


@pytest.mark.slow
def test_devices_bad_selection_exits_non_zero():
    r = run("devices", env={"ANYCHIP_DEVICES": "cpu:banana"})
    assert r.returncode == 1
    # the first line is the whole message; one more line says where the grammar is
    assert r.stderr.splitlines() == [
        "anychip: error: bad ANYCHIP_DEVICES='cpu:banana': term 'cpu:banana': device 'banana' is not an index "
        "(ASCII digits) or *",
        "anychip: `anychip devices --help` shows the ANYCHIP_DEVICES grammar, `anychip devices --all` every backend",
    ]
    r = run("devices", env={"ANYCHIP_DEVICES": "TPU:0"})
    import anychip
    known = ", ".join(b.name for b in anychip.backends())
    assert r.stderr.splitlines()[0] == ("anychip: error: bad ANYCHIP_DEVICES='TPU:0': term 'TPU:0': unknown backend "
                                        f"'TPU' (known: {known})")
    # -v adds the grammar and every backend with its state
    r = run("-v", "devices", env={"ANYCHIP_DEVICES": "cpu:banana"})
    assert "term = [!]backend:devices" in r.stderr and "known backends:" in r.stderr and "cpu: 1 device" in r.stderr
    assert "Traceback" not in r.stderr


def test_devices_help_shows_the_grammar():
    r = run("devices", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "term = [!]backend:devices" in text
    assert "device types (gpu, ...) and sub-devices (0.1) of oneAPI's selector are not supported" in text


@pytest.mark.slow
def test_devices_json():
    r = run("devices", "--json", env={"ANYCHIP_DEVICES": "cpu:*"})
    rows = json.loads(r.stdout)
    assert [(x["device"], x["kind"], x["status"]) for x in rows] == [("cpu:0", "host", "default")]
    assert rows[0]["memory"] > 0


@pytest.mark.slow
def test_info_lists_variables():
    r = run("info", env={"ANYCHIP_ALLOC_CONF": "backend:native", "ANYCHIP_TYPO": "1"})
    assert r.returncode == 0, r.stderr
    assert "ANYCHIP_DEVICES (unset" in r.stdout
    assert "ANYCHIP_ALLOC_CONF = 'backend:native'" in r.stdout
    assert "ANYCHIP_TYPO = '1'   <- not a variable anychip knows" in r.stdout
    info = json.loads(run("info", "--json").stdout)
    assert {b["name"] for b in info["backends"]} >= {"cpu", "cuda", "opencl", "ascend", "kunlun", "hygon"}


@pytest.mark.parametrize("argv", [[], ["--version"]])
@pytest.mark.slow
def test_help_and_version(argv):
    r = run(*argv)
    assert (r.returncode, bool(r.stdout)) in ((2, True), (0, True))


BAD_ENV = [
    ("ANYCHIP_SIM_MEMORY", "nan", "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB (e.g. 16GiB)"),
    ("ANYCHIP_SIM_MEMORY", "NaN G", "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB "
                                    "(e.g. 16GiB)"),
    ("ANYCHIP_SIM_MEMORY", "-nan", "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB "
                                   "(e.g. 16GiB)"),
    ("ANYCHIP_SIM_MEMORY", "100T", "want from 1MiB to 1TiB of memory per device"),
    ("ANYCHIP_SIM_MEMORY", "1e9", "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB "
                                  "(e.g. 16GiB)"),
    ("ANYCHIP_SIM_SPIN_US", "fast", "want a whole number of microseconds from 0 to 1000000"),
    ("ANYCHIP_SIM_DEVICES", "65", "want a whole number of devices from 0 to 64"),
    ("ANYCHIP_SIMULATE", "sometimes", "want auto, always or never"),
    ("ANYCHIP_LOG_LEVEL", "loud", "want one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("ANYCHIP_DEVICES", "cpu:gpu", "bad ANYCHIP_DEVICES='cpu:gpu': term 'cpu:gpu': device type 'gpu' is not "
                                   "supported by anychip; select devices by index (N, N,M or *)"),
    ("ANYCHIP_ALLOC_CONF", "max_split_size_mb:abc", "ANYCHIP_ALLOC_CONF: bad item 'max_split_size_mb:abc'"),
]


@pytest.mark.parametrize(("name", "value", "why"), BAD_ENV, ids=[f"{n}={v}" for n, v, _ in BAD_ENV])
@pytest.mark.slow
def test_info_flags_invalid_variables(name, value, why):
    r = run("info", env={name: value})
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("anychip: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"anychip: error: {name}={value!r} is invalid: {why}")
    assert f"      <- INVALID: {why}" in r.stdout
    info = json.loads(run("info", "--json", env={name: value}).stdout)
    assert list(info["invalid_variables"]) == [name]
    assert info["invalid_variables"][name].startswith(why)


@pytest.mark.slow
def test_info_exit_zero_when_every_variable_is_valid():
    env = {"ANYCHIP_SIM_MEMORY": "1.5G", "ANYCHIP_SIM_SPIN_US": " 30 ", "ANYCHIP_LOG_LEVEL": "debug",
           "ANYCHIP_DEVICES": "KUNLUN:*,0;cpu", "ANYCHIP_ALLOC_CONF": "max_split_size_mb:64", "ANYCHIP_SIMULATE": ""}
    r = run("info", env=env)
    assert r.returncode == 0, r.stderr
    assert "INVALID" not in r.stdout
    assert json.loads(run("info", "--json", env=env).stdout)["invalid_variables"] == {}


def test_log_level_garbage_is_warned_about():
    r = run("devices", env={"ANYCHIP_LOG_LEVEL": "loud", "ANYCHIP_DEVICES": "cpu:0"})
    assert r.returncode == 0
    assert r.stderr.splitlines() == ["anychip: warning: ignoring ANYCHIP_LOG_LEVEL='loud': want one of DEBUG, INFO, "
                                     "WARNING, ERROR, CRITICAL; using WARNING"]


@pytest.mark.parametrize(("value", "expected"), [
    ("16GiB", 16 << 30), ("512 MiB", 512 << 20), (" 1m ", 1 << 20), ("1.5G", 1.5 * 2**30), (".5g", 2**29),
    ("1048576", 1 << 20), ("1048576B", 1 << 20), ("2kib", 2048), ("3Ki", 3072), ("1T", 1 << 40), ("1.", 1.0),
    ("nan", None), ("inf", None), ("-1G", None), ("+1G", None), ("1e9", None), ("0x100000", None), ("1 GG", None),
    ("1GiBB", None), ("١G", None), ("", None),
])
def test_sim_memory_grammar(value, expected):
    from anychip.runtime.env import parse_sim_memory
    assert parse_sim_memory(value) == expected


@pytest.mark.parametrize(("argv", "error"), [
    (["info", "--cflags", ""], "--cflags: no C API for backend ''; want one of ascend, kunlun, hygon"),
    (["launch", "-n", "100000", "prog.py"], "launch: -n must be from 1 to 64 (the collective engine's limit), got "
                                            "100000"),
    (["launch", "-n", "0", "prog.py"], "launch: -n must be from 1 to 64 (the collective engine's limit), got 0"),
    (["conformance", "--timeout", "nan"], "--timeout must be a finite number >= 0, got nan"),
    (["conformance", "--deadline", "nan"], "--deadline must be a finite number >= 0, got nan"),
    (["conformance", "--timeout", "inf"], "--timeout must be a finite number >= 0, got inf"),
    (["conformance", "--timeout", "0"], "--timeout must be a number of seconds > 0 (ANYCHIP_COLLECTIVE_TIMEOUT), "
                                        "got 0"),
    (["conformance", "--plot", "/proc/x.png"], "conformance: --plot /proc/x.png cannot be written: No such file or "
                                               "directory"),
    (["conformance", "--json", "/proc/self/x.json"], "conformance: --json /proc/self/x.json cannot be written: "
                                                     "No such file or directory"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, error, capsys):
    """Before: --cflags '' printed the plain info (exit 0), -n 100000 started ranks for minutes,
    --timeout nan made every rank die with a traceback, and an output under /proc passed the
    up-front check (os.access is true for root) and failed after the whole run."""
    from anychip import cli
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == f"anychip: error: {error}\n"


@pytest.mark.slow
def test_an_output_that_fails_when_written_is_an_error_not_a_traceback(tmp_path):
    r = run("conformance", "--device", "cpu", "-n", "1", "-c", "all_reduce", "-b", "8", "-e", "8", "-d", "float32",
            "-o", "sum", "--no-faults", "--iters", "1", "--warmup", "0", "--json", "/dev/full")
    assert r.returncode == 1
    assert "conformance: PASS" in r.stdout
    assert r.stderr == ("anychip: error: conformance: writing --json /dev/full failed: No space left on device "
                        "(the results above are complete)\n")
