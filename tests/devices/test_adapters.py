"""The built-in chips' adapters (csrc/adapters) build as csrc/adapters/README.md says a vendor's
SDK user builds them: from the shipped sources (``anychip._data.sources_dir()``), with nothing
but the vendor API's headers and libraries, here the simulator's (``anychip info --cflags``)
standing in for the SDK; and the library loads as a C plugin with the adapter's whole table."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip._data import sources_dir
from anychip.chips import cplugin

ANYCHIP = [sys.executable, "-m", "anychip.cli"]
#: chip -> (adapter folder, the plugin_version it reports, the collectives its library runs)
ADAPTERS = {
    "ascend": ("acl", "ACL + HCCL adapter 1.0"),
    "kunlun": ("xpu", "XPU + BKCL adapter 1.0"),
    "hygon": ("hip", "HIP + RCCL adapter 1.0"),
}
NATIVE = "native (all_gather, all_reduce, all_to_all, broadcast, recv, reduce, reduce_scatter, send)"


@pytest.mark.parametrize("chip", sorted(ADAPTERS))
@pytest.mark.slow
def test_adapter_builds_from_the_shipped_sources_against_the_vendor_api(chip: str, tmp_path: Path) -> None:
    api, version = ADAPTERS[chip]
    src = sources_dir() / "adapters" / api / f"plugin_{api}.c"
    cflags = subprocess.run([*ANYCHIP, "info", "--cflags", chip], capture_output=True, text=True, check=True).stdout
    lib = tmp_path / f"libanychip_{chip}.so"
    cc = subprocess.run(["cc", "-O1", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Wextra", "-Werror", str(src),
                         *shlex.split(cflags), "-o", str(lib)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([*ANYCHIP, "plugin", "check", str(lib)], capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(":", 1) for line in r.stdout.splitlines() if ":" in line and not line.startswith(" "))
    assert lines["backend"].strip() == f"{chip} (real)"          # built without the simulator's extensions
    assert lines["ABI"].strip() == f"1.3, {version}"
    # the vendor's library has no timeout per communicator: built for it, the adapter leaves the
    # entry unset (anychip's watchdog applies a group's timeout); the simulator's build sets it
    _, ffi, _, table, _ = cplugin.open_table(str(lib))
    assert table.comm_init_rank_timeout == ffi.NULL
    assert anychip.device(f"{chip}:0").plugin.t.comm_init_rank_timeout != ffi.NULL
    assert lines["collectives"].strip().startswith(NATIVE)
    assert "device(s)" in lines["status"] and lines["status"].strip().startswith("available")
