"""Collectives take Tensors where they take Buffers (dtype and count from the tensor)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import collectives
from anychip.collectives import World


def solo(device: str):
    return collectives.init(device, world=World(0, 1, 0, 1, f"solo-{os.getpid()}-{time.monotonic_ns()}", "none"))


@pytest.mark.parametrize("device", ["cpu:0", "ascend:0"])
def test_one_rank_ops_on_tensors(device: str) -> None:
    c = solo(device)
    try:
        t = anychip.tensor(np.arange(6, dtype=np.int64).reshape(2, 3), device=device)
        c.all_reduce(t, op="max").wait()                       # int64 from the tensor, not float32
        np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
        out = anychip.zeros(3, dtype="int64", device=device)
        c.all_gather(t[1], out).wait()                          # a contiguous row view
        np.testing.assert_array_equal(out.numpy(), [3, 4, 5])
        with pytest.raises(anychip.InvalidArgumentError, match="collectives need a contiguous tensor"):
            c.all_reduce(t.T)
        with pytest.raises(anychip.InvalidArgumentError,
                           match="all_reduce: dtype='int32' but the tensor holds int64"):
            c.all_reduce(t, dtype="int32")
        with pytest.raises(anychip.InvalidArgumentError, match="send and recv tensors have different dtypes"):
            c.all_reduce(t, anychip.zeros((2, 3), dtype="float64", device=device))
    finally:
        c.destroy()


@pytest.mark.slow
def test_four_ranks_all_reduce_and_all_gather_tensors(tmp_path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, anychip
        from anychip import collectives
        comm = collectives.init()
        r = comm.rank
        x = anychip.tensor(np.full((2, 2), r + 1, np.float32), device=comm.device)
        comm.all_reduce(x).wait()
        g = anychip.empty(comm.size * 2, dtype="bfloat16", device=comm.device)
        comm.all_gather(anychip.full((2,), r, dtype="bfloat16", device=comm.device), g).wait()
        print(r, x.sum().item(), g.cast("int32").numpy().tolist())
    """))
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", "4", "--device", "ascend", str(script)],
                       capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"[{r}] {r} 40.0 [0, 0, 1, 1, 2, 2, 3, 3]" for r in range(4)]
