"""The hierarchical transport across two "hosts" on one machine: benchmarks/twohost.py's test
bed (two network namespaces joined by a veth pair, MPICH's launcher reaching the second host
through a launcher that runs in its namespace). Skipped, saying why, where namespaces cannot
be made (not root, no iproute2, a container without the capability)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("twohost", HERE.parent.parent / "benchmarks" / "twohost.py")
assert spec is not None and spec.loader is not None
twohost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(twohost)


def _bed() -> tuple[str, dict]:
    """mpiexec and a clean environment for a job on the test bed; skips where it cannot run."""
    ok, why = twohost.available()
    if not ok:
        pytest.skip(f"two-host test bed unavailable: {why}")
    mpiexec = twohost.mpiexec_path()
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install mpich)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "MPI_", "ANYCHIP_RANK", "ANYCHIP_WORLD", "ANYCHIP_LOCAL", "ANYCHIP_JOB",
                                "ANYCHIP_HOST"))}
    return mpiexec, env


def _nothing_left(ns: tuple[str, str], shm_before: set[str]) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in ns), listed
    assert not any((Path("/etc/netns") / n).exists() for n in ns)
    # what appeared in /dev/shm meanwhile and no live process uses (another job's may be running)
    assert sorted(set(os.listdir("/dev/shm")) - shm_before - twohost._in_use_shm()) == []


@pytest.mark.slow
def test_hierarchical_all_reduce_of_two_by_two_ranks_across_namespaces() -> None:
    mpiexec, env = _bed()
    with twohost.TwoHosts(rate="10gbit") as bed:
        ns = bed.ns
        before = bed.link_bytes()
        res = bed.run(mpiexec, 2, [sys.executable, str(HERE / "twohost_worker.py")], timeout=CHILD_SECONDS, env=env)
        after = bed.link_bytes()
    assert res.returncode == 0, res.stdout + res.stderr
    # n(n+1)/2 * 10 for the world's factor 1 + 2 + 3 + 4 = 10
    # (Hydra forwards each rank's output in chunks of its own: records can arrive joined)
    lines = sorted(re.findall(r"RANK \d HOST \w+ VIA \S+ SUMS (?:\d+|WRONG),(?:\d+|WRONG)", res.stdout))
    assert lines == [f"RANK {r} HOST {'hosta' if r < 2 else 'hostb'} VIA host/shm+mpi SUMS 50500,12500250000"
                     for r in range(4)], res.stdout + res.stderr
    # the large all_reduce crossed the link: each host sent at least its half of 200 kB
    assert min(a - b for a, b in zip(after, before, strict=True)) >= 100_000, (before, after)
    # nothing is left behind: the namespaces and their /etc/netns entries are gone
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in ns), listed
    assert not any((Path("/etc/netns") / n).exists() for n in ns)


@pytest.mark.slow
def test_the_link_going_down_mid_collective_is_a_timeout_on_every_rank_of_the_host() -> None:
    """hosta's ranks, cut off from hostb in the middle of their all_reduces, each raise
    CollectiveTimeout within ANYCHIP_COLLECTIVE_TIMEOUT; the job ends, nothing is left."""
    mpiexec, env = _bed()
    env["ANYCHIP_COLLECTIVE_TIMEOUT"] = "5"
    shm = set(os.listdir("/dev/shm"))
    with twohost.TwoHosts(rate="10gbit") as bed:
        res = bed.run(mpiexec, 2, [sys.executable, str(HERE / "twohost_worker.py"), "loop", "90"],
                      timeout=CHILD_SECONDS, env=env, link_down_after=8)
        ns = bed.ns
    assert res.returncode != 0, res.stdout + res.stderr
    errors = sorted(re.findall(r"RANK (\d) HOST hosta AFTER (\d+) ERROR (\w+):", res.stdout))
    assert [(r, cls) for r, _, cls in errors] == [("0", "CollectiveTimeout"), ("1", "CollectiveTimeout")], res.stdout
    assert all(int(n) > 0 for _, n, _ in errors), errors            # the fault came mid-loop, not in init
    assert bed.link_down_s is not None and bed.link_down_s < 5 + 10, bed.link_down_s
    _nothing_left(ns, shm)


@pytest.mark.slow
def test_a_hosts_ranks_killed_end_the_job_naming_the_host() -> None:
    """hostb's ranks SIGKILLed mid-collective: MPICH's launcher ends the whole job at once and
    names the host; nothing is left on either host nor in /dev/shm."""
    mpiexec, env = _bed()
    shm = set(os.listdir("/dev/shm"))
    with twohost.TwoHosts(rate="10gbit") as bed:
        res = bed.run(mpiexec, 2, [sys.executable, str(HERE / "twohost_worker.py"), "loop", "90"],
                      timeout=CHILD_SECONDS, env=env, kill_host_after=8)
        ns = bed.ns
    assert res.returncode != 0, res.stdout + res.stderr
    assert "BAD TERMINATION" in res.stdout + res.stderr and "RUNNING AT hostb" in res.stdout + res.stderr, res.stderr
    assert "NO FAULT" not in res.stdout
    assert bed.link_down_s is not None and bed.link_down_s < 10, bed.link_down_s
    _nothing_left(ns, shm)
