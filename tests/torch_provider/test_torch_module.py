"""torch.anychip as a device module: what torch's own code calls on it (autocast, activation
checkpointing, torch.load's map_location, DeviceMesh, FSDP2, DCP, DTensor), streams and
events as torch's types, the device's own random number generators, and torch's backend
autoload in child processes (docs/torch.md)."""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS  # noqa: E402

import anychip  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


# ---- the device module ---------------------------------------------------------------------------

# what torch's code looks up on a PrivateUse1 device module (torch/utils/backend_registration.py,
# torch/amp, torch/random.py, torch/utils/checkpoint.py, torch/serialization.py, torch/_utils.py,
# torch/distributed/device_mesh.py and fsdp, torch/distributed/tensor/_random.py) and torch.cuda's
# names beside them
NAMES = ("is_available", "is_initialized", "init", "_get_generator", "_lazy_init", "_is_in_bad_fork", "device_count",
         "current_device", "set_device", "device", "device_of", "synchronize", "Stream", "Event", "StreamContext",
         "stream", "set_stream", "current_stream", "default_stream", "get_amp_supported_dtype", "is_bf16_supported",
         "is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype", "get_rng_state",
         "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed", "manual_seed_all", "seed",
         "seed_all", "initial_seed", "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
         "max_memory_reserved", "reset_peak_memory_stats", "empty_cache", "mem_get_info", "memory_summary",
         "get_device_name", "get_device_properties", "get_device_capability")


