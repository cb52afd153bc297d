"""Backend discovery: entry points, run-time registration, broken plugins, duplicates."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip.chips.cpu import CPUPlugin

FAKE_PLUGIN = textwrap.dedent('''
    from anychip.chips.cpu import CPUPlugin

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
                          timeout=CHILD_SECONDS)


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
    assert "built-in (anychip.chips.cpu)" in rows["cpu"]
    assert ("backend 'cpu' from entry point fakechip_pkg:Duplicate (package fakechip) refused: "
            "the name is already taken by built-in (anychip.chips.cpu)") in r.stderr
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


@pytest.mark.slow
def test_import_never_breaks_on_a_broken_backend(plugin_dist):
    r = run_py("import anychip; print('ok', anychip.device('cpu:0'))", plugin_dist)
    assert r.returncode == 0 and r.stdout.startswith("ok cpu:0"), r.stderr


# -- the plugin contract (checked when a backend loads) ----------------------

class _Partial(anychip.DevicePlugin):
    """Identity only: everything else of the contract is missing."""
    api_version = (1, 0)

    def available(self):
        return True, "ok"

    def device_count(self):
        return 1


def _contract_case(cls, name):
    cls = type(cls.__name__, (cls,), {"name": name})
    anychip.register_plugin(cls)
    try:
        loaded = anychip.runtime.registry.backend(name)
        return loaded.available, loaded.reason
    finally:
        anychip.unregister_plugin(name)


def test_plugin_missing_required_methods_is_unavailable(clean_env):
    available, reason = _contract_case(_Partial, "partialchip")
    assert not available
    assert reason == (
        "refused (register_plugin(_Partial)): _Partial does not implement the required methods properties, "
        "_malloc, _free, _mem_info, _copy, _memset, _default_stream, _stream_create, _stream_destroy, "
        "_stream_synchronize, _stream_query, _stream_wait_event, _event_create, _event_destroy, _event_record, "
        "_event_synchronize, _event_query, _event_elapsed_ms, _synchronize (plugin API 1.0)")


class _NoMalloc(CPUPlugin):
    _malloc = anychip.DevicePlugin._malloc


def test_plugin_without_malloc_is_unavailable_and_not_selectable(clean_env):
    cls = type("NoMalloc", (_NoMalloc,), {"name": "nomalloc"})
    anychip.register_plugin(cls)
    try:
        info = anychip.runtime.registry.backend("nomalloc")
        assert not info.available and info.device_count == 0
        assert info.reason.endswith("NoMalloc does not implement the required method _malloc (plugin API 1.0)")
        assert "nomalloc" not in {d.backend for d in anychip.devices()}
        with pytest.raises(anychip.SelectionError,
                           match="backend 'nomalloc' is unavailable: .*required method _malloc"):
            anychip.device("nomalloc:0")
    finally:
        anychip.unregister_plugin("nomalloc")


@pytest.mark.parametrize(("version", "expected"), [
    (None, "declares no api_version; set the class attribute api_version = (1, 0) "
           "(this anychip implements plugin API 1.0)"),
    ((2, 0), "is written for plugin API 2.0; this anychip implements 1.0 and loads only plugins of major version 1"),
    ((0, 9), "is written for plugin API 0.9; this anychip implements 1.0 and loads only plugins of major version 1"),
    ("1.0", "api_version must be a (major, minor) tuple of non-negative ints, got '1.0'"),
    ((1, -1), "api_version must be a (major, minor) tuple of non-negative ints, got (1, -1)"),
    ((1,), "api_version must be a (major, minor) tuple of non-negative ints, got (1,)"),
])
def test_plugin_api_version_checked(clean_env, version, expected):
    cls = type("Versioned", (CPUPlugin,), {"name": "versioned", "api_version": version})
    available, reason = _contract_case(cls, "versioned")
    assert not available
    assert reason == f"refused (register_plugin(Versioned)): Versioned {expected}"


def test_plugin_newer_minor_version_loads(clean_env):
    cls = type("Newer", (CPUPlugin,), {"name": "newerminor", "api_version": (1, 7)})
    available, reason = _contract_case(cls, "newerminor")
    assert available and reason == "host memory"


def test_builtin_backends_meet_the_contract():
    from anychip.runtime.plugin import contract_problem
    for b in anychip.backends():
        if b.plugin is not None:
            assert contract_problem(b.plugin) is None, b.name
    assert {b.name for b in anychip.backends() if b.plugin is not None} >= {"cpu", "ascend", "kunlun", "hygon"}
