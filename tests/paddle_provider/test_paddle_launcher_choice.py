"""Paddle's launcher takes the first custom device type it finds. With a C plugin's bridge
(`anychip plugin paddle`) beside the simulated chips' one and ANYCHIP_PADDLE unset, the job runs on
the plugin's chip, never silently on the simulated Ascend; ANYCHIP_PADDLE still picks a simulated chip."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS, paddle_dir

from anychip import paddle_provider
from anychip.conformance.framework import run_paddle_launch

if paddle_dir() is None:
    pytest.skip("paddlepaddle is not installed (pip install 'anychip[paddle]')", allow_module_level=True)

BRIDGE = paddle_provider.simulator_bridge()
ANYCHIP = [sys.executable, "-m", "anychip.cli"]
pytestmark = pytest.mark.skipif(BRIDGE is None, reason="anychip was built without the Paddle bridge")

PROG = """
import paddle, paddle.distributed as dist
dist.init_parallel_env()
print("RANK", dist.get_rank(), "ON", paddle.device.get_device(), flush=True)
"""


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANYCHIP_", "PADDLE_", "FLAGS_"))}
    env.update(CUSTOM_DEVICE_ROOT=str(root), GLOG_minloglevel="2", **extra)
    return env


@pytest.fixture(scope="module")
def paddle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Paddle's directory as after `pip install anychip` + `anychip plugin paddle`: the simulated
    chips' bridge and the bridge of a C plugin (the scaffold, built with make)."""
    top = tmp_path_factory.mktemp("choice")
    subprocess.run([*ANYCHIP, "plugin", "new", "vchip", "--dir", str(top)], check=True, capture_output=True)
    subprocess.run(["make", "-s", "-C", str(top / "vchip")], check=True, capture_output=True)
    root = top / "paddle"
    root.mkdir()
    assert BRIDGE is not None
    (root / BRIDGE.name).symlink_to(BRIDGE)
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", str(top / "vchip" / "libvchip.so"), "--dest", str(root)],
                       capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    return root


@pytest.mark.slow
def test_the_launcher_runs_on_the_plugins_chip(paddle_dir: Path, tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "log"), "--devices", "0,1",
           str(prog)]
    r = run_paddle_launch(cmd, CHILD_SECONDS, cwd=tmp_path, env=_env(paddle_dir))
    logs = [(tmp_path / "log" / f"workerlog.{i}").read_text(errors="replace") for i in range(2)]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + "".join(logs)
    for rank, log in enumerate(logs):
        assert f"RANK {rank} ON anychip_vchip:{rank}" in log
        assert ("[anychip paddle] ANYCHIP_PADDLE is unset and the C plugin bridge libanychip_vchip.so lies beside "
                "this library: that plugin is Paddle's anychip device and no simulated chip is registered "
                "(ANYCHIP_PADDLE=ascend, kunlun or hygon registers one)") in log


@pytest.mark.slow
def test_anychip_paddle_still_names_a_simulated_chip(paddle_dir: Path) -> None:
    code = "import paddle; print(sorted(paddle.device.get_all_custom_device_type()))"
    for extra, want in (({}, "['anychip_vchip']"), ({"ANYCHIP_PADDLE": "none"}, "['anychip_vchip']"),
                        ({"ANYCHIP_PADDLE": "kunlun"}, "['anychip_kunlun', 'anychip_vchip']")):
        r = subprocess.run([sys.executable, "-c", code], env=_env(paddle_dir, **extra), capture_output=True,
                           text=True, timeout=CHILD_SECONDS)
        assert r.stdout.strip().splitlines()[-1] == want, r.stderr[-2000:]
    st = paddle_provider.status(_env(paddle_dir), kernels=False)
    assert (st["chip"], st["device_type"]) == (None, "anychip_vchip")
    st = paddle_provider.status(_env(paddle_dir, ANYCHIP_PADDLE="hygon"), kernels=False)
    assert (st["chip"], st["device_type"]) == ("hygon", "anychip_hygon")


@pytest.mark.slow
def test_a_bridge_whose_plugin_is_gone_says_so(paddle_dir: Path, tmp_path: Path) -> None:
    """After `pip uninstall` the bridge stays in Paddle's directory: it registers nothing and says why."""
    lib = tmp_path / "libvchip.so"
    shutil.copyfile(paddle_dir.parent / "vchip" / "libvchip.so", lib)
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", str(lib), "--dest", str(tmp_path / "pd")], capture_output=True,
                       text=True, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    lib.unlink()
    code = "import paddle; print(sorted(paddle.device.get_all_custom_device_type()))"
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "pd"), capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stderr[-2000:]
    assert (f"[anychip paddle] the anychip plugin {lib} is gone (its package uninstalled?): remove this bridge, "
            f"{tmp_path / 'pd' / 'libanychip_vchip.so'}, or rebuild it with `anychip plugin paddle NAME`") in r.stderr
