"""Ops through plugin.h's kernel table (minor 1) against the paths they replace, each pair in
the same run:

    python benchmarks/bench_kernel_table.py [--parts plugin,torch] [--before DEVICE_CPP]

plugin  anychip.tensor ops on a C plugin device, the scaffold (`anychip plugin new`) compiled
        twice: as generated (its kernel table: host loops run by the stream workers) and with
        the table left unset (the tensor layer's host fallback: device to host, NumPy, host to
        device); both loaded in this process, each op the best of 5 rounds until the device is
        done, in us.
torch   torch's add on the simulated Ascend (anychip.torch): this build (the table's binary
        entry, through the chip's plugin.h face) against --before, another build of
        src/anychip/torch/device.cpp, e.g. the one that called the simulator's
        anychip_simk_elementwise directly:
            git show c476af8:csrc/include/anychip/torch/device.cpp > /tmp/before.cpp
        each in its own process (PyTorch has one PrivateUse1 device per process).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _best(fn: Callable[[], Any], sync: Callable[[], None], number: int, repeat: int = 5) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _build(root: Path, name: str, table: bool) -> str:
    from anychip.scaffold import new_plugin

    project = new_plugin(name, "c", root)
    src = project / "src" / f"{name}.c"
    if not table:
        text = src.read_text()
        assert "    p->kernels = &KERNELS;\n" in text
        src.write_text(text.replace("    p->kernels = &KERNELS;\n", ""))
    lib = project / f"lib{name}.so"
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([cc, "-O2", "-std=gnu11", "-fvisibility=hidden", "-fPIC", f"-I{project / 'include'}", "-shared",
                    "-o", str(lib), str(src), "-lpthread", "-lm"], check=True)
    return str(lib)


def part_plugin() -> None:
    import anychip
    from anychip.chips import cplugin
    from anychip.runtime import registry

    with tempfile.TemporaryDirectory() as tmp:
        devices = {}
        for name, table in (("bktable", True), ("bkhost", False)):
            _, loader = cplugin.probe(_build(Path(tmp), name, table))
            plugin = loader()
            registry.register_plugin(plugin, source="bench_kernel_table")
            devices[name] = anychip.device(f"{name}:0")
        rng = np.random.default_rng(0)
        print("\nplugin: anychip.tensor ops on the scaffolded C plugin, us (best of 5, until the device is done)")
        print(f"{'op':<30}{'kernel table':>14}{'host fallback':>15}{'ratio':>8}")
        cases: list[tuple[str, tuple[int, ...], Callable[[Any], Any], Callable[[Any], Any]]] = [
            ("add, 1,024 float32", (1024,), lambda x: x + x, lambda x: x + x),
            ("add, 65,536 float32", (1 << 16,), lambda x: x + x, lambda x: x + x),
            ("add, 1M float32", (1 << 20,), lambda x: x + x, lambda x: x + x),
            ("relu, 1,024 float32", (1024,), lambda x: x.relu(), lambda x: np.maximum(x, 0)),
            ("sum, 1,024 float32", (1024,), lambda x: x.sum(), lambda x: x.sum()),
            ("matmul 16 x 16 float32", (16, 16), lambda x: x @ x, lambda x: x @ x),
            ("matmul 32 x 32 float32", (32, 32), lambda x: x @ x, lambda x: x @ x),
            ("matmul 64 x 64 float32", (64, 64), lambda x: x @ x, lambda x: x @ x),
        ]
        launches = devices["bktable"].plugin.kernels.launches
        for label, shape, fn, ref in cases:
            host = rng.standard_normal(shape).astype(np.float32)
            times = []
            for name in ("bktable", "bkhost"):
                dev = devices[name]
                x = anychip.tensor(host, device=dev)
                n = 200 if x.size <= 4096 else 10
                times.append(_best(lambda fn=fn, x=x: fn(x), dev.synchronize, n))
                assert np.allclose(fn(x).numpy(), ref(host), rtol=1e-4, atol=1e-4), label
            print(f"{label:<30}{times[0] * 1e6:>14.1f}{times[1] * 1e6:>15.1f}{times[1] / times[0]:>8.2f}")
        assert launches["binary"] and launches["gemm"]          # (the table ran them)
        for name in devices:
            devices[name].synchronize()
            registry.unregister_plugin(name)
    print("ratio = host fallback / kernel table (> 1: the table is faster)")


TORCH_ADD = textwrap.dedent(r"""
    import json, sys, time
    if len(sys.argv) > 1:                  # another build's device.cpp: its extension, bound as this build's
        import importlib.util, types
        from pathlib import Path
        import anychip
        path = Path(anychip.__file__).parent / "torch" / "_build.py"
        spec = importlib.util.spec_from_file_location("anychip.torch._bench_build", path)
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        real.source = lambda: Path(sys.argv[1])
        class Before:                      # (the earlier _init took no kernel setting: it read the variable)
            def __init__(self, module):
                self.module = module
            def __getattr__(self, name):
                return getattr(self.module, name)
            def _init(self, *args):
                return self.module._init(*args[:8])
        stub = types.ModuleType("anychip.torch._build")
        stub.load_extension = lambda verbose=False: Before(real.load_extension())
        sys.modules["anychip.torch._build"] = stub
    import torch, anychip.torch as at
    out = {}
    for n in (1024, 1 << 16, 1 << 20):
        x = torch.randn(n).to("anychip")
        number = 200 if n <= 4096 else 20
        before = at._C.kernel_launches()[0]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(number):
                y = x + x
            at.synchronize()
            best = min(best, (time.perf_counter() - t0) / number)
        assert at._C.kernel_launches()[0] >= before + 5 * number      # the chip's kernel ran them
        assert y.cpu().equal(x.cpu() * 2)
        out[n] = best
    out["by entry"] = len(at._C.kernel_launches()) > 2      # (this build counts launches by table entry)
    print("RESULT " + json.dumps(out))
""")


def _torch_add(before: str | None) -> dict[str, Any]:
    env = {**os.environ, "ANYCHIP_TORCH": "ascend"}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    argv = ["-c", TORCH_ADD] + ([before] if before else [])
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the torch add child failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = dict(json.loads(line[len("RESULT "):]))
    assert out.pop("by entry") is (before is None), "the --before build did not load"
    return out


def part_torch(before: str | None, repeat: int) -> None:
    print("\ntorch: torch add on anychip:0 (simulated Ascend), float32, us per op (best of 5, until done; "
          f"best of {repeat} processes each)")
    runs = {"table": [], "before": []}
    for _ in range(repeat):            # interleaved, so that the machine's load falls on both alike
        runs["table"].append(_torch_add(None))
        if before:
            runs["before"].append(_torch_add(before))
    print(f"{'elements':>10}{'this build (table)':>20}" + (f"{'before':>12}{'before / this':>15}" if before else ""))
    for n in runs["table"][0]:
        t = min(r[n] for r in runs["table"])
        line = f"{int(n):>10,}{t * 1e6:>20.2f}"
        if before:
            b = min(r[n] for r in runs["before"])
            line += f"{b * 1e6:>12.2f}{b / t:>15.2f}"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="plugin,torch")
    ap.add_argument("--before", help="another build's src/anychip/torch/device.cpp, measured in the same run")
    ap.add_argument("--repeat", type=int, default=3, help="torch processes of each build")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if "plugin" in parts:
        part_plugin()
    if "torch" in parts:
        part_torch(args.before, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