def test_the_device_module_has_what_torch_calls_on_it(at):
    assert [n for n in NAMES if not callable(getattr(torch.anychip, n, None))] == []
    assert torch.anychip.is_initialized() and torch.anychip._initialized and not torch.anychip._is_in_bad_fork()
    props = torch.anychip.get_device_properties("anychip:1")
    assert props.index == 1 and props.backend == "ascend" and props.simulated
    assert props.name == torch.anychip.get_device_name(1) == anychip.device("ascend:1").properties["name"]
    assert props.total_memory == anychip.device("ascend:1").properties["total_memory"] > 0
    assert torch.anychip.get_device_capability() == (0, 0)       # the simulator reports none
    assert torch.anychip.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    dtypes = torch.accelerator.get_device_capability("anychip:1")["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.complex64, torch.bool, torch.uint64} <= dtypes
    assert not dtypes & {torch.qint8, torch.quint8, torch.qint32}
    with pytest.raises(anychip.InvalidArgumentError, match=r"anychip:99 does not exist: ascend has \d+ device"):
        torch.anychip.get_device_properties(99)


def test_memory_summary_shows_the_allocators_figures(at):
    x = torch.empty(1 << 20, device="anychip:1")
    stats = torch.anychip.memory_stats(1)
    row = next(r for r in torch.anychip.memory_summary(1).splitlines() if r.startswith("allocated_bytes "))
    assert [int(v.replace(",", "")) for v in row.split()[1:]] == [
        stats[f"allocated_bytes.all.{w}"] for w in ("current", "peak", "allocated", "freed")]
    assert stats["allocated_bytes.all.current"] >= x.numel() * 4
    assert torch.anychip.memory_summary(1).splitlines()[0].startswith("anychip:1 (ascend)")


def test_the_device_context_manager_sets_and_restores_the_current_device(at):
    assert torch.anychip.current_device() == 0
    with torch.anychip.device(2):
        assert torch.anychip.current_device() == 2
        assert torch.empty(1, device="anychip").device == torch.device("anychip", 2)
        with torch.anychip.device(None):
            assert torch.anychip.current_device() == 2
        with torch.anychip.device_of(torch.empty(1, device="anychip:1")):
            assert torch.anychip.current_device() == 1
    assert torch.anychip.current_device() == 0


def test_streams_and_events_are_torchs_types(at):
    s = torch.anychip.Stream(priority=-1)            # (what FSDP2 makes)
    assert isinstance(s, torch.Stream) and type(s) is torch.anychip.Stream
    assert s.device == torch.device("anychip", 0) and s != torch.anychip.default_stream()
    assert isinstance(torch.anychip.current_stream(), torch.anychip.Stream)
    e = torch.anychip.Event(enable_timing=True)
    assert isinstance(e, torch.Event) and type(e) is torch.anychip.Event
    x = torch.ones(1 << 18, device="anychip")
    with torch.anychip.stream(s):
        assert torch.anychip.current_stream() == s
        s.wait_stream(torch.anychip.default_stream())
        y = x * 3
        e.record()
    assert torch.anychip.current_stream() == torch.anychip.default_stream()
    torch.anychip.current_stream().wait_event(e)
    assert y[-3:].cpu().tolist() == [3.0, 3.0, 3.0]
    # a new stream of another device: that device current inside, the current device restored
    # after (the later tests' backward passes on anychip:0 read right after it: the stale reads of
    # a device switch are fixed in the plugin.h faces, tests/torch_provider/test_torch_correctness.py)
    s1 = torch.anychip.Stream(device=1)
    with torch.anychip.stream(s1):
        assert torch.anychip.current_device() == 1
        assert torch.anychip.current_stream(1) == s1
        with torch.anychip.stream(s):
            assert torch.anychip.current_device() == 0 and torch.anychip.current_stream(0) == s
        assert torch.anychip.current_device() == 1
    assert torch.anychip.current_device() == 0
    assert torch.anychip.current_stream(0) == torch.anychip.default_stream(0)
    with torch.anychip.stream(None):
        assert torch.anychip.current_stream() == torch.anychip.default_stream()


# ---- autocast -----------------------------------------------------------------------------------------

def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def _autocast_step(net: torch.nn.Module, device: str, dtype: torch.dtype, x, y):
    m = copy.deepcopy(net).to(device)
    with torch.autocast(device.split(":")[0], dtype=dtype):
        out = m(x.to(device))
        loss = torch.nn.functional.cross_entropy(out.float(), y.to(device))
    loss.backward()
    return out, loss, [p.grad for p in m.parameters()]


# the tolerances torch.testing uses for the dtype (relative), on values of order 1
TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_agrees_with_the_cpus_autocast_within_the_dtypes_tolerance(at, dtype):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
    net = _net()
    out_d, loss_d, grads_d = _autocast_step(net, "anychip", dtype, x, y)
    out_c, loss_c, grads_c = _autocast_step(net, "cpu", dtype, x, y)
    assert out_d.dtype == out_c.dtype == dtype                     # the linear layers ran in the dtype
    tol = TOLERANCE[dtype]
    out_diff = (out_d.cpu().float() - out_c.float()).abs().max().item()
    loss_diff = abs(loss_d.item() - loss_c.item())
    grad_diff = max((a.cpu() - b).abs().max().item() / b.abs().max().item()
                    for a, b in zip(grads_d, grads_c, strict=True))
    print(f"autocast {dtype}: output max |diff| {out_diff:.3g}, loss {loss_d.item():.6f} vs {loss_c.item():.6f}, "
          f"gradients max relative diff {grad_diff:.3g}")
    assert out_diff <= 4 * tol * out_c.float().abs().max().item() and loss_diff <= tol * loss_c.item()
    assert grad_diff <= 4 * tol
    # the device's op lists: matmul in the dtype, exp (range) in float32, promotion across dtypes
    a = torch.randn(4, 4, device="anychip")
    with torch.autocast("anychip", dtype=dtype):
        assert torch.anychip.is_autocast_enabled() and torch.anychip.get_autocast_dtype() == dtype
        assert (a @ a).dtype == dtype
        assert torch.exp(a.to(dtype)).dtype == torch.float32
        assert torch.addcmul(a, a.to(dtype), a).dtype == torch.float32
    assert not torch.anychip.is_autocast_enabled()


def test_autocast_refuses_a_dtype_the_device_does_not_take(at):
    with pytest.warns(UserWarning, match="anychip Autocast only supports dtypes of torch.float16, torch.bfloat16"):
        with torch.autocast("anychip", dtype=torch.float64):
            assert not torch.anychip.is_autocast_enabled()


# ---- activation checkpointing, torch.save / torch.load ---------------------------------------------------

@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_replays_dropout_and_autocast_exactly(at, reentrant):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(32, 4)).to("anychip")
    x = torch.randn(8, 16, device="anychip", requires_grad=True)
    results = []
    for checkpointed, seed in ((False, 3), (True, 3), (False, 4)):
        net.zero_grad()
        x.grad = None
        torch.manual_seed(seed)
        with torch.autocast("anychip", dtype=torch.bfloat16):
            out = checkpoint(net, x, use_reentrant=reentrant) if checkpointed else net(x)
        out.float().square().sum().backward()
        results.append([out.cpu(), x.grad.cpu(), *(p.grad.cpu() for p in net.parameters())])
    plain, ckpt, other_seed = results
    assert plain[0].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(plain, ckpt, strict=True))
    assert not torch.equal(plain[1], other_seed[1])        # (the dropout masks are the seed's)


