"""Backend discovery: entry points, run-time registration, broken plugins, duplicates."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import anychip
from anychip.devices.cpu import CPUPlugin

FAKE_PLUGIN = textwrap.dedent('''
    from anychip.devices.cpu import CPUPlugin

    class FakeChip(CPUPlugin):
        name = "fakechip"
        accelerator = True
        priority = 5

        def device_count(self):
            return 2

    class Broken(CPUPlugin):
        name = "brokenchip"

        def available(self):
            raise RuntimeError("driver exploded")

    class Duplicate(CPUPlugin):
        name = "cpu"
''')


@pytest.fixture
def plugin_dist(tmp_path):
    """A tiny installed distribution declaring three anychip.plugins entry points."""
    (tmp_path / "fakechip_pkg.py").write_text(FAKE_PLUGIN)
    dist = tmp_path / "fakechip-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakechip\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[anychip.plugins]\nfakechip = fakechip_pkg:FakeChip\nbrokenchip = fakechip_pkg:Broken\n"
        "cpu = fakechip_pkg:Duplicate\nmissing = fakechip_pkg_nope:Nothing\n")
    return tmp_path


def run_py(code, path, env=None):
    e = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    e["PYTHONPATH"] = os.pathsep.join([str(path), e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, env=e,
                          timeout=120)


def test_entry_point_plugins(plugin_dist):
    code = textwrap.dedent('''
        import anychip
        for b in anychip.backends():
            print("B", b.name, b.available, b.device_count, "|", b.reason, "|", b.source)
        print("D", [d.name for d in anychip.devices()])
        d = anychip.device("fakechip:1")
        print("R", d.alloc(4).copy_from(b"abcd").to_numpy().tobytes())
    ''')
    r = run_py(code, plugin_dist)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("B ")}
    assert rows["fakechip"].startswith("B fakechip True 2 |")
    assert "entry point fakechip_pkg:FakeChip (package fakechip)" in rows["fakechip"]
    assert rows["brokenchip"].startswith("B brokenchip False 0 | availability check failed: RuntimeError: "
                                         "driver exploded")
    assert "failed to load from entry point fakechip_pkg_nope:Nothing" in rows["missing"]
    assert "ModuleNotFoundError" in rows["missing"]
    # the duplicate 'cpu' is refused with a warning naming both sources; the built-in stays
    assert "built-in (anychip.devices.cpu)" in rows["cpu"]
    assert ("backend 'cpu' from entry point fakechip_pkg:Duplicate (package fakechip) refused: "
            "the name is already taken by built-in (anychip.devices.cpu)") in r.stderr
    # a (non-simulated) accelerator comes before the host in the default order
    devs = eval(next(line for line in r.stdout.splitlines() if line.startswith("D "))[2:])
    assert devs.index("fakechip:0") < devs.index("cpu:0") and "fakechip:1" in devs
    assert "R b'abcd'" in r.stdout


def test_entry_point_selected_by_env(plugin_dist):
    r = run_py("import anychip; print([d.name for d in anychip.devices()])", plugin_dist,
               {"ANYCHIP_DEVICES": "fakechip:1;cpu:0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['fakechip:1', 'cpu:0']"


class RuntimeChip(CPUPlugin):
    name = "runtimechip"


def test_register_plugin_at_run_time(clean_env):
    info = anychip.register_plugin(RuntimeChip)
    try:
        assert info.name == "runtimechip"
        dev = anychip.device("runtimechip:0")
        assert dev.alloc(8).copy_from(np.arange(2, dtype=np.int32)).to_numpy(np.int32).tolist() == [0, 1]
        with pytest.warns(RuntimeWarning, match="backend 'runtimechip' from .* refused: the name is already taken"):
            again = anychip.register_plugin(RuntimeChip)
        assert again is info
    finally:
        anychip.unregister_plugin("runtimechip")
    assert all(b.name != "runtimechip" for b in anychip.backends())


def test_register_plugin_needs_a_name():
    class Nameless(CPUPlugin):
        name = ""
    with pytest.raises(anychip.PluginError, match="has no backend name"):
        anychip.register_plugin(Nameless)


def test_unknown_device_names(clean_env):
    with pytest.raises(anychip.SelectionError, match="unknown backend 'tpu'"):
        anychip.device("tpu:0")
    with pytest.raises(anychip.SelectionError, match="bad device name 'cpu:x'"):
        anychip.device("cpu:x")
    with pytest.raises(anychip.SelectionError, match="does not exist: cpu has 1 device"):
        anychip.device("cpu:3")
    clean_env.setenv("ANYCHIP_DEVICES", "cpu:0")
    assert [d.name for d in anychip.devices()] == ["cpu:0"]


def test_import_never_breaks_on_a_broken_backend(plugin_dist):
    r = run_py("import anychip; print('ok', anychip.device('cpu:0'))", plugin_dist)
    assert r.returncode == 0 and r.stdout.startswith("ok cpu:0"), r.stderr
