"""Stress: several threads allocating, copying (h2d, d2d, d2h) and synchronizing on
streams they share, on every backend; every byte is checked, and after
``synchronize()`` + ``empty_cache()`` the allocator's statistics are back to zero.

Short by default (about half a second of work per backend);
``ANYCHIP_STRESS_SECONDS=60 pytest tests/runtime/test_stress.py`` runs longer. Each
backend runs in a subprocess, so a crash is reported as a failure of its test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import CHILD_SECONDS

import anychip

SECONDS = float(os.environ.get("ANYCHIP_STRESS_SECONDS", "0.5"))
BACKENDS = [b for b in ("cpu", "opencl", "ascend", "kunlun", "hygon")
            if any(d.backend == b for d in anychip.devices())]

SCENARIO = textwrap.dedent('''
    import json, sys, threading, time
    import numpy as np
    import anychip

    name, seconds, nthreads = sys.argv[1], float(sys.argv[2]), 4
    dev = anychip.device(name)
    streams = [anychip.Stream(dev) for _ in range(2)]
    errors, counts = [], [0] * nthreads
    SIZES = (1, 100, 512, 4096, 70_000, 1 << 20, 3 << 20)

    def worker(tid):
        rng = np.random.default_rng(tid)
        deadline = time.monotonic() + seconds
        i = 0
        try:
            while i < 30 or time.monotonic() < deadline:
                s = streams[(tid + i) % 2]               # shared with the other threads
                n = int(SIZES[rng.integers(len(SIZES))])
                data = rng.integers(0, 256, n, dtype=np.uint8)
                a = dev.alloc(n, stream=s).copy_from(data, stream=s)
                b = dev.alloc(n, stream=s)
                anychip.copy(b, a, stream=s)
                out = np.empty(n, np.uint8)
                b.copy_to(out, stream=s)
                if i % 3 == 0:
                    s.synchronize()
                elif i % 3 == 1:
                    s.record_event().synchronize()
                else:
                    dev.synchronize()
                if not np.array_equal(out, data):
                    errors.append(f"thread {tid} op {i}: {int((out != data).sum())} of {n} bytes wrong")
                a.free()
                del b                                    # freed by the last reference
                if i % 7 == 0:
                    dev.memory_stats()
                i += 1
        except BaseException as exc:
            errors.append(f"thread {tid} op {i}: {type(exc).__name__}: {exc}")
        counts[tid] = i

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dev.synchronize()
    dev.empty_cache()
    st = dev.memory_stats()
    print(json.dumps({"errors": errors, "ops": counts,
                      "allocated": st["allocated_bytes.all.current"], "active": st["active_bytes.all.current"],
                      "reserved": st["reserved_bytes.all.current"], "segments": st["segment.all.current"]}))
''')

# The two allocator defects on their own, on a fresh device: blocks of one segment
# freed on two streams, then synchronize() + empty_cache().
CROSS_STREAM = textwrap.dedent('''
    import json, sys
    import anychip
    dev = anychip.device(sys.argv[1])
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    x = [dev.alloc(4096, stream=s1) for _ in range(2)]
    x.pop().free()
    y = [dev.alloc(4096, stream=s2) for _ in range(2)]
    del x, y
    dev.synchronize()
    dev.empty_cache()
    st = dev.memory_stats()
    print(json.dumps({"reserved": st["reserved_bytes.all.current"], "segments": st["segment.all.current"]}))
''')

_results: dict[str, dict] = {}


def _run(code: str, backend: str, *args: str) -> dict:
    name = anychip.devices(backend)[0].name
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    r = subprocess.run([sys.executable, "-c", code, name, *args], capture_output=True, text=True,
                       env=env, timeout=CHILD_SECONDS + 4 * SECONDS)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.splitlines()[-1])


def stress(backend: str) -> dict:
    if backend not in _results:
        _results[backend] = _run(SCENARIO, backend, str(SECONDS))
    return _results[backend]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_stress_data_and_statistics(backend):
    res = stress(backend)
    assert res["errors"] == []
    assert min(res["ops"]) >= 30
    assert (res["allocated"], res["active"]) == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_stress_reserved_back_to_zero(backend):
    assert _run(CROSS_STREAM, backend) == {"reserved": 0, "segments": 0}
    res = stress(backend)
    assert (res["reserved"], res["segments"]) == (0, 0)
