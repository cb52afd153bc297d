"""The parallel layer: placements, ProcessMesh, shard sizes, reshard plans (in process), and
every reshard transition, sharded matmul and autograd across 2 and 4 rank processes
(tests/parallel/parallel_worker.py checks thousands of cases against NumPy in one launch each), and
examples/auto_parallel.py in small size on the simulated chips and on cpu."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import collectives
from anychip import parallel as dist
from anychip.parallel import Partial, ProcessMesh, Replicate, Shard
from anychip.parallel._plan import plan
from anychip.parallel._sharding import chunk, local_box

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "parallel_worker.py")
OPS_WORKER = os.path.join(HERE, "parallel_ops_worker.py")
EXAMPLE = os.path.join(ROOT, "examples", "auto_parallel.py")


def _launch(n: int, device: str, *args: str, timeout: float = CHILD_SECONDS) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "anychip.cli", "launch", "-n", str(n), "--device", device, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _available(backend: str) -> bool:
    return any(b.name == backend and b.available for b in anychip.backends())


# -- shard sizes and plans -------------------------------------------------------------------

def test_chunks_follow_torch_chunk() -> None:
    # ceil(n / k) per rank; the last ranks' chunks are short or empty
    assert [chunk(5, 4, i) for i in range(4)] == [(0, 2), (2, 2), (4, 1), (5, 0)]
    assert [chunk(3, 4, i) for i in range(4)] == [(0, 1), (1, 1), (2, 1), (3, 0)]
    assert [chunk(7, 2, i) for i in range(2)] == [(0, 4), (4, 3)]
    assert [chunk(0, 2, i) for i in range(2)] == [(0, 0), (0, 0)]
    # nested: axis 0 splits dim 0 in 3 + 2, axis 1 splits each part again
    assert local_box((5, 3), [Shard(0), Shard(0)], (2, 2), (1, 1)) == ([4, 0], [1, 3])
    assert local_box((5, 3), [Shard(1), Shard(0)], (2, 2), (0, 1)) == ([3, 0], [2, 2])


def _kinds(src: list, dst: list) -> list[tuple[int, str]]:
    return [(s.axis, s.kind) for s in plan(src, dst)]


def test_one_collective_per_transition() -> None:
    R, S, P = Replicate(), Shard, Partial()
    assert _kinds([P], [R]) == [(0, "all_reduce")]
    assert _kinds([S(0)], [R]) == [(0, "all_gather")]
    assert _kinds([R], [S(1)]) == [(0, "slice")]
    assert _kinds([P], [S(0)]) == [(0, "reduce_scatter")]
    assert _kinds([S(0)], [S(1)]) == [(0, "all_to_all")]
    assert _kinds([R], [P]) == [(0, "to_partial")]
    assert _kinds([S(1)], [P]) == [(0, "all_gather"), (0, "to_partial")]
    assert _kinds([Partial("max")], [P]) == [(0, "all_reduce"), (0, "to_partial")]
    assert _kinds([S(0), R], [S(0), R]) == []
    # one axis at a time, the last first
    assert _kinds([S(0), S(1)], [R, R]) == [(1, "all_gather"), (0, "all_gather")]
    assert _kinds([P, S(0)], [S(0), S(1)]) == [(1, "all_to_all"), (0, "reduce_scatter")]
    # nested shards of one dimension: the inner axis is gathered before the outer one moves
    assert _kinds([S(0), S(0)], [S(1), S(0)]) == [(1, "all_gather"), (0, "all_to_all"), (1, "slice")]
    assert _kinds([R, S(0)], [S(0), S(0)]) == [(1, "all_gather"), (0, "slice"), (1, "slice")]


def test_placement_errors() -> None:
    with pytest.raises(anychip.InvalidArgumentError, match=r"Partial: reduce op 'mul' is not supported; "
                       r"use one of sum, avg, max, min, prod, any, all \(or a ReduceType\)"):
        Partial("mul")
    with pytest.raises(anychip.InvalidArgumentError, match=r"Shard: dim must be an int, got 'a'"):
        Shard("a")
    assert repr([Shard(1), Replicate(), Partial()]) == "[Shard(dim=1), Replicate(), Partial(op='sum')]"


# -- one process: a one-rank world --------------------------------------------------------------

@pytest.fixture(scope="module")
def mesh1() -> Iterator[ProcessMesh]:
    world = collectives.init("cpu:0", world=collectives.World(0, 1, 0, 1, f"test-parallel-{os.getpid()}", "none"))
    yield ProcessMesh([[0]], dim_names=["x", "y"], comm=world)
    world.destroy()


def test_mesh_errors(mesh1: ProcessMesh) -> None:
    with pytest.raises(anychip.InvalidArgumentError, match=r"rectangular shape"):
        ProcessMesh([[0, 1], [2]], comm=mesh1.comm)
    with pytest.raises(anychip.InvalidArgumentError, match=r"ranks must be distinct and >= 0, got \[0, 0\]"):
        ProcessMesh([0, 0], comm=mesh1.comm)
    with pytest.raises(anychip.InvalidArgumentError, match=r"dim_names must be 2 strings, one per mesh "
                       r"dimension of shape \[1, 1\]; got \['x'\]"):
        ProcessMesh([[0]], ["x"], comm=mesh1.comm)
    with pytest.raises(anychip.InvalidArgumentError, match=r"rank 3 is not in the job, whose ranks are 0..0"):
        ProcessMesh([0, 3], comm=mesh1.comm)
    assert mesh1.get_dim_size("y") == 1 and mesh1.axis("y") == 1 and mesh1.coordinate == (0, 0)
    with pytest.raises(anychip.InvalidArgumentError, match=r"no dimension named 'z'; the mesh has \['x', 'y'\]"):
        mesh1.axis("z")


def test_shard_tensor_errors(mesh1: ProcessMesh) -> None:
    with pytest.raises(anychip.InvalidArgumentError, match=r"3 placements given for a 2-d mesh"):
        dist.shard_tensor(np.ones((2, 2)), mesh1, [Replicate()] * 3)
    with pytest.raises(anychip.InvalidArgumentError, match=r"Shard\(dim=2\) is out of range for a 2-d tensor"):
        dist.shard_tensor(np.ones((2, 2)), mesh1, [Shard(2)])
    with pytest.raises(anychip.InvalidArgumentError, match=r"block of a \[4, 2\] tensor placed .* is \[4, 2\], "
                       r"got \[2, 2\]"):
        dist.dtensor_from_local(np.ones((2, 2)), mesh1, [Shard(0)], (4, 2))
    other = ProcessMesh([[0]], dim_names=["a", "b"], comm=mesh1.comm)
    with pytest.raises(anychip.UnsupportedError, match=r"moving between meshes is not supported"):
        dist.reshard(dist.shard_tensor(np.ones(2), mesh1, []), other, [])


def test_single_rank_ops_autograd_and_adamw(mesh1: ProcessMesh) -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    X = dist.shard_tensor(x, mesh1, [Shard(0), Shard(1)])      # shards over axes of one rank: whole
    W = dist.shard_tensor(w, mesh1, [Replicate(), Shard(0)], requires_grad=True)
    assert X.local_tensor().shape == (4, 3) and X.local_tensor().device == mesh1.device
    assert X.T.placements == (Shard(1), Shard(0)) and np.array_equal(X.T.numpy(), x.T)
    Y = (X @ W).relu()
    L = Y.mean()
    assert L.placements == (Partial(), Replicate())     # relu reduced the row-parallel Partial on y
    L.backward()
    h = x @ w
    np.testing.assert_allclose(L.item(), np.maximum(h, 0).mean(), rtol=1e-6)
    np.testing.assert_allclose(W.grad.numpy(), x.T @ ((h > 0) / h.size), rtol=1e-5)
    # the batch is sharded on "x": the gradient stays Partial there until the optimizer reduces it
    assert W.grad.placements == (Partial(), Shard(0))
    with pytest.raises(anychip.InvalidArgumentError, match=r"backward: \[4, 2\]-shaped tensor; call it on a scalar"):
        Y.backward()
    # AdamW: decoupled decay, bias-corrected moments
    g = W.grad.numpy()
    opt = dist.AdamW(0.1, parameters=[W], weight_decay=0.5)
    opt.step()
    want = w * (1 - 0.1 * 0.5) - 0.1 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(W.numpy(), want, rtol=1e-5, atol=1e-7)
    opt.clear_grad()
    assert W.grad is None


def test_linear_needs_shard_layer(mesh1: ProcessMesh) -> None:
    layer = dist.Linear(3, 2)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    with pytest.raises(anychip.InvalidArgumentError, match=r"not placed on a mesh yet; call shard_layer"):
        layer(dist.shard_tensor(np.ones((1, 3), np.float32), mesh1, []))
    dist.shard_layer(layer, mesh1)
    assert all(p.requires_grad and p.placements == (Replicate(), Replicate()) for p in layer.parameters())
    with pytest.raises(anychip.InvalidArgumentError, match=r"matmul: shapes \[1, 4\] and \[3, 2\] do not fit"):
        layer(dist.shard_tensor(np.ones((1, 4), np.float32), mesh1, []))


def test_paddle_placement_spellings() -> None:
    from anychip.parallel import ReduceType
    assert Partial(reduce_type=ReduceType.kRedMax) == Partial("max") == Partial(op="max")
    assert Partial(ReduceType.kRedAny).reduce_type is ReduceType.kRedAny and Partial().reduce_type is ReduceType.kRedSum
    assert [t.value for t in ReduceType] == ["sum", "avg", "max", "min", "prod", "any", "all"]
    assert Shard(1).get_dim() == 1 and Shard(1).is_shard() and Shard(1).is_shard(1) and not Shard(1).is_shard(0)
    assert Replicate().is_replicated() and Partial().is_partial()


def test_paddle_tensor_and_layer_spellings(mesh1: ProcessMesh) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    X = dist.shard_tensor(x, mesh1, [Shard(0)], stop_gradient=False)
    assert X.process_mesh is mesh1 and X.placements == (Shard(0), Replicate()) and X.requires_grad
    assert not X.stop_gradient and dist.shard_tensor(x, mesh1, []).stop_gradient
    with pytest.raises(anychip.InvalidArgumentError, match=r"stop_gradient=True contradicts requires_grad=True"):
        dist.shard_tensor(x, mesh1, [], stop_gradient=True, requires_grad=True)
    local = dist.dtensor_to_local(X)
    assert local is X.local_tensor() and np.array_equal(local.numpy(), x)
    Y = dist.dtensor_from_local(local, mesh1, [Shard(0)])         # global shape from the block (even shards)
    assert Y.shape == (2, 3) and np.array_equal(Y.numpy(), x)
    whole = dist.unshard_dtensor(Y)
    assert isinstance(whole, anychip.Tensor) and np.array_equal(whole.numpy(), x)
    Z = dist.dtensor_from_fn(np.ones, mesh1, [Shard(1)], (2, 4), dtype=np.float32)
    assert Z.shape == (2, 4) and Z.placements == (Shard(1), Replicate()) and Z.numpy().sum() == 8
    assert dist.get_mesh() is None or isinstance(dist.get_mesh(), ProcessMesh)
    dist.set_mesh(mesh1)
    assert dist.get_mesh() is mesh1
    with pytest.raises(anychip.InvalidArgumentError, match=r"set_mesh: expected a ProcessMesh, got list"):
        dist.set_mesh([0])

    class Net(dist.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w = self.create_parameter(shape=[3, 4])
            self.b = self.create_parameter([4], is_bias=True)
            self.c = self.create_parameter([2], default_initializer=dist.Constant(0.5))
            self.fc = dist.Linear(4, 2, bias_attr=False, weight_attr=dist.Normal(0.0, 0.1))

        def forward(self, x: object) -> dist.DistTensor:
            return self.fc(dist.matmul(x, self.w) + self.b)
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["w", "b", "c", "fc.weight"]
    limit = np.sqrt(6 / 7)                        # XavierUniform of a [3, 4] weight, Paddle's default
    assert np.all(np.abs(net.w.data) <= limit) and net.w.data.std() > 0.1 and net.w.dtype == np.float32
    assert np.array_equal(net.b.data, np.zeros(4)) and np.array_equal(net.c.data, [0.5, 0.5])
    assert net.fc.bias is None and abs(net.fc.weight.data.std() - 0.1) < 0.1
    seen = []
    dist.shard_layer(net, mesh1, input_fn=lambda inputs, mesh: (seen.append(len(inputs)), inputs)[1],
                     output_fn=lambda out, mesh: out * 2.0)
    out = net(x)                                  # a dense input is replicated
    assert seen == [1]
    np.testing.assert_allclose(out.numpy(), 2 * ((x @ net.w.numpy() + net.b.numpy()) @ net.fc.weight.numpy()),
                               rtol=1e-6)
    opt = dist.optimizer.AdamW(0.01, parameters=net.parameters())
    assert opt.lr == 0.01
    with pytest.raises(anychip.InvalidArgumentError, match=r"AdamW: learning_rate must be a number, got list "
                       r"\(Paddle's order: AdamW\(learning_rate, beta1, beta2, epsilon, parameters"):
        dist.AdamW(net.parameters())
    with pytest.raises(anychip.InvalidArgumentError, match=r"AdamW: parameters= is required"):
        dist.AdamW(0.1)
    with pytest.raises(anychip.InvalidArgumentError, match=r"create_parameter: shape must be a list of ints"):
        net.create_parameter("3x4")


def test_a_dense_left_operand_is_replicated(mesh1: ProcessMesh) -> None:
    # paddle.matmul(x, self.w) with a batch x the user did not shard
    x, w = np.ones((2, 3), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    W = dist.shard_tensor(w, mesh1, [Replicate(), Shard(1)], stop_gradient=False)
    for y in (dist.matmul(x, W), x @ W, dist.matmul(anychip.tensor(x, device=mesh1.device), W)):
        assert isinstance(y, dist.DistTensor) and y.placements == (Replicate(), Shard(1))
        np.testing.assert_array_equal(y.numpy(), x @ w)
    (x @ W).sum().backward()
    np.testing.assert_array_equal(W.grad.numpy(), x.T @ np.ones((2, 4), np.float32))
    with pytest.raises(anychip.InvalidArgumentError, match=r"a DistTensor op needs at least one DistTensor"):
        dist.matmul(x, w)


def test_the_articles_snippet_runs_with_its_imports_changed(mesh1: ProcessMesh) -> None:
    # Paddle's auto-parallel article, with `import paddle` / `import paddle.distributed as dist`
    # replaced by the two imports below; only the batch is made with NumPy instead of paddle.rand
    import anychip.parallel as paddle
    import anychip.parallel as pdist
    mesh = mesh1

    class MlpModel(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w0 = pdist.shard_tensor(self.create_parameter(shape=[32, 64]), mesh,
                                         [pdist.Replicate(), pdist.Shard(1)])
            self.w1 = pdist.shard_tensor(self.create_parameter(shape=[64, 32]), mesh,
                                         [pdist.Replicate(), pdist.Shard(0)])

        def forward(self, x: object) -> pdist.DistTensor:
            y = paddle.matmul(x, self.w0)
            z = paddle.matmul(y, self.w1)
            return z
    model = MlpModel()
    x = np.random.default_rng(0).random((4, 32), dtype=np.float32)
    w0, w1 = np.array(model.w0.numpy()), np.array(model.w1.numpy())
    y = model(x)
    loss = paddle.mean(y)
    loss.backward()
    opt = paddle.optimizer.AdamW(learning_rate=0.001, parameters=model.parameters())
    opt.step()
    np.testing.assert_allclose(loss.item(), (x @ w0 @ w1).mean(), rtol=1e-6)
    g1 = (x @ w0).T @ np.full((4, 32), 1 / 128, np.float32)
    np.testing.assert_allclose(model.w1.numpy(), w1 * (1 - 0.001 * 0.01) - 0.001 * np.sign(g1), rtol=1e-5,
                               atol=1e-6)


# -- across processes ----------------------------------------------------------------------------

@pytest.mark.parametrize("n,backend,cases", [(2, "cpu", 363), (4, "cpu", 2115), (2, "kunlun", 363),
                                             (4, "ascend", 2115)])
@pytest.mark.slow
def test_every_reshard_matmul_and_gradient_across_ranks(n: int, backend: str, cases: int) -> None:
    # 1-D mesh of n ranks (shapes (8,4), (5,7), (3,2), (3,5,2): even, uneven, empty chunks, 3-D),
    # and with 4 ranks a 2x2 mesh ((4,6), (5,3)); every source x destination placement, every
    # matmul placement pair, and the gradients of an MLP against NumPy
    p = _launch(n, backend, WORKER, "all")
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"[{r}] PASS {cases} cases" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("backend", ["cpu", "ascend", "kunlun", "hygon"])
@pytest.mark.slow
def test_example_small_matches_one_device(backend: str) -> None:
    if not _available(backend):
        pytest.skip(f"{backend} is unavailable")
    p = _launch(4, backend, EXAMPLE, "--small")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("[0]  ")]
    assert [r[1] for r in rows] == ["0", "1", "2"], p.stdout
    losses = [(float(r[2]), float(r[3])) for r in rows]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in losses)
    assert losses[2][0] < losses[0][0]           # it trains
    assert "[0] losses match: worst relative difference" in p.stdout


@pytest.mark.slow
def test_example_needs_four_ranks() -> None:
    p = _launch(2, "cpu", EXAMPLE, "--small")
    assert p.returncode == 2
    assert "auto_parallel.py needs 4 ranks (a 2 x 2 mesh), got 2" in p.stdout + p.stderr


@pytest.mark.parametrize("n,backend,cases", [(2, "cpu", 653), (4, "ascend", 1861)])
@pytest.mark.slow
def test_transformer_ops_and_gradients_across_ranks(n: int, backend: str, cases: int) -> None:
    # every op a transformer block needs, for every placement of its input, forward and gradient
    # against NumPy, on a 1-D mesh (and with 4 ranks a 2x2 mesh)
    p = _launch(n, backend, OPS_WORKER, "ops")
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"[{r}] PASS {cases} cases" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("suite,n,backend,cases", [("megatron", 2, "cpu", 17), ("accumulate", 2, "cpu", 5),
                                                   ("zero", 2, "cpu", 15), ("zero", 2, "ascend", 15)])
@pytest.mark.slow
def test_collectives_derived(suite: str, n: int, backend: str, cases: int) -> None:
    # megatron: column- then row-parallel costs one all_reduce forward and one backward, and
    # sequence parallel keeps the row-wise ops local;
    # accumulate: 3 micro-batches, then one all_reduce per parameter at the step;
    # zero: stages 1-3 give the unsharded losses with 1/n of the states in the allocator
    p = _launch(n, backend, OPS_WORKER, suite)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"[{r}] PASS {cases} cases" in p.stdout, p.stdout + p.stderr


TRANSFORMER = os.path.join(ROOT, "examples", "transformer_parallel.py")


@pytest.mark.parametrize("backend,zero", [("cpu", False), ("ascend", True)])
@pytest.mark.slow
def test_transformer_example_matches_one_device(backend: str, zero: bool) -> None:
    p = _launch(4, backend, TRANSFORMER, "--small", *(["--zero"] if zero else []))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("[0]  ")]
    assert [r[1] for r in rows] == ["0", "1", "2"], p.stdout
    losses = [(float(r[2]), float(r[3])) for r in rows]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in losses)
    assert losses[2][0] < losses[0][0]           # it trains
    # per step on rank 0: 2 blocks x 2 row-parallel all_reduces on "tp" forward and 2 x 2 backward, the
    # loss' value on "dp", and the step's 37 gradients (8 layer-norm ones Partial on both axes);
    # ZeRO 1 all-gathers the 29 parameters it shards
    want = "all_gather 29, all_reduce 54" if zero else "all_reduce 54"
    assert all(" ".join(r[5:]) == want for r in rows), p.stdout
    assert "[0] losses match: worst relative difference" in p.stdout


def test_op_errors_say_what_would_be_right(mesh1: ProcessMesh) -> None:
    X = dist.shard_tensor(np.ones((2, 3), np.float32), mesh1, [])
    err = anychip.InvalidArgumentError
    with pytest.raises(err, match=r"layer_norm: normalized_shape 4 does not match the last dimension of a \[2, 3\]"):
        dist.layer_norm(X, 4)
    with pytest.raises(anychip.UnsupportedError, match=r"only the last dimension is normalized here"):
        dist.layer_norm(X, [2, 3])
    with pytest.raises(err, match=r"cross_entropy: reduction 'avg'; use 'mean', 'sum' or 'none'"):
        dist.cross_entropy(X, [0, 1], reduction="avg")
    with pytest.raises(err, match=r"cross_entropy: labels of shape \[3\] for logits of shape \[2, 3\]; give one "
                       r"label per row \(\[2\]\)"):
        dist.cross_entropy(X, [0, 1, 2])
    with pytest.raises(err, match=r"cross_entropy: a label is out of range for 3 classes \(ignore_index=-100\)"):
        dist.cross_entropy(X, [0, 3])
    with pytest.raises(err, match=r"cross_entropy: indices must be integers, got float64"):
        dist.cross_entropy(X, [0.0, 1.0])
    W = dist.shard_tensor(np.ones((4, 2), np.float32), mesh1, [])
    with pytest.raises(err, match=r"embedding: index 4 is out of range for 4 embeddings"):
        dist.embedding(np.array([1, 4]), W)
    with pytest.raises(err, match=r"embedding: weight must be a 2-D DistTensor"):
        dist.embedding(np.array([1]), np.ones((4, 2)))
    with pytest.raises(anychip.UnsupportedError, match=r"DistTensor \*\* DistTensor: the exponent must be a Python "
                       r"number"):
        X ** X
    with pytest.raises(err, match=r"transpose: perm \[0, 0\] is not a permutation of the 2 dimensions"):
        X.transpose([0, 0])
    with pytest.raises(err, match=r"reshape: cannot reshape a \[2, 3\] tensor \(6 elements\) into \[4, 2\]"):
        X.reshape([4, 2])
    with pytest.raises(err, match=r"softmax: axis 2 is out of range for a 2-d tensor"):
        dist.softmax(X, axis=2)
    with pytest.raises(anychip.UnsupportedError, match=r"matmul: operands of 2 or more dimensions, got \[3\] @ "
                       r"\[2, 4\]; reshape a vector to a matrix"):
        dist.matmul(np.ones(3, np.float32), W.T)
    with pytest.raises(err, match=r"matmul: the batch dimensions of \[2, 2, 3\] and \[3, 3, 2\] do not broadcast"):
        dist.matmul(np.ones((2, 2, 3)), dist.shard_tensor(np.ones((3, 3, 2), np.float32), mesh1, []))
    opt = dist.AdamW(0.1, parameters=[dist.shard_tensor(np.ones(2, np.float32), mesh1, [], stop_gradient=False)])
    with pytest.raises(err, match=r"shard_fn must be ShardingStage1, ShardingStage2 or ShardingStage3, got 'dp'"):
        dist.shard_optimizer(opt, "dp")
    with pytest.raises(err, match=r"shard_optimizer: expected an AdamW, got list"):
        dist.shard_optimizer([], dist.ShardingStage1("x"))
    with pytest.raises(err, match=r"no dimension named 'dp'; the mesh has \['x', 'y'\]"):
        dist.shard_optimizer(opt, dist.ShardingStage2("dp"))


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="PaddlePaddle is not installed "
                    "(pip install -e '.[paddle]')")
@pytest.mark.slow
def test_transformer_matches_paddle(tmp_path: pytest.TempPathFactory) -> None:
    # the example's GPT trained on the 2x2 mesh of simulated chips against the same model in
    # Paddle 3.3.1 on the CPU, from the same weights and data
    path = os.path.join(str(tmp_path), "gpt.npz")
    p = _launch(4, "ascend", OPS_WORKER, "dump", path)
    assert p.returncode == 0, p.stdout + p.stderr
    q = subprocess.run([sys.executable, os.path.join(HERE, "paddle_gpt.py"), path], capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert q.returncode == 0, q.stdout + q.stderr
    r = json.loads(q.stdout.strip().splitlines()[-1])
    assert r["loss_diff"] <= 2e-6 and r["grad_diff"] <= 1e-5 and r["weight_diff"] <= 1e-5, r
    assert r["paddle_losses"][-1] < r["paddle_losses"][0]
