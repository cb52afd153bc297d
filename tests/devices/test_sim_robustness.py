"""Robustness of streams under a hostile user: host arrays of enqueued copies must live
until their copies complete (a crash here is a SIGSEGV, so those cases run in a child
process), and Ctrl-C must interrupt every kind of synchronize, even on work that never
completes (held simulator streams; an OpenCL queue blocked on a user event).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = ("ascend", "kunlun", "hygon")
_OWN_VARS = ("ANYCHIP_", "ASCEND_", "XPU_", "HIP_", "CUDA_VISIBLE_DEVICES", "ROCM_PATH")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARS)}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _available(name: str) -> bool:
    return any(b.name == name and b.available and b.device_count for b in anychip.backends())


# -- host arrays live as long as their copies -----------------------------------------

SYNC_RACE = """
    import sys, threading, time, numpy as np, anychip
    name, mode = sys.argv[1], sys.argv[2]
    d = anychip.device(name + ":0")
    s = anychip.Stream(d)
    buf = d.alloc(32 << 20)
    buf.copy_from(np.full(32 << 20, 7, np.uint8))
    done = threading.Event()
    def synchronizer():
        while not done.is_set():
            s.synchronize() if mode == "stream" else d.synchronize()
    t = threading.Thread(target=synchronizer)
    t.start()
    kept = []
    end = time.monotonic() + float(sys.argv[3])
    i = 0
    while time.monotonic() < end:
        out = np.empty(32 << 20, np.uint8)      # the caller drops it: only the stream holds it
        buf.copy_to(out, stream=s)
        if i % 20 == 0:
            kept.append(out)
        del out
        i += 1
    done.set()
    t.join()
    s.synchronize()
    print(sum(int((k == 7).all()) == 1 for k in kept) == len(kept) > 0)
"""

HELD_RACE = """
    import os, sys, threading, weakref, numpy as np, anychip
    name = sys.argv[1]
    d = anychip.device(name + ":0")
    s = anychip.Stream(d)
    buf = d.alloc(64 << 20)
    buf.copy_from(np.full(64 << 20, 7, np.uint8))
    d.plugin.sim_hold_stream(d.index, s._handle)
    first = np.zeros(8, np.uint8)
    buf.copy_to(first, 8, stream=s)            # all the synchronize below waits for
    tid = []
    def synchronizer():
        tid.append(threading.get_native_id())
        s.synchronize()
    t = threading.Thread(target=synchronizer)
    t.start()
    while not tid or open(f"/proc/self/task/{tid[0]}/stat").read().rsplit(")", 1)[1].split()[0] != "S":
        pass                                   # until it waits in the synchronize
    later = []
    for _ in range(3):                         # enqueued after that synchronize began
        out = np.empty(64 << 20, np.uint8)
        buf.copy_to(out, stream=s)
        later.append(weakref.ref(out))
        del out                                # only the stream holds it now
    d.plugin.sim_release_stream(d.index, s._handle)
    t.join()
    alive = sum(r() is not None for r in later)
    s.synchronize()
    print(int(first.sum()), alive >= 0, sum(r() is not None for r in later))
"""


@pytest.mark.parametrize("mode", ["stream", "device"])
@pytest.mark.parametrize("name", SIM)
@pytest.mark.slow
def test_synchronize_in_another_thread_keeps_host_arrays_of_later_copies(name, mode):
    """One thread synchronizes in a loop while another enqueues 32 MiB device-to-host
    copies into arrays only the stream holds: a synchronize must release only the arrays
    of copies enqueued before it began (this was a SIGSEGV)."""
    seconds = os.environ.get("ANYCHIP_STRESS_SECONDS", "1.5")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SYNC_RACE), name, mode, seconds],
                          capture_output=True, text=True, env=_env(), timeout=CHILD_SECONDS)
    assert proc.returncode == 0, f"exit status {proc.returncode} (negative: killed by a signal)\n{proc.stderr}"
    assert proc.stdout.strip() == "True"        # every array checked received the data


@pytest.mark.parametrize("name", SIM)
@pytest.mark.slow
def test_synchronize_does_not_release_host_arrays_of_copies_enqueued_after_it_began(name):
    """Deterministic form: a synchronize waiting on a held stream for one small copy; three
    64 MiB copies into arrays only the stream holds are enqueued after it began; on
    release it returns while they run, and must not free their arrays (a SIGSEGV before)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(HELD_RACE), name], capture_output=True,
                          text=True, env=_env(), timeout=CHILD_SECONDS)
    assert proc.returncode == 0, f"exit status {proc.returncode} (negative: killed by a signal)\n{proc.stderr}"
    assert proc.stdout.split() == ["56", "True", "0"]       # first copy done; all released at the end


