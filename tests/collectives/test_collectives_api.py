"""The collective front end in one process: argument checks, Work states and stream order,
bootstrap variables, and the launcher."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import CHILD_SECONDS, solo

import anychip
from anychip import collectives
from anychip.collectives import World
from anychip.collectives._bootstrap import from_environment

_LAUNCH_VARS = ("ANYCHIP_RANK", "ANYCHIP_WORLD_SIZE", "ANYCHIP_LOCAL_RANK", "ANYCHIP_LOCAL_SIZE", "ANYCHIP_JOB_ID",
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def buf_of(dev, arr):
    return dev.alloc(arr.nbytes).copy_from(arr)


# -- argument checks ---------------------------------------------------------------------

def test_bad_dtype_names_the_op_and_what_fits(comm) -> None:
    b = comm.device.alloc(16)
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_reduce(b, dtype="complex64")
    assert str(e.value) == ("all_reduce: dtype 'complex64' is not supported; use one of int8, uint8, int32, "
                            "int64, float16, bfloat16, float32, float64 (by name or as a NumPy dtype)")


def test_bad_reduce_op(comm) -> None:
    with pytest.raises(anychip.InvalidArgumentError, match=r"^reduce_scatter: reduce op 'mean' is not supported; "
                                                           r"use one of sum, prod, min, max, avg$"):
        comm.reduce_scatter(comm.device.alloc(16), comm.device.alloc(16), op="mean")


def test_root_out_of_range(comm) -> None:
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.broadcast(comm.device.alloc(16), root=1)
    assert str(e.value) == "broadcast: root=1 is out of range; the group has ranks 0..0"
    with pytest.raises(anychip.InvalidArgumentError, match="send: peer=-1 is out of range"):
        comm.send(comm.device.alloc(16), -1)


def test_buffer_too_small_says_what_fits(comm) -> None:
    dev = comm.device
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_reduce(dev.alloc(40), dev.alloc(36), count=10)
    assert str(e.value) == "all_reduce: recv holds 36 bytes but count=10 float32 needs 40 bytes; it fits count <= 9"
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_gather(dev.alloc(8), dev.alloc(8), count=4, dtype="int16")
    assert "dtype 'int16' is not supported" in str(e.value)


def test_count_default_and_not_a_whole_number(comm) -> None:
    dev = comm.device
    b = buf_of(dev, np.arange(5, dtype=np.float64))
    comm.all_reduce(b, dtype=np.float64).wait()
    assert b.to_numpy(np.float64).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_reduce(dev.alloc(10), dtype="float32")
    assert str(e.value) == ("all_reduce: count not given and the 10-byte buffer is not a whole number of 4-byte "
                            "units (1 x 4-byte elements); pass count=")
    with pytest.raises(anychip.InvalidArgumentError, match=r"^all_reduce: count must be >= 0, got -1$"):
        comm.all_reduce(dev.alloc(16), count=-1)


def test_wrong_device_freed_buffer_and_non_buffer(comm) -> None:
    other = anychip.device("ascend:0")
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_reduce(other.alloc(16))
    assert str(e.value) == "all_reduce: send is on ascend:0; this communicator's rank 0 works on cpu:0"
    b = comm.device.alloc(16)
    b.free()
    with pytest.raises(anychip.InvalidArgumentError, match="^all_reduce: send was freed$"):
        comm.all_reduce(b)
    with pytest.raises(anychip.InvalidArgumentError, match="^all_reduce: send must be an anychip.Buffer on cpu:0, "
                                                           "got ndarray$"):
        comm.all_reduce(np.zeros(4, np.float32))


def test_partial_overlap_is_refused_but_in_place_layouts_pass(comm) -> None:
    dev = comm.device
    pad = dev.alloc(100)                   # base does not start its segment: offsets are the buffer's own
    base = dev.alloc(64)
    assert base._offset > 0 and not pad.freed
    with pytest.raises(anychip.InvalidArgumentError) as e:
        comm.all_reduce(base.view(0, 32), base.view(16, 32))
    assert str(e.value) == ("all_reduce: send [0, 32) and recv [16, 48) overlap without being the in-place layout "
                            "(send is recv); use disjoint buffers or the in-place layout")
    comm.all_gather(base.view(0, 16), base.view(0, 16)).wait()             # rank 0: send at recv + 0


def test_stream_of_another_device(comm) -> None:
    s = anychip.Stream(anychip.device("kunlun:0"))
    with pytest.raises(anychip.InvalidArgumentError, match="^barrier: stream is a stream of kunlun:0; "
                                                           "this communicator works on cpu:0$"):
        comm.barrier(stream=s)


def test_destroyed_communicator(comm) -> None:
    comm.destroy()
    with pytest.raises(anychip.InvalidArgumentError, match="was destroyed"):
        comm.barrier()


def test_work_wait_negative_timeout(comm) -> None:
    w = comm.barrier()
    with pytest.raises(anychip.InvalidArgumentError):
        w.wait(-1)
    assert w.wait() is True and w.is_completed() and w.exception() is None


def test_split_and_exchange_on_one_rank(comm) -> None:
    assert comm.exchange({"a": 1}) == [{"a": 1}]
    sub = comm.split(5, key=3)
    assert (sub.rank, sub.size) == (0, 1)
    assert "split1(color=5)" in repr(sub)
    assert comm.split(None) is None
    with pytest.raises(anychip.InvalidArgumentError, match="split: color must be an int >= 0 or None"):
        comm.split(-2)
    sub.destroy()


# -- stream order on a simulated chip ---------------------------------------------------

def test_op_is_enqueued_on_the_simulated_stream_and_completes_with_it() -> None:
    c = solo("ascend:1")
    dev = c.device
    s = anychip.Stream(dev)
    b = buf_of(dev, np.arange(4, dtype=np.int32))
    dev.plugin.sim_hold_stream(dev.index, s._handle)
    try:
        w = c.all_reduce(b, dtype="int32", op="max", stream=s)
        assert not w.is_completed()
        assert w.exception() is None
        with pytest.raises(anychip.CollectiveTimeout, match="^all_reduce did not complete within 0.05 s"):
            w.wait(timeout=0.05)
    finally:
        dev.plugin.sim_release_stream(dev.index, s._handle)
    assert w.wait() is True
    assert b.to_numpy(np.int32).tolist() == [0, 1, 2, 3]
    c.destroy()


def test_group_work_before_the_group_ends(comm) -> None:
    with comm.group():
        w = comm.barrier()
        with pytest.raises(anychip.InvalidArgumentError, match="the group has not ended yet"):
            w.wait()
    assert w.wait()


# -- bootstrap ---------------------------------------------------------------------------

@pytest.fixture
def bare_env(monkeypatch):
    for v in _LAUNCH_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


@pytest.mark.parametrize("variables,expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h",
      "MASTER_PORT": "29500"}, (3, 8, 1, 4, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (2, 4, 0, 2, "openmpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, (1, 2, 1, 2, "mpich")),
    ({"ANYCHIP_RANK": "0", "ANYCHIP_WORLD_SIZE": "2", "ANYCHIP_JOB_ID": "j1"}, (0, 2, 0, 2, "anychip")),
    ({}, (0, 1, 0, 1, "none")),
])
def test_launcher_variables(bare_env, variables, expected) -> None:
    for k, v in variables.items():
        bare_env.setenv(k, v)
    w = from_environment()
    assert (w.rank, w.size, w.local_rank, w.local_size, w.launcher) == expected
    if "ANYCHIP_JOB_ID" in variables:
        assert w.job_id == "j1"
    if "MASTER_PORT" in variables:
        assert w.job_id == f"torchrun-{os.getppid()}-h-29500"


def test_bad_launcher_variable(bare_env) -> None:
    bare_env.setenv("RANK", "x")
    bare_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(anychip.InvalidArgumentError, match=r"^RANK='x' is invalid: want a rank: a whole number "
                       r"from 0 to 2147483646 \(plain digits 0-9\)$"):
        from_environment()
    bare_env.setenv("RANK", "2")
    with pytest.raises(anychip.InvalidArgumentError, match=r"^RANK=2 is not in \[0, WORLD_SIZE=2\)$"):
        from_environment()


def test_multi_host_job_is_refused_by_the_shared_memory_transport(monkeypatch) -> None:
    # (ANYCHIP_HOST_TRANSPORT=auto would take MPI between the hosts: tests/collectives/test_mpi.py)
    monkeypatch.setenv("ANYCHIP_HOST_TRANSPORT", "shm")
    with pytest.raises(anychip.UnsupportedError, match="spans more than one host"):
        collectives.init("cpu:0", world=World(0, 4, 0, 2, "x", "mpich"))


# -- launcher ------------------------------------------------------------------------------

def _run_launch(tmp_path, body: str, n: int, *extra: str) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", str(n), *extra, str(prog), "a1"],
                          capture_output=True, text=True, timeout=CHILD_SECONDS)


@pytest.mark.slow
def test_launch_prefixes_output_and_sets_the_variables(tmp_path) -> None:
    p = _run_launch(tmp_path, """
        import os, sys
        print(os.environ["ANYCHIP_RANK"], os.environ["ANYCHIP_WORLD_SIZE"], os.environ["ANYCHIP_LOCAL_RANK"],
              os.environ.get("ANYCHIP_LAUNCH_DEVICE"), sys.argv[1])
        print("to stderr", file=sys.stderr)
    """, 3, "--device", "kunlun")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] 0 3 0 kunlun a1", "[1] 1 3 1 kunlun a1", "[2] 2 3 2 kunlun a1"]
    assert sorted(p.stderr.splitlines()) == ["[0] to stderr", "[1] to stderr", "[2] to stderr"]


@pytest.mark.slow
def test_launch_output_into_a_closed_pipe_drops_the_rest_quietly(tmp_path) -> None:
    """``anychip launch ... | head -1``: the ranks still finish and the launcher exits 0, silent."""
    prog = tmp_path / "prog.py"
    prog.write_text("for i in range(50000):\n    print('line', i)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", str(prog)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert launcher.stdout is not None and launcher.stderr is not None
    assert launcher.stdout.readline().startswith(b"[")
    launcher.stdout.close()                 # the reader goes away
    err = launcher.stderr.read().decode()
    assert launcher.wait(timeout=CHILD_SECONDS) == 0, err
    assert err == ""


@pytest.mark.slow
def test_launch_propagates_the_first_failure_and_stops_the_others(tmp_path) -> None:
    t = time.monotonic()
    p = _run_launch(tmp_path, """
        import os, signal, sys
        if os.environ["ANYCHIP_RANK"] == "1":
            sys.exit(3)
        signal.pause()          # the launcher must stop this rank
    """, 3, "--grace", "2")
    assert p.returncode == 3, p.stderr
    assert time.monotonic() - t < 60


@pytest.mark.slow
def test_launch_reports_a_signal_as_128_plus_its_number(tmp_path) -> None:
    p = _run_launch(tmp_path, """
        import os, signal
        if os.environ["ANYCHIP_RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        signal.pause()
    """, 2)
    assert p.returncode == 137


@pytest.mark.slow
def test_example_allreduce_on_simulated_ascend() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", "4", "--device", "ascend",
                        os.path.join(root, "examples", "allreduce.py")], capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = sorted(p.stdout.splitlines())
    assert lines == [f"[{r}] rank {r} of 4 on ascend:{r}: [6.0, 10.0, 14.0, 18.0, 22.0, 26.0, 30.0, 34.0] correct"
                     for r in range(4)]


def test_repeated_calls_do_not_keep_dropped_buffers_alive(comm) -> None:
    import gc
    import weakref
    b = buf_of(comm.device, np.ones(4, np.float32))
    for _ in range(3):
        comm.all_reduce(b).wait()          # the second and third reuse the prepared call
    ref = weakref.ref(b)
    del b
    gc.collect()
    assert ref() is None


def test_repeated_call_after_free_is_refused(comm) -> None:
    b = buf_of(comm.device, np.ones(4, np.float32))
    comm.all_reduce(b).wait()
    comm.all_reduce(b).wait()
    b.free()
    with pytest.raises(anychip.InvalidArgumentError, match="^all_reduce: send was freed$"):
        comm.all_reduce(b)


def test_repeated_group_sees_new_data_and_refuses_a_freed_buffer(comm) -> None:
    import gc
    import weakref
    a = buf_of(comm.device, np.zeros(4, np.float32))
    b = buf_of(comm.device, np.zeros(4, np.float32))
    for step in range(1, 4):               # the second and third reuse the checked, prepared group
        a.copy_from(np.arange(4, dtype=np.float32) * step)
        with comm.group():
            comm.send(a, 0)
            w = comm.recv(b, 0)
        w.wait()
        assert b.to_numpy(np.float32).tolist() == [0.0, step, 2.0 * step, 3.0 * step]
    a.free()
    with pytest.raises(anychip.InvalidArgumentError, match="^send: buf was freed$"):
        with comm.group():
            comm.send(a, 0)
            comm.recv(b, 0)
    ref = weakref.ref(b)                   # the group caches hold their buffers weakly
    del a, b
    gc.collect()
    assert ref() is None


@pytest.mark.slow
def test_init_twice_in_one_job(tmp_path) -> None:
    p = _run_launch(tmp_path, """
        from anychip import collectives
        for _ in range(3):
            comm = collectives.init("cpu:0")
            assert comm.exchange(comm.rank) == [0, 1, 2]
            comm.destroy()
        print("ok")
    """, 3)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.split()) == ["[0]", "[1]", "[2]", "ok", "ok", "ok"]


def test_dropped_works_release_their_tasks_and_buffers(monkeypatch) -> None:
    import gc
    import weakref
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TRANSPORT", "host")     # the engine transport's tasks
    c = solo("hygon:0")
    dev = c.device
    s = anychip.Stream(dev)
    dev.plugin.sim_hold_stream(dev.index, s._handle)
    b = buf_of(dev, np.ones(4, np.float32))
    for _ in range(3):
        c.all_reduce(b, stream=s)          # Works dropped while the stream holds them back
    gc.collect()
    assert len(c.transport._tasks) == 3
    dev.plugin.sim_release_stream(dev.index, s._handle)
    s.synchronize()
    ref = weakref.ref(b)
    del b
    c.barrier(stream=s).wait()             # the next submit frees what completed
    assert len(c.transport._tasks) == 1    # the barrier's own task, freed by the next submit
    s.synchronize()
    gc.collect()
    assert ref() is None
    c.destroy()


def test_a_terminated_launcher_stops_its_ranks(tmp_path) -> None:
    import signal
    prog = tmp_path / "prog.py"
    marker = tmp_path / "pids"
    prog.write_text(textwrap.dedent(f"""
        import os, signal
        with open({str(marker)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        print("started", flush=True)
        signal.pause()
    """))
    p = subprocess.Popen([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", str(prog)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2):                      # both ranks have started
        assert "started" in p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    for pid in map(int, marker.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ranks_stopped_while_a_communicator_is_made_leave_no_segment(tmp_path) -> None:
    """Rank 0 makes a communicator's segment and waits for rank 1, which never joins; the launcher
    is stopped. Before, the segment stayed in /dev/shm: only the last rank to join unlinks its name,
    and rank 0 died waiting (seen when a framework conformance run was stopped at that moment)."""
    import signal
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import os, signal
        print("pid", os.getpid(), flush=True)
        if os.environ["ANYCHIP_RANK"] == "0":
            from anychip.collectives._engine import engine
            ffi, lib = engine()
            lib.ccl_comm_init(b"never-complete-" + os.environ["ANYCHIP_JOB_ID"].encode(), 0, 2, 300.0,
                              ffi.new("ccl_comm **"))
        signal.pause()
    """))
    p = subprocess.Popen([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", str(prog)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = dict(p.stdout.readline().split()[::2] for _ in range(2))     # {"[r]": "pid", ...}
        maps = f"/proc/{pids['[0]']}/maps"
        deadline = time.monotonic() + CHILD_SECONDS
        while not (names := {ln.rsplit("/", 1)[1].split()[0] for ln in open(maps) if "/dev/shm/anychip-ccl-" in ln}):
            assert time.monotonic() < deadline, "rank 0 never made the segment"
            time.sleep(0.05)
        assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert [n for n in names if os.path.exists(f"/dev/shm/{n}")] == []


def test_launch_a_module(tmp_path) -> None:
    (tmp_path / "ranked_mod.py").write_text("import os, sys\nprint(os.environ['ANYCHIP_RANK'], sys.argv[1:])\n")
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", "2", "-m", "ranked_mod", "x", "-y"],
                       capture_output=True, text=True, timeout=CHILD_SECONDS,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] 0 ['x', '-y']", "[1] 1 ['x', '-y']"]
