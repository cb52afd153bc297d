"""`anychip conformance --framework torch|paddle` stopped while its ranks run: Ctrl-C (SIGINT to
the terminal's process group) and SIGTERM to the command alone end the command with one line
and no traceback, and leave no process of the job, no shared-memory segment of its
communicators and no temporary file (as the device-level `anychip conformance` and
`anychip launch` do)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import leaked_segments

ROOT = Path(__file__).resolve().parents[2]
WORKER = {"torch": "torch_worker.py", "paddle": "paddle_worker.py"}


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    out[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def _descendants(root: int) -> set[int]:
    parents = _children()
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _segments(pid: int) -> set[str]:
    """The anychip shared-memory segments process ``pid`` maps (its communicators')."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.rsplit("/", 1)[1].split()[0] for line in f if "/dev/shm/anychip-ccl-" in line}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_stopped_framework_run_leaves_nothing(framework: str, how: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    env.update(TMPDIR=str(tmp), ANYCHIP_LOG_LEVEL="ERROR")
    p = subprocess.Popen([sys.executable, "-m", "anychip", "conformance", "--framework", framework, "-n", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    seen: set[int] = set()
    segments: set[str] = set()
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and p.poll() is None:    # until both ranks have a communicator
            seen |= _descendants(p.pid)
            ranks = [pid for pid in seen if _alive(pid) and _segments(pid)]
            if len(ranks) >= 2:
                segments = set().union(*map(_segments, ranks))
                break
            time.sleep(0.2)
        assert segments, f"the ranks never had a communicator: {p.poll()} {p.stderr.read() if p.poll() else ''}"
        seen |= _descendants(p.pid)
        before = time.monotonic()
        if how == "ctrl-c":
            os.killpg(p.pid, signal.SIGINT)          # what a terminal does: every process of its group
        else:
            p.send_signal(signal.SIGTERM)            # the command alone
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - before
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    signum = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    assert p.returncode == 128 + signum, out + err
    assert err.splitlines()[-1] == f"conformance: stopped by signal {signum}; the remaining backends were not run", err
    assert "Traceback" not in err and "Traceback" not in out, err
    assert took < 30, took
    time.sleep(0.5)
    left = [pid for pid in seen if _alive(pid)]
    assert left == [], [open(f"/proc/{pid}/cmdline").read() for pid in left]
    assert leaked_segments(set(os.listdir("/dev/shm")) - segments) & segments == set()
    assert sorted(str(f.relative_to(tmp)) for f in tmp.rglob("*")) == []
    print(f"{framework} {how}: stopped in {took:.1f} s", file=sys.stderr)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_the_first_torch_run_compiles_before_its_clock_and_stops_cleanly_while_compiling(tmp_path: Path) -> None:
    """On a machine without the extension's build, `--framework torch` compiles it first, saying
    what it compiles (before, the compile ran inside the job's deadline, silently, and outlived a
    stopped run); SIGTERM while it compiles ends the command in one line, with no compiler left
    running and no file left in the build's cache but its lock."""
    pytest.importorskip("torch")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    env.update(ANYCHIP_TORCH_CACHE=str(cache), ANYCHIP_LOG_LEVEL="ERROR")
    p = subprocess.Popen([sys.executable, "-m", "anychip", "conformance", "--framework", "torch", "-n", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    seen: set[int] = set()
    compilers: list[int] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and p.poll() is None and not compilers:
            seen |= _descendants(p.pid)
            compilers = [pid for pid in seen if _alive(pid) and str(cache) in _cmdline(pid)
                         and " -c " in _cmdline(pid)]
            time.sleep(0.1)
        assert compilers, f"no compile started: {p.poll()}"
        time.sleep(1)                                 # the compilers proper (cc1plus) start
        seen |= _descendants(p.pid)
        assert any("cc1plus" in _cmdline(pid) for pid in seen), [_cmdline(pid) for pid in seen]
        assert not any("torch_worker.py" in _cmdline(pid) for pid in seen)     # no job yet: its clock waits
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 143, out + err
    lines = err.splitlines()
    units = sorted(p.name for p in (ROOT / "csrc" / "torch").glob("*.cpp"))
    said = re.match(r"conformance --framework torch: compiling anychip's PyTorch device extension "
                    r"\(([\w., ]+): (\d+) C\+\+ sources, ", lines[0])
    assert said and sorted(said[1].split(", ")) == units and int(said[2]) == len(units), err
    assert f" at a time, then a link) against torch {__import__('torch').__version__} into {cache}/" in lines[0]
    assert lines[-1] == "conformance: stopped by signal 15; the remaining backends were not run", err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert [_cmdline(pid) for pid in seen if _alive(pid)] == []
    assert [str(f.relative_to(cache)) for f in cache.rglob("*") if f.is_file() and f.name != "lock"] == []