@pytest.mark.parametrize("name", SIM)
def test_kept_host_arrays_are_released_by_the_completion_of_their_own_op(name):
    d = anychip.device(f"{name}:0")
    s = anychip.Stream(d)
    buf = d.alloc(4096)
    buf.copy_from(np.full(4096, 5, np.uint8))
    d.plugin.sim_hold_stream(d.index, s._handle)
    a = np.zeros(4096, np.uint8)
    before = weakref.ref(a)
    buf.copy_to(a, stream=s)
    del a
    ev = s.record_event()
    b = np.zeros(4096, np.uint8)
    after = weakref.ref(b)
    buf.copy_to(b, stream=s)
    del b
    assert before() is not None and after() is not None and not s.query()
    d.plugin.sim_release_stream(d.index, s._handle)
    ev.synchronize()
    assert before() is None                     # its copy came before the event: complete
    assert after() is not None                  # not known complete: still held
    s.synchronize()
    assert after() is None
    s.destroy()


# -- Ctrl-C interrupts synchronize ------------------------------------------------------

INTERRUPT = """
    import sys, time, numpy as np, anychip
    name, what, path = sys.argv[1], sys.argv[2], sys.argv[3]
    d = anychip.device(name + ":0")
    if path == "polled":                       # as on a vendor library: no simulator timed waits
        d.plugin._timed_stream_wait = d.plugin._timed_event_wait = d.plugin._timed_device_wait = None
    s = anychip.Stream(d)
    buf = d.alloc(4096)
    if name == "opencl":                       # a queue that waits for a user event
        import pyopencl as cl
        q = s._handle.queue
        gate = cl.UserEvent(q.context)
        d.plugin._after_enqueue(s._handle, cl.enqueue_barrier(q, wait_for=[gate]))
        release = lambda: gate.set_status(cl.command_execution_status.COMPLETE)
    else:                                      # a held simulator stream
        d.plugin.sim_hold_stream(d.index, s._handle)
        release = lambda: d.plugin.sim_release_stream(d.index, s._handle)
    buf.copy_from(np.full(4096, 3, np.uint8), stream=s)
    ev = s.record_event()
    print("waiting", flush=True)
    try:
        {"stream": s.synchronize, "event": ev.synchronize, "device": d.synchronize}[what]()
        print("returned", flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.monotonic(), flush=True)
    release()                                  # the work was not lost: it completes now
    s.synchronize()
    out = np.zeros(4096, np.uint8)
    buf.copy_to(out)
    print("data", int(out.sum()), flush=True)
"""


def _sleeping(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.parametrize("what", ["stream", "event", "device"])
@pytest.mark.parametrize("name,path", [*((n, "timed") for n in SIM), *((n, "polled") for n in SIM),
                                       ("opencl", "native")])
@pytest.mark.slow
def test_ctrl_c_interrupts_synchronize_of_work_that_never_completes(name, path, what):
    """``timed``: the simulator's timed waits; ``polled``: the path taken on a vendor's
    own library, which polls the vendor's queries."""
    if not _available(name):
        pytest.skip(f"{name} is not available here")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(INTERRUPT), name, what, path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
        # the child's main thread is blocked in the synchronize once it sleeps in the kernel
        deadline = time.monotonic() + 30
        while not _sleeping(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{name} {what} synchronize ignored SIGINT: still blocked 20 s later")
    lines = out.split("\n")
    assert lines[0].split()[0] == "interrupted", out + err
    delay = float(lines[0].split()[1]) - sent
    assert delay < 3.0, f"interrupted {delay:.2f} s after SIGINT"    # waits come back every 50 ms
    assert lines[1] == f"data {3 * 4096}", out + err
    assert proc.returncode == 0, err


# -- a runtime library outlives its last Python reference ------------------------------

UNLOAD = """
    import gc, sys, numpy as np
    from anychip.chips.{module} import {cls}
    from anychip.runtime.plugin import H2D
    p = {cls}(); p.available()
    path = p.library_path
    h = p._malloc(0, 4096); s = p._default_stream(0)
    p._copy(0, h, 0, np.ones(4096, np.uint8), 0, 4096, H2D, s)   # its stream's worker thread runs
    p._stream_synchronize(0, s)
    del p; gc.collect()                 # what interpreter exit does to every module's objects
    print(path in open("/proc/self/maps").read())
"""


@pytest.mark.parametrize("name", SIM)
def test_the_library_stays_mapped_while_its_threads_live(name):
    """Dropping the last reference to a runtime library must not unmap it: its stream
    worker threads are parked in its code, and a process exiting with them woke them
    into unmapped memory (a rare SIGSEGV after all work was done)."""
    if not _available(name):
        pytest.skip(f"{name} is not available here")
    cls = {"ascend": "AscendPlugin", "kunlun": "KunlunPlugin", "hygon": "HygonPlugin"}[name]
    code = textwrap.dedent(UNLOAD.format(module=name, cls=cls))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"], proc.stdout + proc.stderr
