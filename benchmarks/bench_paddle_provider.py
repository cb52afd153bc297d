"""PaddlePaddle on anychip's simulated Ascend (the Paddle provider, docs/paddle.md), each
figure against its peer in the same run:

    python benchmarks/bench_paddle_provider.py [--parts ops,cplugin,lm,fence,allreduce]

ops        time per eager op and per AdamW training step of an MLP on anychip_ascend:0 with
           the device's kernels, on the same chip without them (ANYCHIP_PADDLE_KERNELS=0:
           Paddle's CPU kernel between a D2H and an H2D copy through the bridge), and on
           Paddle's CPU place, each in a process of its own;
cplugin    the same on a C plugin from `anychip plugin new` (its host-loop kernel table),
           built here with make and `anychip plugin paddle`: with its kernels, without them
           (ANYCHIP_PADDLE_KERNELS=0), and Paddle's CPU place;
lm         a 2-layer TransformerEncoder LM (vocabulary 1000, width 128, 4 heads, batch 8 x 32
           tokens) trained 20 AdamW steps, eager and with paddle.jit.to_static, on the simulated
           Ascend and on a scaffolded C plugin, each against Paddle's CPU place in the same
           process, their steps alternating: the losses' max relative difference, the median
           step time (loss read back) and the median process CPU time a step (all threads);
           then the same program under Paddle's launcher (1 rank, and 2 ranks with
           DataParallel, both ranks on the same batches), against Paddle's CPU place there;
lm-plain   the lm part's plain-script runs only (no launcher), --repeat times;
lm-accuracy the lm part's model, eager, 20 steps, on 5 seeds (weights and batches) and with
           ReLU (the default) or GELU in its feed-forward layers: each place's losses against
           the same program in float64 on Paddle's CPU place (max relative difference); the
           places: the simulated Ascend, the scaffolded plugin, and Paddle's CPU place in
           float32 with its default threads and with OMP_NUM_THREADS=2 (MKL's SGEMM on 2
           threads), each in a process of its own;
fence      the bridge's synchronous-copy fence, timed in C through the bridge's own
           entry points: a 4-byte D2H copy with nothing pending, after async work on one
           stream (the fence synchronizes it), and after a whole-device synchronize (the
           costlier fence the bridge avoids);
allreduce  float32 all_reduce on 2 ranks: paddle.distributed under Paddle's launcher
           through the bridge (HCCL of the simulator) against anychip's own collectives API
           on the same chip (`anychip launch`, native transport = the same HCCL); busbw with
           nccl-tests' factor 2(n-1)/n. Paddle's job also times its use_calc_stream=True form
           (no collective stream, no events) and, for both, the host's time per call; anychip's
           job also times Paddle's default pattern through its own API ("2-stream": a second
           stream for the collective, an event each way per call).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = [1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26]


def _env(**extra: str) -> dict[str, str]:
    from anychip.paddle_provider import simulator_bridge
    bridge = simulator_bridge()
    if bridge is None:
        raise SystemExit("anychip was built without the Paddle bridge")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env.setdefault("CUSTOM_DEVICE_ROOT", str(bridge.parent))
    env["GLOG_minloglevel"] = "2"
    env.update(extra)
    return env


def _best(fn, repeat: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


OPS = ("add", "matmul", "relu")
MODELS = ((32, 64), (1024, 64))


def _time_ops_and_steps(dev: str) -> dict[str, float]:
    """Seconds per eager op and per AdamW step on `dev` (this process's Paddle)."""
    import paddle
    paddle.set_device(dev)
    out: dict[str, float] = {}
    for n in (1 << 10, 1 << 20):
        for name in OPS:
            side = int(round(n ** 0.5))
            a = paddle.to_tensor(np.ones((side, side) if name == "matmul" else n, np.float32))
            op = {"add": lambda a: a + a, "matmul": lambda a: paddle.matmul(a, a),
                  "relu": paddle.nn.functional.relu}[name]
            op(a)
            small = n <= 1 << 10
            number, t = (200 if small else 3), float("inf")
            for _ in range(5 if small else 2):         # the best round, each ending when the device is done
                t0 = time.perf_counter()
                for _ in range(number):
                    op(a)
                if dev != "cpu":
                    paddle.device.synchronize()
                t = min(t, (time.perf_counter() - t0) / number)
            out[f"{name} {n}"] = t
    for width, batch in MODELS:
        paddle.seed(1)
        model = paddle.nn.Sequential(paddle.nn.Linear(width, width), paddle.nn.ReLU(), paddle.nn.Linear(width, 4))
        opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
        x = paddle.to_tensor(np.random.RandomState(0).randn(batch, width).astype("float32"))
        target = paddle.to_tensor(np.zeros((batch, 4), np.float32))

        def step(model=model, opt=opt, x=x, target=target) -> None:
            loss = paddle.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            opt.clear_grad()
            float(loss.numpy())            # the loss read back: the step is complete
        step()
        out[f"step {width}"] = _best(step, 3, 10 if width <= 32 else 3)
    return out


def _child(mode: str, device: str = "anychip_ascend:0", root: str | None = None) -> dict[str, float]:
    """The timings of one mode in a process of its own: the device's kernels (`device`, its bridge
    in `root`), the same device with no kernels registered (ANYCHIP_PADDLE_KERNELS=0: Paddle's CPU
    fallback), or Paddle's CPU place."""
    env = _env(**({"ANYCHIP_PADDLE_KERNELS": "0"} if mode == "fallback" else {}),
               **({"CUSTOM_DEVICE_ROOT": root} if root else {}))
    r = subprocess.run([sys.executable, __file__, "--child", "cpu" if mode == "cpu" else device],
                       env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def part_ops_and_steps(device: str = "anychip_ascend:0", root: str | None = None) -> None:
    rows = {mode: _child(mode, device, root) for mode in ("kernels", "fallback", "cpu")}
    k, f, c = rows["kernels"], rows["fallback"], rows["cpu"]
    print(f"ops: time per eager op, us (best of 5 x 200; of 2 x 3 for 1M elements); {device} with "
          "its kernels, the same without them (Paddle's CPU fallback), Paddle's CPU place")
    print(f"{'op':<22}{'kernels':>12}{'fallback':>12}{'cpu':>10}")
    for n in (1 << 10, 1 << 20):
        for name in OPS:
            key = f"{name} {n}"
            label = f"{name} {n:,} el." if name != "matmul" else f"matmul {int(n ** 0.5)}^2"
            print(f"{label:<22}{k[key] * 1e6:>12.1f}{f[key] * 1e6:>12.1f}{c[key] * 1e6:>10.1f}")
    print("\nstep: one AdamW training step (forward, backward, update, loss read back), ms (best of 3)")
    print(f"{'model':<26}{'kernels':>12}{'fallback':>12}{'cpu':>10}")
    for width, batch in MODELS:
        key = f"step {width}"
        print(f"{f'MLP {width}-{width}-4, batch {batch}':<26}{k[key] * 1e3:>12.2f}{f[key] * 1e3:>12.2f}"
              f"{c[key] * 1e3:>10.2f}")


def _scaffold_bridge(tmp: str) -> str:
    """Scaffold the C plugin `mychip` in tmp (`anychip plugin new`), build it, and compile its Paddle
    bridge; returns the CUSTOM_DEVICE_ROOT that holds the bridge."""
    anychip = [sys.executable, "-m", "anychip"]
    subprocess.run([*anychip, "plugin", "new", "mychip", "--dir", tmp], check=True, capture_output=True)
    subprocess.run(["make", "-s", "-C", os.path.join(tmp, "mychip")], check=True, capture_output=True)
    root = os.path.join(tmp, "paddle")
    subprocess.run([*anychip, "plugin", "paddle", os.path.join(tmp, "mychip", "libmychip.so"), "--dest", root],
                   check=True, capture_output=True)
    return root


def part_cplugin() -> None:
    """part_ops_and_steps on a scaffolded C plugin (`anychip plugin new`, its host-loop kernel table)."""
    with tempfile.TemporaryDirectory(prefix="bench-cplugin-") as tmp:
        root = _scaffold_bridge(tmp)
        print("\n(a C plugin: `anychip plugin new mychip`, its host-loop kernel table)")
        part_ops_and_steps("anychip_mychip:0", root)


#: the LM of the lm parts (its feed-forward activation an argument), shared by their scripts
LM_MODEL = r"""
import paddle
vocab, d = 1000, 128


class LM(paddle.nn.Layer):
    def __init__(self, act="relu"):
        super().__init__()
        self.emb = paddle.nn.Embedding(vocab, d)
        layer = paddle.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, activation=act)
        self.enc = paddle.nn.TransformerEncoder(layer, 2)
        self.out = paddle.nn.Linear(d, vocab)

    def forward(self, ids):
        return self.out(self.enc(self.emb(ids)))
"""

LM_SCRIPT = LM_MODEL + r"""
import json, os, sys, time, numpy as np
devices, modes, steps = sys.argv[1].split(","), sys.argv[2].split(","), int(sys.argv[3])
ranks = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
if ranks > 1:
    import paddle.distributed as dist
    paddle.set_device(devices[0])
    dist.init_parallel_env()

data = np.random.default_rng(0).integers(0, vocab, (steps, 8, 33))
COUNTED = ("h2d_staged", "h2d_direct", "d2h_enqueued", "d2h_direct", "sync_copy", "synchronize_stream",
           "record_event", "stream_wait_event")


def bridge_calls():                       # the bridge's counters in this process, {} when it has none
    import ctypes
    path = next((line.split()[-1] for line in open("/proc/self/maps") if "libanychip_" in line), None)
    if path is None:
        return {}
    fn = getattr(ctypes.CDLL(path), "anychip_paddle_calls", None)
    if fn is None:
        return {}
    fn.restype, fn.argtypes = ctypes.c_ulonglong, [ctypes.c_char_p]
    return {k: fn(k.encode()) for k in COUNTED}


def trainer(place, mode):             # a fresh LM on `place`; each call: one step's (loss, wall s, CPU s)
    paddle.set_device(place)
    paddle.seed(0)
    model = LM()
    opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    net = paddle.DataParallel(model) if ranks > 1 else model

    def loss_of(x, y):
        return paddle.nn.functional.cross_entropy(net(x).reshape([-1, vocab]), y.reshape([-1]))

    step = paddle.jit.to_static(loss_of, full_graph=True) if mode == "to_static" else loss_of

    def one(i):
        paddle.set_device(place)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step(paddle.to_tensor(data[i, :, :-1]), paddle.to_tensor(data[i, :, 1:]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        value = float(loss)
        return value, time.perf_counter() - t0, time.process_time() - c0
    return one


out = {}
for mode in modes:            # the places' steps alternate, so that the machine's load falls on each alike
    steppers = {place: trainer(place, mode) for place in devices}
    runs = {place: [] for place in devices}
    for i in range(steps):
        if i == 2:
            calls = bridge_calls()
        for place in devices:
            runs[place].append(steppers[place](i))
    after = bridge_calls()
    per_step = {k: (after[k] - calls[k]) / (steps - 2) for k in after}
    for place, rows in runs.items():
        losses, times, cpu_times = zip(*rows)
        out[f"{place} {mode}"] = {"losses": list(losses), "step": float(np.median(times[2:])),
                                  "cpu": float(np.median(cpu_times[2:])),
                                  "calls": per_step if place != "cpu" else {}}
if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""


LM_ACCURACY_SCRIPT = LM_MODEL + r"""
import json, sys, numpy as np
places, act, seed, steps = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = np.random.default_rng(seed).integers(0, vocab, (steps, 8, 33))
out = {}
for place in places:
    paddle.set_device(place.split("/")[0])
    paddle.set_default_dtype("float64" if place.endswith("/float64") else "float32")
    paddle.seed(seed)
    model = LM(act)
    paddle.set_default_dtype("float32")
    opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    losses = []
    for i in range(steps):
        x, y = paddle.to_tensor(data[i, :, :-1]), paddle.to_tensor(data[i, :, 1:])
        loss = paddle.nn.functional.cross_entropy(model(x).reshape([-1, vocab]), y.reshape([-1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    out[place] = losses
print("RESULT " + json.dumps(out), flush=True)
"""


def part_lm_accuracy(steps: int = 20, seeds: int = 5) -> None:
    """The LM's losses against float64 on Paddle's CPU place, per seed and activation (lm-accuracy)."""
    with tempfile.TemporaryDirectory(prefix="bench-lm-accuracy-") as tmp:
        plugin_root = _scaffold_bridge(tmp)
        script = Path(tmp) / "lm_accuracy.py"
        script.write_text(LM_ACCURACY_SCRIPT)
        jobs = (("anychip_ascend:0,cpu,cpu/float64", {}), ("anychip_mychip:0", {"CUSTOM_DEVICE_ROOT": plugin_root}),
                ("cpu", {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}))
        names = {"anychip_ascend:0": "Ascend", "anychip_mychip:0": "C plugin", "cpu": "CPU",
                 "cpu 2 threads": "CPU, 2 threads"}
        print(f"\nlm-accuracy: the lm part's model, eager, {steps} AdamW steps; each cell: the losses' max relative "
              "difference from the same program in float64 on Paddle's CPU place")
        print(f"{'activation':<12}{'seed':>5}" + "".join(f"{n:>16}" for n in names.values()))
        for act in ("relu", "gelu"):
            for seed in range(seeds):
                res: dict[str, list[float]] = {}
                for places, extra in jobs:
                    r = subprocess.run([sys.executable, str(script), places, act, str(seed), str(steps)],
                                       env=_env(**extra), cwd=tmp, capture_output=True, text=True, check=True)
                    got = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
                    res.update({"cpu 2 threads": got["cpu"]} if extra.get("OMP_NUM_THREADS") else got)
                want = res["cpu/float64"]
                print(f"{act:<12}{seed:>5}" + "".join(f"{_lm_rel(res[k], want):>16.1e}" for k in names))


def _lm_rel(got: list[float], want: list[float]) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float((np.abs(g - w) / np.abs(w)).max())


def part_lm(steps: int = 20, launcher: bool = True, repeat: int = 1) -> None:
    """The Transformer LM on the simulated Ascend and a scaffolded C plugin, as a plain script
    (`repeat` times) and under Paddle's launcher, each against Paddle's CPU place in the same
    process."""
    with tempfile.TemporaryDirectory(prefix="bench-lm-") as tmp:
        plugin_root = _scaffold_bridge(tmp)
        script = Path(tmp) / "lm.py"
        script.write_text(LM_SCRIPT)
        targets = (("anychip_ascend:0", None), ("anychip_mychip:0", plugin_root))
        print(f"\nlm: a 2-layer TransformerEncoder LM (vocabulary 1000, width 128, batch 8 x 32), {steps} AdamW "
              "steps; loss rel = the losses' max relative difference from Paddle's CPU place in the same "
              "process, the steps alternating; step = median ms per step (loss read back), cpu = Paddle's CPU "
              "place there; CPU time = the ratio of the process CPU time a step (all threads); load = the "
              "1-minute load average at the run's start")
        print(f"{'device':<18}{'how':<22}{'mode':<11}{'loss rel':>10}{'step ms':>9}{'cpu ms':>8}{'ratio':>7}"
              f"{'CPU time':>10}{'load':>6}")
        for device, root in targets:
            env = _env(**({"CUSTOM_DEVICE_ROOT": root} if root else {}))
            runs: list[tuple[str, dict]] = []
            loads: dict[str, float] = {}
            for i in range(repeat):
                how = "plain script" + (f" {i + 1}" if repeat > 1 else "")
                loads[how] = os.getloadavg()[0]
                r = subprocess.run([sys.executable, str(script), f"{device},cpu", "eager,to_static", str(steps)],
                                   env=env, cwd=tmp, capture_output=True, text=True, check=True)
                runs.append((how, _result(r.stdout)))
            for ranks in (1, 2) if launcher else ():
                logs = Path(tmp) / f"logs-{device}-{ranks}"
                kind = device.split(":")[0]          # the launcher selects each rank's device
                places = kind + (",cpu" if ranks == 1 else "")
                subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(logs),
                                "--devices", ",".join(str(i) for i in range(ranks)), str(script), places,
                                "eager", str(steps)], env=env, cwd=tmp, capture_output=True, check=True)
                how = f"launcher, {ranks} rank{'s' if ranks > 1 else ''}"
                loads[how] = os.getloadavg()[0]
                runs.append((how, _result((logs / "workerlog.0").read_text())))
            cpu_plain = runs[0][1]
            device_runs = [res[k]["losses"] for _, res in runs for k in res if k.startswith("anychip")
                           and k.endswith(" eager")]
            print(f"{device:<18}the device's eager losses equal bit for bit in all {len(device_runs)} runs: "
                  f"{all(r == device_runs[0] for r in device_runs)}"
                  + (f"; Paddle-CPU against itself (the launcher's 1 thread, the plain script's default threads): "
                     f"{_lm_rel(runs[-2][1]['cpu eager']['losses'], cpu_plain['cpu eager']['losses']):.2e}"
                     if launcher else ""))
            for mode in ("eager", "to_static"):
                calls = cpu_plain[f"{device} {mode}"].get("calls")
                if calls:
                    print(f"{device:<18}{mode} step, the bridge's calls per step: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in calls.items()))
            for how, res in runs:
                for mode in ("eager", "to_static"):
                    key = next((k for k in res if k.startswith("anychip") and k.endswith(f" {mode}")), None)
                    if key is None:
                        continue
                    cpu = res.get(f"cpu {mode}") or cpu_plain[f"cpu {mode}"]
                    print(f"{device:<18}{how:<22}{mode:<11}{_lm_rel(res[key]['losses'], cpu['losses']):>10.2e}"
                          f"{res[key]['step'] * 1e3:>9.1f}{cpu['step'] * 1e3:>8.1f}"
                          f"{res[key]['step'] / cpu['step']:>7.2f}{res[key]['cpu'] / cpu['cpu']:>10.2f}"
                          f"{loads[how]:>6.1f}")


FENCE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "anychip/paddle/device_ext.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static struct C_DeviceInterface i;
static struct C_Device_st dev;
static C_Stream s;
static void *d, *d2;
static char host[4];
/* case 0: copy alone (the fence finds nothing pending); 1: a device synchronize before each
 * copy (the draining fence); 2: an async 4-byte D2D first (the fence synchronizes its stream) */
static double run(int which, int n) {
    double t0 = now();
    for (int k = 0; k < n; k++) {
        if (which == 2) i.async_memory_copy_d2d(&dev, s, d2, d, 4);
        if (which == 1) i.synchronize_device(&dev);
        i.memory_copy_d2h(&dev, host, d, 4);
    }
    return (now() - t0) / n;
}
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*init)(struct CustomRuntimeParams *) = (void (*)(struct CustomRuntimeParams *))dlsym(lib, "InitPlugin");
    struct CustomRuntimeParams p = {0};
    p.size = sizeof p; i.size = sizeof i; p.interface = &i;
    init(&p);
    if (!p.device_type) return 2;
    i.init_device(&dev);
    i.create_stream(&dev, &s);
    i.device_memory_allocate(&dev, &d, 1 << 20); i.device_memory_allocate(&dev, &d2, 1 << 20);
    int n = atoi(argv[2]);
    double best[3] = {1e9, 1e9, 1e9};
    for (int round = 0; round < 5; round++)
        for (int which = 0; which < 3; which++) {
            double t = run(which, n);
            if (t < best[which]) best[which] = t;
        }
    printf("%g %g %g\n", best[0], best[1], best[2]);
    return 0;
}
"""


def part_fence() -> None:
    from anychip._data import get_include
    from anychip.paddle_provider import simulator_bridge
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fence.c", Path(tmp) / "fence"
        src.write_text(FENCE_C)
        subprocess.run(["cc", "-O2", "-std=gnu11", f"-I{get_include()}", str(src), "-o", str(exe), "-ldl"],
                       check=True)
        out = subprocess.run([str(exe), str(simulator_bridge()), "2000"], env=_env(), capture_output=True,
                             text=True, check=True).stdout.split()
    idle, drained, pending = (float(x) for x in out)
    print("\nfence: a 4-byte synchronous D2H copy through the bridge, us (best of 5 x 2000)")
    print(f"  nothing pending: the fence walks the stream list               {idle * 1e6:8.2f}")
    print(f"  the same copy after a device synchronize (a draining fence)     {drained * 1e6:8.2f}")
    print(f"  after an async 4-byte D2D: the fence synchronizes that stream  {pending * 1e6:8.2f}")


PADDLE_AR = r"""
import json, sys, time, numpy as np, paddle, paddle.distributed as dist
from paddle.distributed import stream
dist.init_parallel_env()
r, n = dist.get_rank(), dist.get_world_size()
out = {}
for size in json.loads(sys.argv[1]):
    for mode in ("comm", "calc"):            # Paddle's default (its collective stream), and use_calc_stream=True
        x = paddle.to_tensor(np.full(size // 4, r + 1, np.float32))
        iters = max(5, min(200, (1 << 26) // size))
        if mode == "comm":
            op = lambda: dist.all_reduce(x)
        else:
            op = lambda: stream.all_reduce(x, sync_op=True, use_calc_stream=True)
        for _ in range(3):
            op()
        paddle.device.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        th = time.perf_counter()
        paddle.device.synchronize()
        t = paddle.to_tensor(np.array([(time.perf_counter() - t0) / iters, (th - t0) / iters], np.float64))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        total, host = (float(v) for v in t.numpy())
        out[size if mode == "comm" else f"calc {size}"] = total
        out[f"host {size}" if mode == "comm" else f"calc host {size}"] = host
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""

ANYCHIP_AR = r"""
import json, sys, time, numpy as np
import anychip
from anychip import collectives
comm = collectives.init()
dev = comm.device
stream = dev.current_stream()
side = anychip.Stream(dev)                   # a collective stream, as Paddle's process group has
out = {}
for size in json.loads(sys.argv[1]):
    count = size // 4
    send = dev.alloc(size).copy_from(np.full(count, comm.rank + 1, np.float32))
    recv = dev.alloc(size)
    iters = max(5, min(200, (1 << 26) // size))
    for _ in range(3):
        comm.all_reduce(send, recv, count).wait()
    comm.barrier().wait()
    t0 = time.perf_counter()
    for _ in range(iters):
        last = comm.all_reduce(send, recv, count)
    last.wait()
    stream.synchronize()
    out[size] = max(comm.exchange((time.perf_counter() - t0) / iters))
    # Paddle's default pattern through anychip's API: the collective stream waits for the compute
    # stream, the collective runs there, the compute stream waits for it
    comm.barrier().wait()
    t0 = time.perf_counter()
    for _ in range(iters):
        side.wait_event(stream.record_event())
        comm.all_reduce(send, recv, count, stream=side)
        stream.wait_event(side.record_event())
    stream.synchronize()
    out[f"two {size}"] = max(comm.exchange((time.perf_counter() - t0) / iters))
if comm.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
comm.destroy()
"""


def _result(text: str) -> dict[int | str, float]:
    """The RESULT line of rank 0 (`anychip launch` prefixes each line with "[rank] ")."""
    for line in text.splitlines():
        line = line[4:] if line.startswith("[0] ") else line
        if line.startswith("RESULT "):
            return {int(k) if k.isdigit() else k: v for k, v in json.loads(line[7:]).items()}
    raise SystemExit(f"no RESULT line in the job's output:\n{text[-3000:]}")


def part_allreduce(repeat: int, before: str | None) -> None:
    """Paddle's all_reduce through the bridge against anychip's API, rounds interleaved; with
    `before` (a paddle_custom_device directory of another build, its src/anychip/_lib beside it as
    an installed tree has it) that build's Paddle job runs in each round too."""
    sizes = json.dumps(SIZES)
    roots = {"paddle": None, **({"before": before} if before else {})}
    best: dict[str, dict[int | str, float]] = {name: {} for name in (*roots, "anychip")}
    with tempfile.TemporaryDirectory() as tmp:
        pscript, ascript = Path(tmp) / "paddle_ar.py", Path(tmp) / "anychip_ar.py"
        pscript.write_text(PADDLE_AR)
        ascript.write_text(ANYCHIP_AR)
        for i in range(repeat):
            for name, root in roots.items():
                logs = Path(tmp) / f"logs-{name}-{i}"      # a directory per job: the launcher appends
                env = _env(**({"CUSTOM_DEVICE_ROOT": root} if root else {}))
                subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(logs),
                                "--devices", "0,1", str(pscript), sizes], env=env, cwd=tmp, capture_output=True,
                               check=True)
                for k, v in _result((logs / "workerlog.0").read_text()).items():
                    best[name][k] = min(v, best[name].get(k, v))
            r = subprocess.run([sys.executable, "-m", "anychip", "launch", "-n", "2", "--device", "ascend",
                                               str(ascript), sizes], env=_env(ANYCHIP_COLLECTIVE_TRANSPORT="native"),
                               capture_output=True, text=True, check=True)
            for k, v in _result(r.stdout).items():
                best["anychip"][k] = min(v, best["anychip"].get(k, v))
    print(f"\nallreduce: float32, 2 ranks on the simulated Ascend (HCCL), best of {repeat}; busbw GB/s "
          "(2(n-1)/n = 1); ratio = Paddle's busbw / anychip's; host = the loop's time before its final "
          "synchronize, per call")
    head = f"{'size':>8}{'paddle us':>12}{'busbw':>8}{'ratio':>7}{'host us':>9}"
    if before:
        head += f"{'before us':>12}{'busbw':>8}{'ratio':>7}{'host us':>9}"
    print(head + f"{'calc-stream us':>16}{'host us':>9}{'anychip us':>12}{'busbw':>8}{'2-stream us':>14}")
    for s in SIZES:
        a = best["anychip"][s]
        row = f"{s:>8}"
        for name in roots:
            p = best[name][s]
            row += f"{p * 1e6:>12.1f}{s / p / 1e9:>8.2f}{a / p:>7.2f}{best[name][f'host {s}'] * 1e6:>9.1f}"
        calc, calc_host = best["paddle"][f"calc {s}"], best["paddle"][f"calc host {s}"]
        two = best["anychip"][f"two {s}"]
        print(row + f"{calc * 1e6:>16.1f}{calc_host * 1e6:>9.1f}{a * 1e6:>12.1f}{s / a / 1e9:>8.2f}"
              f"{two * 1e6:>14.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="ops,cplugin,lm,fence,allreduce")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=2, help="rounds of the all_reduce jobs (the best is kept); "
                    "plain-script runs of lm-plain")
    ap.add_argument("--before", metavar="DIR", help="also time Paddle's all_reduce with the bridge in DIR "
                    "(the paddle_custom_device directory of another build), in the same rounds")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_time_ops_and_steps(args.child)))
        return 0
    parts = args.parts.split(",")
    os.environ.update({k: v for k, v in _env().items() if k in ("CUSTOM_DEVICE_ROOT", "GLOG_minloglevel")})
    if "ops" in parts:
        part_ops_and_steps()
    if "cplugin" in parts:
        part_cplugin()
    if "lm" in parts:
        part_lm()
    if "lm-plain" in parts:
        part_lm(launcher=False, repeat=args.repeat)
    if "lm-accuracy" in parts:
        part_lm_accuracy()
    if "fence" in parts:
        part_fence()
    if "allreduce" in parts:
        part_allreduce(args.repeat, args.before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
