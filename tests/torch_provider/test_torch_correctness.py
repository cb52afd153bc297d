"""Results the anychip device must never get silently wrong (docs/torch.md): reads ordered after
the work they read while the current device changes, views that alias, tied parameters that stay
tied, and the devices of mixed CPU / device arguments, each against the CPU in the same process.

This process binds PrivateUse1 to the simulated Ascend; the other chips run in child processes."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import LONG_CHILD_SECONDS, LONG_TEST_SECONDS  # noqa: E402

from anychip._spawn import python_command  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def at():
    os.environ.pop("ANYCHIP_TORCH", None)
    os.environ.pop("ANYCHIP_LAUNCH_DEVICE", None)
    import anychip.torch as module
    return module


# ---- the current device: reads ordered after the work they read ------------------------------

@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.parametrize("chip", ["ascend", "kunlun", "hygon"])
def test_pending_results_read_right_while_the_current_device_changes(chip):
    # tests/torch_provider/device_switch.py: the first uses of anychip:1 and anychip:2 while
    # anychip:0's kernel is pending, then 150 rounds over 4 devices and 3 streams each, with
    # anychip's runtime using another device between the kernel and the read. Before the fix
    # (the library's current device remembered by each of its callers), about 1 round in 10
    # read stale values on each chip, and on the Ascend 1 in 3 failed on a stream of another
    # device; the first uses read [0, 0, 0, 0]
    env = {**os.environ, "ANYCHIP_TORCH": chip}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run(python_command([str(HERE / "device_switch.py"), "150"]), capture_output=True, text=True,
                          env=env, timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:3] == ["FIRST anychip:1 [2.0, 2.0, 2.0, 2.0]", "FIRST anychip:2 [3.0, 3.0, 3.0, 3.0]",
                         "ROUNDS 150 STALE 0 ERRORS 0"], done.stdout
