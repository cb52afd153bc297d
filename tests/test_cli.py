"""The anychip command, run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "anychip.cli", *args], capture_output=True, text=True, env=e,
                          timeout=120)


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
    rows = [line for line in r.stdout.splitlines()[2:] if line and not line.startswith("ANYCHIP_DEVICES")]
    assert [row.split()[0] for row in rows] == ["cpu:0"]
    assert "default" in rows[0]


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


def test_devices_json():
    r = run("devices", "--json", env={"ANYCHIP_DEVICES": "cpu:*"})
    rows = json.loads(r.stdout)
    assert [(x["device"], x["kind"], x["status"]) for x in rows] == [("cpu:0", "host", "default")]
    assert rows[0]["memory"] > 0


def test_info_lists_variables():
    r = run("info", env={"ANYCHIP_ALLOC_CONF": "backend:native", "ANYCHIP_TYPO": "1"})
    assert r.returncode == 0, r.stderr
    assert "ANYCHIP_DEVICES (unset" in r.stdout
    assert "ANYCHIP_ALLOC_CONF = 'backend:native'" in r.stdout
    assert "ANYCHIP_TYPO = '1'   <- not a variable anychip knows" in r.stdout
    info = json.loads(run("info", "--json").stdout)
    assert {b["name"] for b in info["backends"]} >= {"cpu", "cuda", "opencl", "ascend", "kunlun", "hygon"}


@pytest.mark.parametrize("argv", [[], ["--version"]])
def test_help_and_version(argv):
    r = run(*argv)
    assert (r.returncode, bool(r.stdout)) in ((2, True), (0, True))