def test_save_and_load_with_map_location(at, tmp_path):
    path = tmp_path / "state.pt"
    w = torch.arange(6.0).reshape(2, 3)
    torch.save({"w": w.to("anychip:1"), "n": torch.tensor([1, 2]).to("anychip:1"), "c": w}, path)
    back = torch.load(path)
    assert back["w"].device == torch.device("anychip", 1) and back["c"].device.type == "cpu"
    moved = torch.load(path, map_location="anychip:0")
    assert moved["w"].device == moved["n"].device == torch.device("anychip", 0)
    assert torch.equal(moved["w"].cpu(), w) and moved["n"].cpu().tolist() == [1, 2]
    assert torch.load(path, map_location="cpu")["w"].device.type == "cpu"
    # a CPU checkpoint of a module loaded onto the device
    net = torch.nn.Linear(3, 2)
    torch.save(net.state_dict(), tmp_path / "net.pt")
    sd = torch.load(tmp_path / "net.pt", map_location=torch.device("anychip", 2))
    assert {t.device for t in sd.values()} == {torch.device("anychip", 2)}
    assert torch.equal(sd["weight"].cpu(), net.weight.detach())
    with pytest.raises(RuntimeError, match=r"on ANYCHIP device 99 but torch.anychip.device_count\(\) is \d+"):
        torch.load(path, map_location="anychip:99")


# ---- the device's generators ---------------------------------------------------------------------------

def _offset(state: torch.Tensor) -> int:
    return int(state[8:].view(torch.int64).item())


def test_device_draws_leave_the_cpus_generator_and_the_other_devices_alone(at):
    torch.manual_seed(0)
    cpu, other = torch.get_rng_state(), torch.anychip.get_rng_state(1)
    a = torch.randn(1000, device="anychip:0")
    b = torch.rand(10, device="anychip:0")
    torch.nn.functional.dropout(torch.ones(7, device="anychip:0"), 0.5)
    assert torch.equal(torch.get_rng_state(), cpu) and torch.equal(torch.anychip.get_rng_state(1), other)
    state = torch.anychip.get_rng_state(0)
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert int(state[:8].view(torch.int64).item()) == 0 == torch.anychip.initial_seed()
    assert _offset(state) == 1000 + 12 + 8                   # each op's elements, rounded up to 4
    assert abs(a.mean().item()) < 0.15 and 0.9 < a.std().item() < 1.1
    assert 0 <= b.min().item() and b.max().item() < 1
    # the same seed and offset on another device give the same values (a function of the two only)
    torch.manual_seed(0)
    assert torch.equal(torch.randn(1000, device="anychip:1").cpu(), a.cpu())
    # the CPU's draws are its own
    torch.manual_seed(0)
    assert not torch.equal(torch.randn(1000), a.cpu())


def test_seeds_and_states_reproduce_the_draws(at):
    def draws() -> list[torch.Tensor]:
        dev = "anychip"
        return [torch.randn(5, device=dev), torch.randint(0, 100, (6,), device=dev), torch.randperm(9, device=dev),
                torch.empty(4, device=dev).exponential_(), torch.multinomial(torch.ones(5, device=dev), 3),
                torch.bernoulli(torch.full((8,), 0.5, device=dev))]

    torch.anychip.manual_seed(7)
    first = draws()
    torch.anychip.manual_seed(7)
    second = draws()
    assert all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(first, second, strict=True))
    assert sorted(first[2].cpu().tolist()) == list(range(9))
    # get / set round trip, and the state torch.random.fork_rng keeps
    state = torch.anychip.get_rng_state()
    x = torch.randn(6, device="anychip")
    torch.anychip.set_rng_state(state)
    assert torch.equal(torch.randn(6, device="anychip").cpu(), x.cpu())
    with torch.random.fork_rng(devices=[0], device_type="anychip"):
        torch.randn(100, device="anychip")
    assert torch.equal(torch.anychip.get_rng_state(), state.clone().view(torch.int64).add_(
        torch.tensor([0, 8])).view(torch.uint8))     # the offset 8 further on (x), the seed as before
    states = torch.anychip.get_rng_state_all()
    torch.anychip.seed_all()
    assert torch.anychip.initial_seed() != 7
    torch.anychip.set_rng_state_all(states)
    assert torch.anychip.get_rng_state_all()[0].tolist() == states[0].tolist()
    with pytest.raises(RuntimeError, match="a contiguous CPU ByteTensor of 16 bytes"):
        torch.anychip.set_rng_state(torch.get_rng_state())


