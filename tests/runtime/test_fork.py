"""fork(): the child gets a fresh front end (new locks, empty allocators, no streams)
on every backend that can run there, and a clear error, never a hang, for OpenCL.

Each scenario runs in a subprocess: a hang there fails the test by its alarm or
timeout instead of hanging the suite, and the suite's own OpenCL state stays
out of the children.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import CHILD_SECONDS

import anychip

SIM_AND_CPU = [n for n in ("ascend:0", "kunlun:0", "hygon:0", "cpu:0")
               if any(d.name == n for d in anychip.devices())]
HAS_OPENCL = any(d.backend == "opencl" for d in anychip.devices())


def run(code: str, timeout: int = CHILD_SECONDS) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("name", SIM_AND_CPU)
@pytest.mark.slow
def test_child_of_an_allocating_parent_gets_fresh_devices(name):
    r = run(f'''
        import os, numpy as np, anychip
        d = anychip.device({name!r})
        keep = [d.alloc(n) for n in (512, 4096, 3 << 20)]
        keep[1].copy_from(np.arange(1024, dtype=np.int32))
        s = anychip.Stream(d)
        tmp = d.alloc(1000, stream=s)
        del tmp                                   # a cached block on a stream of the parent
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                x = d.alloc(4096)
                x.copy_from(np.full(1024, 7, np.int32))
                ok = (x.to_numpy(np.int32) == 7).all()
                s2 = anychip.Stream(d)
                y = d.alloc(256, stream=s2).copy_from(np.arange(256, dtype=np.uint8), stream=s2)
                out = np.empty(256, np.uint8)
                y.copy_to(out, stream=s2)
                s2.synchronize()
                ok = ok and out.tolist() == list(range(256))
                del x, y
                d.synchronize()
                d.empty_cache()
                stats = d.memory_stats()
                print("child", ok, stats["allocated_bytes.all.current"], stats["active_bytes.all.current"],
                      anychip.device({name!r}) is d, flush=True)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("status", status)
        print("parent", keep[1].to_numpy(np.int32)[:3].tolist(), d.memory_stats()["allocated_bytes.all.current"])
    ''')
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["child True 0 0 True", "status 0",
                                     f"parent [0, 1, 2] {512 + 4096 + (3 << 20)}"]


@pytest.mark.parametrize("name", SIM_AND_CPU)
@pytest.mark.slow
def test_parent_objects_are_refused_in_the_child(name):
    r = run(f'''
        import os, anychip
        d = anychip.device({name!r})
        buf = d.alloc(4096)
        s = anychip.Stream(d)
        with s:
            pid = os.fork()
            if pid == 0:
                try:
                    s.synchronize()
                except anychip.InvalidArgumentError as e:
                    print(type(e).__name__, e)
                print(anychip.current_stream(d))
                # a parent's buffer: refused naming the parent, or returned to the parent's
                # (orphaned) allocator; never into the child's
                try:
                    buf.free()
                except anychip.InvalidArgumentError as e:
                    assert "of the parent process (before fork())" in str(e), e
                st = d.memory_stats()
                print(st["allocated_bytes.all.current"], st["reserved_bytes.all.current"])
                os._exit(0)
        os.waitpid(pid, 0)
    ''')
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"InvalidArgumentError <anychip stream of {name} (destroyed)> was destroyed; create a new anychip.Stream",
        f"<anychip default stream of {name}>",
        "0 0",
    ]


@pytest.mark.parametrize("name", SIM_AND_CPU)
@pytest.mark.slow
def test_fork_while_another_thread_allocates(name):
    # Another thread holds the device lock at some forks; the child must not inherit it
    # held. A child that deadlocks is killed by its alarm and shows up as a bad status.
    r = run(f'''
        import os, signal, threading, anychip
        d = anychip.device({name!r})
        stop = threading.Event()
        def worker():
            while not stop.is_set():
                bufs = [d.alloc(n) for n in (512, 1024, 4096, 70000)]
                for b in bufs:
                    b.free()
                d.memory_stats()
        t = threading.Thread(target=worker)
        t.start()
        bad = []
        try:
            for _ in range(40):
                pid = os.fork()
                if pid == 0:
                    signal.alarm(10)
                    b = d.alloc(2048)
                    b.memset(3)
                    ok = b.to_numpy().sum() == 3 * 2048
                    b.free()
                    d.empty_cache()
                    os._exit(0 if ok else 3)
                _, status = os.waitpid(pid, 0)
                if status:
                    bad.append(status)
                    break
        finally:
            stop.set()
            t.join()
        print("bad", bad)
    ''', timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "bad []"


CHIPS = [n for n in ("ascend:0", "kunlun:0", "hygon:0") if n in SIM_AND_CPU]


@pytest.mark.parametrize("lock", ["ffi._lock", "cparser.lock"])
@pytest.mark.parametrize("name", CHIPS)
def test_fork_while_another_thread_parses_a_c_type(name, lock):
    # cffi holds its FFI's lock and its C parser's while it parses a C type named for the
    # first time, as a thread does at its first allocation; a child forked then must not
    # wait for them
    r = run(f'''
        import os, signal, threading, anychip
        from cffi import cparser
        d = anychip.device({name!r})
        ffi = d.plugin.ffi
        held, release = threading.Event(), threading.Event()
        def parsing():
            with {lock}:
                held.set()
                release.wait()
        t = threading.Thread(target=parsing)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            b = d.alloc(2048)                 # the child's first C types: parsed under the lock
            b.memset(3)
            os._exit(0 if b.to_numpy().sum() == 3 * 2048 else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        t.join()
        print("status", status)
    ''')
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "status 0"

SCENARIO_POOL = """
import multiprocessing as mp, numpy as np, anychip

