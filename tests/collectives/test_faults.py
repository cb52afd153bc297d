"""Faults under a pending collective, on every transport: a communicator aborted by a
watchdog thread, a peer killed before a `finally: comm.destroy()`. Each case runs two rank
processes (tests/collectives/fault_worker.py) with a bound on their time: a hang is a failure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import CHILD_SECONDS, ccl_segments, leaked_segments

import anychip

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")

#: transport id -> (device backend, ANYCHIP_COLLECTIVE_TRANSPORT, the transport's name)
TRANSPORTS = {
    "hccl": ("ascend", "native", "native/HCCL (simulated)"),
    "bkcl": ("kunlun", "native", "native/BKCL (simulated)"),
    "rccl": ("hygon", "native", "native/RCCL (simulated)"),
    "shm-sim": ("ascend", "host", "shm/sim"),
    "shm-host": ("cpu", "host", "shm/host"),
}


def _available(backend: str) -> bool:
    return any(b.name == backend and b.available for b in anychip.backends())


def _params(ids):
    return [pytest.param(t, marks=pytest.mark.skipif(not _available(TRANSPORTS[t][0]),
                                                     reason=f"{TRANSPORTS[t][0]} is unavailable"))
            for t in ids]


def _run(transport: str, suite: str) -> tuple[dict[str, tuple[float, str, str]], str, list[int]]:
    """Rank 0's steps {name: (seconds, exception type, message)}, its BUF value, the exit codes."""
    backend, choice, _ = TRANSPORTS[transport]
    job = f"fault-{os.getpid()}-{time.monotonic_ns()}"
    procs = []
    for r in range(2):
        env = {**os.environ, "ANYCHIP_RANK": str(r), "ANYCHIP_WORLD_SIZE": str(2), "ANYCHIP_JOB_ID": job,
               "ANYCHIP_LAUNCH_DEVICE": backend, "ANYCHIP_COLLECTIVE_TRANSPORT": choice,
               "ANYCHIP_COLLECTIVE_TIMEOUT": "40"}
        procs.append(subprocess.Popen([sys.executable, WORKER, suite], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        out, err = procs[0].communicate(timeout=90)
        if suite == "stop":
            procs[1].kill()                   # stopped for good
        procs[1].communicate("", timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 0, f"rank 0 exit {procs[0].returncode}\n{out}\n{err}"
    steps = {}
    buf = ""
    for line in out.splitlines():
        if line.startswith("STEP "):
            name, secs, kind, msg = line[5:].split("|", 3)
            steps[name] = (float(secs), kind, msg)
        elif line.startswith("BUF "):
            buf = line[4:]
    return steps, buf, [p.returncode for p in procs]


@pytest.mark.parametrize("transport", _params(TRANSPORTS))
@pytest.mark.slow
def test_abort_fails_the_pending_op_and_every_later_call(transport):
    before = ccl_segments()
    steps, buf, codes = _run(transport, "abort")
    assert steps["abort"][1:] == ("none", ""), steps
    reason = "watchdog: step 7 made no progress"
    if "wait" in steps:                   # the op was enqueued: its Work reports the abort
        _, kind, msg = steps["wait"]
        assert kind == "CollectiveError", steps
        assert "aborted" in msg and msg.endswith(reason), msg
        assert steps["wait_again"][1:] == steps["wait"][1:]
    else:                                 # the op ran in the calling thread: it raised
        _, kind, msg = steps["op"]
        assert kind == "CollectiveError", steps
        assert "aborted the communicator" in msg and msg.endswith(reason), msg
    assert buf == "1"                     # nothing was reduced
    _, kind, msg = steps["next_op"]
    assert kind == "CollectiveError", steps
    assert reason in msg and "aborted" in msg, msg
    assert steps["destroy"][1:] == ("none", ""), steps
    assert codes == [0, 0]
    assert not leaked_segments(before)


@pytest.mark.parametrize("transport", _params(TRANSPORTS))
@pytest.mark.slow
def test_a_killed_peer_fails_the_pending_op_even_after_destroy(transport):
    before = ccl_segments()
    steps, buf, codes = _run(transport, "kill_destroy")
    assert codes[1] == -9
    failed = steps.get("wait", steps["op"])
    _, kind, msg = failed
    assert kind == "CollectiveError", steps
    assert "failed: missing rank 1 (pid " in msg and msg.endswith(" died)"), msg
    assert steps["destroy"][1:] == ("none", ""), steps
    assert buf == "1"
    assert not leaked_segments(before)


@pytest.mark.parametrize("transport", _params(TRANSPORTS))
@pytest.mark.slow
def test_a_stopped_peer_is_a_timeout_naming_it(transport):
    before = ccl_segments()
    steps, _, codes = _run(transport, "stop")
    _, kind, msg = steps["op"]
    assert kind == "CollectiveTimeout", steps
    assert msg.startswith("all_reduce (op #1, group world.split1(color=0)) timed out after 2.0 s on rank 0: "
                          "waiting for rank 1"), msg
    assert codes == [0, -9]
    assert not leaked_segments(before)


@pytest.mark.parametrize("transport", _params(["hccl", "shm-host"]))
@pytest.mark.slow
def test_a_forked_child_cannot_act_as_its_parents_rank(transport):
    before = ccl_segments()
    steps, buf, codes = _run(transport, "fork")
    _, kind, msg = steps["child_op"]
    assert kind == "InvalidArgumentError", steps
    assert msg.startswith("this call: <anychip Communicator world: rank 0 of 2 on "), msg
    assert " is a fork() of it and cannot take part as that rank. Make the communicator in the child " in msg
    assert steps["child_destroy"][1:] == ("none", "")      # forgets it, tells no peer
    assert steps["op"][1:] == ("none", "")                 # the parents still reduce together
    assert buf == "2"
    assert codes == [0, 0]
    assert not leaked_segments(before)


def _mpi_skip() -> str | None:
    from test_mpi import _skip_reason
    return _skip_reason()


def _processes_with(token: str) -> list[int]:
    """Pids whose command line holds ``token``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(pid))
        except OSError:                   # gone meanwhile, or not a process
            continue
    return pids


@pytest.mark.slow
def test_an_mpi_timeout_ends_the_job_when_a_rank_hangs():
    reason = _mpi_skip()
    if reason:
        pytest.skip(reason)
    from test_mpi import _mpiexec
    token = f"job-{os.getpid()}-{time.monotonic_ns()}"
    shm = set(os.listdir("/dev/shm"))
    env = dict(os.environ, ANYCHIP_HOST_TRANSPORT="mpi", ANYCHIP_COLLECTIVE_TIMEOUT="2", ANYCHIP_SIMULATE="always")
    env.pop("ANYCHIP_DEVICES", None)
    # rank 1 stops itself; before the fix rank 0 stayed in MPI_Finalize and the job never ended
    p = subprocess.run([_mpiexec(), "-n", "2", sys.executable, WORKER, "hang", token], capture_output=True,
                       text=True, env=env, timeout=CHILD_SECONDS)
    assert "STEP op|" in p.stdout and "|CollectiveTimeout|all_reduce (op #1) on group world (MPI) did not complete " \
        "within 2 s on rank 0 (ANYCHIP_COLLECTIVE_TIMEOUT=2): rank 1 has not called it" in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0
    assert ("anychip: rank 0 is exiting with 1 collective(s) that timed out still incomplete (all_reduce on group "
            "world): MPI cannot finalize with them pending, so it aborts the job (MPI_Abort)") in p.stderr, p.stderr
    assert _all_gone(token) == []         # mpiexec's clean-up of the stopped rank may trail its exit
    # the aborting rank removed MPICH's own segments, which MPI_Abort leaves behind
    assert sorted(n for n in set(os.listdir("/dev/shm")) - shm if n.startswith(("mpich_shm_", "sm_segment."))) == []


# -- the launcher always reaps its ranks ------------------------------------------------------

RANK = """
import os, signal, sys, time
def trap(signum, frame):                  # a rank that checkpoints on SIGTERM / SIGINT, slowly
    print(f"trapped {signum}", flush=True)
signal.signal(signal.SIGTERM, trap)
signal.signal(signal.SIGINT, trap)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _launcher(tmp_path, n: int, *extra: str, **popen) -> subprocess.Popen:
    prog = tmp_path / "rank.py"
    prog.write_text(RANK)
    return subprocess.Popen([sys.executable, "-m", "anychip.cli", "launch", "-n", str(n), *extra, str(prog)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _read_until(p: subprocess.Popen, text: bytes, count: int, limit: float = 60.0) -> bytes:
    """The launcher's output until ``text`` appeared ``count`` times (a bound on the wait)."""
    import select
    out = b""
    deadline = time.monotonic() + limit
    while out.count(text) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"waited {limit} s for {count} x {text!r}; got {out!r}"
        ready, _, _ = select.select([p.stdout], [], [], left)
        if ready:
            chunk = os.read(p.stdout.fileno(), 65536)
            assert chunk, f"the launcher closed its output early: {out!r}"
            out += chunk
    return out


def _all_gone(token: str, limit: float = 10.0) -> list[int]:
    """Processes still running with ``token`` in their command line after at most ``limit`` s."""
    deadline = time.monotonic() + limit
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _processes_with(token)


def test_a_second_ctrl_c_kills_ranks_that_trap_sigterm(tmp_path):
    p = _launcher(tmp_path, 3, "--grace", "120")
    try:
        _read_until(p, b"ready", 3)
        p.send_signal(signal.SIGINT)               # the launcher stops the ranks: SIGTERM, which they trap
        _read_until(p, b"trapped 15", 3)
        p.send_signal(signal.SIGINT)               # the user insists: SIGKILL now, not after 120 s
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        left = _all_gone(str(tmp_path))
        _kill_left(str(tmp_path))
    assert p.returncode == 130, err
    assert b"Traceback" not in err, err.decode()
    assert left == []


def test_a_killed_launcher_leaves_no_rank(tmp_path):
    p = _launcher(tmp_path, 3)
    try:
        _read_until(p, b"ready", 3)
        p.kill()
        p.communicate(timeout=60)
        assert _all_gone(str(tmp_path)) == []      # the ranks' parent-death signal
    finally:
        _kill_left(str(tmp_path))


@pytest.mark.slow
def test_a_rank_that_cannot_start_stops_the_others(tmp_path):
    import resource

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    p = _launcher(tmp_path, 40, preexec_fn=few_files)
    try:
        out, err = p.communicate(timeout=CHILD_SECONDS)
    finally:
        _kill_left(str(tmp_path))
    assert p.returncode == 1, err
    text = err.decode()
    assert b"Traceback" not in err, text
    line = next(ln for ln in text.splitlines() if ln.startswith("anychip: error: launch: starting rank "))
    assert line.endswith("failed: [Errno 24] Too many open files; the " + line.split("starting rank ")[1].split()[0]
                         + " rank(s) already started were stopped"), line
    assert _all_gone(str(tmp_path)) == []


def _kill_left(token: str) -> None:
    for pid in _processes_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# -- a plugin that crashes in its init ------------------------------------------------------------

CRASHING = {
    "segv": "int anychip_plugin_init(void *table) { (void)table; *(volatile int *)0 = 1; return 0; }\n",
    "abort": "#include <stdlib.h>\nint anychip_plugin_init(void *table) { (void)table; abort(); }\n",
    # built against a larger table than this anychip's: writes past the end of the one it gets
    "spill": "#include <string.h>\n#include \"anychip/plugin.h\"\n"
             "int anychip_plugin_init(anychip_plugin *t) { memset((char *)t + sizeof *t, 0x5a, 40); return 1; }\n",
}


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    import shutil

    from anychip._data import get_include
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("crashing")
    libs = {}
    for name, code in CRASHING.items():
        src = out / f"{name}.c"
        src.write_text(code)
        lib = out / f"libcrash_{name}.so"
        subprocess.run([gcc, "-shared", "-fPIC", f"-I{get_include()}", "-o", str(lib), str(src)], check=True)
        libs[name] = str(lib)
    return libs


def _plugin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "ANYCHIP_PLUGIN_PATH")}
    env.update(extra)
    return env


@pytest.mark.parametrize(("kind", "signame"), [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
@pytest.mark.slow
def test_plugin_check_survives_a_plugin_that_crashes(crashing, kind, signame):
    lib = crashing[kind]
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "plugin", "check", lib], capture_output=True,
                       text=True, env=_plugin_env(), timeout=CHILD_SECONDS)
    assert p.returncode == 1, p.stderr
    assert p.stderr.endswith(f"anychip plugin check: {lib} refused: it crashed the process that loaded and checked "
                             f"it ({signame})\n"), p.stderr
    assert f'File "<anychip: initialising plugin library {lib}>"' in p.stderr, p.stderr


@pytest.mark.slow
def test_a_crashing_plugin_outside_the_selection_is_not_initialised(crashing):
    code = "import anychip; b = anychip.device('cpu:0').alloc(8); print('ok', anychip.devices())"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_SECONDS,
                       env=_plugin_env(ANYCHIP_PLUGIN_PATH=crashing["segv"], ANYCHIP_DEVICES="cpu"))
    assert (p.returncode, p.stdout) == (0, "ok [device('cpu:0')]\n"), p.stderr


def test_a_plugin_that_crashes_in_discovery_is_named(crashing):
    lib = crashing["segv"]
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "devices"], capture_output=True, text=True,
                       timeout=CHILD_SECONDS, env=_plugin_env(ANYCHIP_PLUGIN_PATH=lib))
    assert p.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in p.stderr, p.stderr
    assert f'File "<anychip: initialising plugin library {lib}>", line 1 in <module>' in p.stderr, p.stderr


@pytest.mark.slow
def test_a_plugin_writing_past_its_table_is_refused(crashing):
    lib = crashing["spill"]
    p = subprocess.run([sys.executable, "-m", "anychip.cli", "plugin", "check", lib], capture_output=True,
                       text=True, env=_plugin_env(), timeout=CHILD_SECONDS)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith(f"anychip plugin check: {lib} refused: anychip_plugin_init wrote 40 bytes past the end "
                               "of the "), p.stderr
    assert p.stderr.endswith("-byte table it was given (it ignores struct_size): rebuild it against this anychip's "
                             "anychip/plugin.h (anychip plugin cflags)\n"), p.stderr