def test_generator_objects_of_the_device(at):
    g = torch.Generator("anychip:1").manual_seed(3)
    assert g.device == torch.device("anychip", 1)
    default = torch.anychip.get_rng_state(1)
    a = torch.randn(4, device="anychip:1", generator=g)
    assert torch.equal(torch.anychip.get_rng_state(1), default)         # the default generator untouched
    assert _offset(g.get_state()) == 4
    g.manual_seed(3)
    assert torch.equal(torch.randn(4, device="anychip:1", generator=g).cpu(), a.cpu())
    clone = g.clone_state()
    assert torch.equal(torch.rand(3, device="anychip:1", generator=g).cpu(),
                       torch.rand(3, device="anychip:1", generator=clone).cpu())
    assert torch.anychip.default_generators[1].device == torch.device("anychip", 1)
    with pytest.raises(RuntimeError, match="Expected a 'anychip' device type for generator but found 'cpu'"):
        torch.randn(3, device="anychip", generator=torch.Generator())


# ---- child processes ---------------------------------------------------------------------------------

def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_TORCH_AUTOLOAD")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=CHILD_SECONDS, cwd=ROOT)


@pytest.mark.slow
def test_import_torch_binds_the_device_only_where_marked(at):
    assert os.environ["ANYCHIP_TORCH_AUTOLOAD"] == "1"        # set for this process's children
    code = "import sys, torch; print('bound', 'anychip.torch' in sys.modules, hasattr(torch, 'anychip'))"
    assert _child(code).stdout.split() == ["bound", "False", "False"]
    marked = _child(code + "; print((torch.ones(2, device='anychip') * 2).cpu().tolist(), torch.anychip.backend())",
                    ANYCHIP_TORCH_AUTOLOAD="1", ANYCHIP_TORCH="kunlun")
    assert marked.stdout.split("\n")[:2] == ["bound True True", "[2.0, 2.0] kunlun"], marked.stderr[-2000:]
    # a device that cannot be set up: `import torch` goes on, saying why
    bad = _child(code, ANYCHIP_TORCH_AUTOLOAD="1", ANYCHIP_TORCH="nosuchchip")
    assert bad.returncode == 0 and bad.stdout.split() == ["bound", "False", "False"], bad.stderr[-2000:]
    assert "RuntimeWarning: anychip: the 'anychip' device could not be set up" in bad.stderr
    assert "ANYCHIP_TORCH=nosuchchip: anychip has no backend 'nosuchchip'" in bad.stderr
    assert _child(code, ANYCHIP_TORCH_AUTOLOAD="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0").stdout.split() == [
        "bound", "False", "False"]


@pytest.mark.timeout(LONG_CHILD_SECONDS)
@pytest.mark.slow
def test_spawned_dataloader_workers_use_the_device_without_importing_anychip(at):
    sys.path.insert(0, str(HERE))
    try:
        from autoload_child import OnTheDevice
        loader = torch.utils.data.DataLoader(OnTheDevice(), batch_size=None, num_workers=1,
                                             multiprocessing_context="spawn")
        got = [(x.tolist(), backend) for x, backend in loader]
    finally:
        sys.path.remove(str(HERE))
    assert got == [([0.0, 0.0, 0.0], "ascend"), ([2.0, 2.0, 2.0], "ascend"), ([4.0, 4.0, 4.0], "ascend")]


# ---- the parallel APIs on 4 ranks ------------------------------------------------------------------------

@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_parallel_stages_on_four_ranks_equal_one_device(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_TORCH_C10D_DIRECT")}
    cmd = [sys.executable, "-m", "anychip", "launch", "-n", "4", "--device", "ascend",
                          str(HERE / "parallel_stages.py"), str(tmp_path / "dcp")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=LONG_CHILD_SECONDS, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert re.findall(r"CHECK \S+ FAIL.*", done.stdout) == []
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith("[0] LOSSES")))
    for r in range(4):
        for stage in ("tensor_parallel", "fsdp2", "fsdp_x_tp"):
            assert f"[{r}] CHECK {stage}.losses ok" in done.stdout, (r, stage)
        for what in ("tp.sharded", "fsdp.sharded", "dcp.load_equals_saved", "dtensor.random_replicas_equal",
                     "dtensor.random_shards_differ", "dtensor.random_values", "dtensor.generators_in_step",
                     "dtensor.random_reproduces", "dtensor.uniform_init"):
            assert f"[{r}] CHECK {what} ok" in done.stdout, (r, what)
        assert f"[{r}] DONE {r} failures=0" in done.stdout