def job(_):
    try:
        anychip.device("opencl:0").alloc(16).copy_from(b"x" * 16)
        return "no error"
    except anychip.AnychipError as e:
        return f"{type(e).__name__}: {e}"

PARENT = []

def job_parent_device(_):
    try:
        PARENT[0].alloc(16)
        return "no error"
    except anychip.AnychipError as e:
        return f"{type(e).__name__}: {e}"

if __name__ == "__main__":
    d = anychip.device("opencl:0")            # only this: the platform is initialized
    PARENT.append(d)                          # the parent's Device object, inherited by the fork
    with mp.get_context("fork").Pool(1) as pool:
        print(pool.apply_async(job, (0,)).get(timeout=60))
        print(pool.apply_async(job_parent_device, (0,)).get(timeout=60))
    with mp.get_context("spawn").Pool(1) as pool:   # the fix the message names works
        print(pool.apply_async(job, (0,)).get(timeout=60))
    b = d.alloc(64).copy_from(np.arange(64, dtype=np.uint8))
    print("parent", int(b.to_numpy().sum()))
"""


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
@pytest.mark.slow
def test_opencl_in_a_forked_child_is_refused_not_hung(tmp_path):
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO_POOL)
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_DEVICES"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    from anychip.chips.opencl import FORK_REASON
    assert r.stdout.splitlines() == [
        f"SelectionError: device 'opencl:0': backend 'opencl' is unavailable: {FORK_REASON}",
        f"UnsupportedError: {FORK_REASON}",
        "no error",
        "parent 2016",
    ]
    assert "'spawn' start method" in FORK_REASON


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
@pytest.mark.slow
def test_opencl_child_lists_it_unavailable_and_exits_cleanly():
    r = run('''
        import os, sys, numpy as np, anychip
        d = anychip.device("opencl:0")
        s = anychip.Stream(d)
        out = np.empty(1 << 20, np.uint8)
        d.alloc(1 << 20).copy_to(out, stream=s)    # pending work and host copies in the parent
        pid = os.fork()
        if pid == 0:
            info = anychip.runtime.registry.backend("opencl")
            print(info.available, info.device_count, info.reason.split(",")[0])
            print("opencl" in {x.backend for x in anychip.devices()})
            sys.exit(0)                            # a normal exit: finalizers run
        print("status", os.waitpid(pid, 0)[1])
        s.synchronize()
    ''', timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "False 0 OpenCL was initialized in the parent process before fork()",
        "False",
        "status 0",
    ]


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_opencl_never_initialized_in_the_parent_works_in_the_child():
    r = run('''
        import os, signal, numpy as np, anychip
        pid = os.fork()                            # the parent only imported anychip
        if pid == 0:
            signal.alarm(60)
            code = 3
            try:
                b = anychip.device("opencl:0").alloc(32).copy_from(np.arange(32, dtype=np.uint8))
                code = 0 if int(b.to_numpy().sum()) == 496 else 4
            finally:
                os._exit(code)
        print("status", os.waitpid(pid, 0)[1])
    ''', timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "status 0"


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
@pytest.mark.slow
def test_opencl_child_exit_does_not_wait_for_the_parents_held_host_copy():
    """A host copy of the parent that waits for a user event is pending at the fork: the
    child's normal exit must not release the parent's objects (the copy's NannyEvent
    waits for its completion in its destructor, and it never completes in the child)."""
    r = run('''
        import os, sys, numpy as np, pyopencl as cl, anychip
        d = anychip.device("opencl:0")
        s = anychip.Stream(d)
        buf = d.alloc(4096).copy_from(np.full(4096, 9, np.uint8))
        q = s._handle.queue
        gate = cl.UserEvent(q.context)
        d.plugin._after_enqueue(s._handle, cl.enqueue_barrier(q, wait_for=[gate]))
        out = np.zeros(4096, np.uint8)
        buf.copy_to(out, stream=s)                 # held behind the gate: pending at the fork
        pid = os.fork()
        if pid == 0:
            print("child", anychip.runtime.registry.backend("opencl").available, flush=True)
            sys.exit(0)                            # a normal exit: module teardown and gc run
        print("status", os.waitpid(pid, 0)[1], flush=True)
        gate.set_status(cl.command_execution_status.COMPLETE)
        s.synchronize()
        print("parent", int(out.sum()), flush=True)
    ''', timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["child False", "status 0", f"parent {9 * 4096}"]
