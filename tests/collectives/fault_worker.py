"""One rank of the fault tests (run by tests/collectives/test_faults.py), two ranks, any transport.

    fault_worker.py abort         rank 1 never joins the op; rank 0 aborts the communicator
                                  with the op pending
    fault_worker.py kill_destroy  rank 1 dies with its op enqueued and not started; rank 0
                                  destroys the communicator (a `finally:`), then waits
    fault_worker.py hang          rank 1 stops (SIGSTOP) before the op; rank 0's op times out,
                                  and rank 0 exits with status 1
    fault_worker.py stop          rank 1 stops (SIGSTOP) before the op; rank 0's op times out
    fault_worker.py fork          rank 0 forks a child (a DataLoader worker) that calls an op
                                  and destroy on the inherited communicator, then both ranks
                                  reduce (BUF is rank 0's result)

Rank 0 prints one line per step, ``STEP <name>|<seconds>|<exception type or none>|<message>``,
and ``BUF <first element>`` (the op's buffer after the fault); the test checks them.
Rank 1 of ``abort`` stays alive until its stdin closes.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import anychip
from anychip import collectives

N = 100_000
_print_lock = threading.Lock()


def step(name: str, fn) -> object:
    t = time.perf_counter()
    try:
        out = fn()
        kind, msg = "none", ""
    except anychip.AnychipError as exc:
        out, kind, msg = None, type(exc).__name__, str(exc)
    with _print_lock:                     # one whole line at a time (the watchdog prints too)
        sys.stdout.write(f"STEP {name}|{time.perf_counter() - t:.4f}|{kind}|{msg}\n")
        sys.stdout.flush()
    return out


def hold(dev) -> None:
    """Rank 1's op enqueued behind a held stream (simulated chips): it never starts."""
    dev.plugin.sim_hold_stream(dev.index, dev.current_stream()._live())


def fork_child(comm, buf) -> None:
    """Rank 0's child: an op and destroy on the inherited communicator; it reports their
    outcome to the parent through a pipe (its own stdout is the parent's)."""
    if comm.rank != 0:
        return
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        lines = []
        for name, fn in (("child_op", lambda: comm.all_reduce(buf).wait(timeout=10)), ("child_destroy", comm.destroy)):
            try:
                fn()
                lines.append(f"STEP {name}|0|none|")
            except anychip.AnychipError as exc:
                lines.append(f"STEP {name}|0|{type(exc).__name__}|{exc}")
        os.write(wr, ("\n".join(lines) + "\n").encode())
        os._exit(0)
    os.close(wr)
    with os.fdopen(rd) as f:
        sys.stdout.write(f.read())
    os.waitpid(pid, 0)


def main() -> None:
    suite = sys.argv[1]
    comm = collectives.init()
    dev, r = comm.device, comm.rank
    buf = dev.alloc(4 * N).copy_from(np.ones(N, dtype=np.float32))
    if suite == "fork":
        fork_child(comm, buf)
        step("op", lambda: comm.all_reduce(buf).wait(timeout=30))
        print(f"BUF {buf.to_numpy(np.float32)[0]:g}", flush=True)
        comm.destroy()
        return
    if suite == "stop":
        # a 2 s timeout for a communicator made once both ranks are up
        os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = "2"
        comm = comm.split(0)
        if r == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        step("op", lambda: comm.all_reduce(buf).wait())
        return
    if suite == "hang":
        if r == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        step("op", lambda: comm.all_reduce(buf).wait())
        sys.exit(1)
    if r == 1:
        if suite == "kill_destroy":
            if hasattr(dev.plugin, "sim_hold_stream"):
                hold(dev)
                comm.all_reduce(buf)
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.read()                  # alive, never joins the op
        return
    if suite == "abort":
        # torch's watchdog pattern: another thread aborts the stuck communicator while this
        # one waits for the op (on the cpu the op itself runs in this thread, and blocks)
        watchdog = threading.Timer(0.3, step, ("abort", lambda: comm.abort("watchdog: step 7 made no progress")))
        watchdog.start()
        work = step("op", lambda: comm.all_reduce(buf))
        if work is not None:
            step("wait", lambda: work.wait(timeout=30))
            step("wait_again", lambda: work.wait())
        watchdog.join()
        step("next_op", lambda: comm.all_reduce(buf))
        step("destroy", comm.destroy)
    else:
        work = step("op", lambda: comm.all_reduce(buf))
        step("destroy", comm.destroy)
        if work is not None:
            step("wait", lambda: work.wait(timeout=30))
    print(f"BUF {buf.to_numpy(np.float32)[0]:g}", flush=True)


if __name__ == "__main__":
    main()
