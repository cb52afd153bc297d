"""Paddle's strided views in default eager mode (stride kernels on, no FLAGS set): slices,
transposes, an LM's ids[:, :-1], int16 / bool views, their gradients, setitem, in-place ops and
fill_ on views, split / unbind / diagonal / as_strided / indexing, and a TransformerEncoderLayer's
forward and backward, each on the device type and on Paddle's CPU place in the same process.
Prints RESULT {name: true | "what differed"} and the encoder layer's relative differences;
tests/paddle_provider/test_paddle_provider.py runs it."""
import json
import sys

import numpy as np
import paddle

dev = sys.argv[1]
res = {}
def both(f):
    out = []
    for d in ('cpu', dev):
        paddle.set_device(d)
        paddle.seed(0)
        out.append(f())
    return out
def chk(name, f):
    try:
        c, d = both(f)
        ok = all(np.array_equal(a, b) for a, b in zip(c, d, strict=False))
        res[name] = True if ok else f"differ {c} {d}"
    except Exception as e:  # noqa: BLE001 -- reported by name
        res[name] = "ERR " + str(e).splitlines()[0][:200]
x0 = np.arange(32, dtype='float32').reshape(4, 8)
def t(a, g=False):
    return paddle.to_tensor(a, stop_gradient=not g)

chk("slice_add", lambda: [(t(x0)[:, :2] + 1).numpy()])
chk("slice_off", lambda: [(t(x0)[:, 3:] * 2).numpy()])
chk("transpose", lambda: [(paddle.transpose(t(x0), [1, 0]) * 2).numpy()])
chk("ids", lambda: [(t(x0.astype('int64'))[:, :-1] + 1).numpy()])
chk("int16", lambda: [t(x0.astype('int16'))[:, 1:3].contiguous().numpy()])
chk("bool", lambda: [t(x0 > 5)[1:, ::2].contiguous().numpy()])
def grad():
    x = t(x0, True)
    y = (x[:, 1:5] * t(np.arange(8, dtype='float32').reshape(4, 2).repeat(2, 1))).sum()
    y.backward()
    return [x.grad.numpy()]
chk("slice_grad", grad)
def tgrad():
    x = t(x0, True)
    y = (paddle.transpose(x, [1, 0]) @ t(np.ones([4, 3], 'float32'))).sum()
    y.backward()
    return [x.grad.numpy()]
chk("transpose_grad", tgrad)
def setitem():
    x = t(x0.copy())
    x[:, 2] = 7.0
    return [x.numpy()]
chk("setitem", setitem)


def inplace_runs():
    # an in-place add on a column view of 5000 rows: the result is written back into the view with
    # more destination runs than the device path takes (the host copies it); on one of 1000 rows,
    # a unary COPY per run
    x = paddle.zeros([5000, 3])
    x[:, 1].add_(t(np.arange(5000, dtype='float32')))
    y = paddle.zeros([1000, 3])
    y[:, 2].add_(t(np.arange(1000, dtype='float32')))
    return [x.numpy(), y.numpy()]


chk("inplace_runs", inplace_runs)


def ordered():
    # 100 views read right after the work that produces them is queued: a GEMM's result sliced (the
    # table's COPY, on the stream) and an int16 tensor's view (a dtype the table lacks: the host
    # copies it after the stream's work)
    r = np.random.RandomState(4)
    a, b = (t(r.randint(-3, 4, (64, 64)).astype('float32')) for _ in range(2))     # exact products
    c = t(np.arange(4096, dtype='int16').reshape(64, 64))
    out = []
    for k in range(100):
        out.append(((a @ b)[:, k % 7:k % 7 + 9] + 1).numpy())
        out.append((c + 1)[k % 5::3, 2:].contiguous().numpy())
    return out


chk("ordered_100", ordered)
def inplace_view():
    x = t(x0.copy())
    v = x[1:3, ::2]
    v.add_(t(np.ones([2, 4], 'float32')))
    return [x.numpy()]
chk("inplace_view", inplace_view)
def fill_():
    x = t(x0.copy())
    x[1].fill_(3.0)
    return [x.numpy()]
chk("fill_view", fill_)
def unbind():
    x = t(x0)
    a, b = paddle.split(x, 2, axis=1)
    return [(a + b).numpy(), paddle.unbind(x, 1)[3].numpy()]
chk("split_unbind", unbind)
def diag():
    return [(paddle.diagonal(t(x0)) + 0).numpy(), (t(x0).reshape([8, 4]).T + 0).numpy(),
            (t(x0)[..., None].squeeze(-1)[::2] * 1).numpy()]
chk("diag_T", diag)
def asstr():
    return [(paddle.as_strided(t(x0), [3, 3], [8, 1], 2) + 0).numpy()]
chk("as_strided", asstr)
def idx():
    return [(t(x0)[2] + 0).numpy(), (t(x0)[:, 5] + 0).numpy()]
chk("index", idx)
# the view ops' gradients (a weighted sum of each view): fill + strided_copy on the device
VIEWS = {
    "as_strided": lambda x: paddle.as_strided(x, [3, 3], [8, 1], 2),
    "as_strided_overlapping": lambda x: paddle.as_strided(x, [3, 3], [1, 1], 0),
    "diagonal": lambda x: paddle.diagonal(x),
    "index_row": lambda x: x[2],
    "index_column": lambda x: x[:, 5],
    "strided_slice": lambda x: paddle.strided_slice(x, [1], [0], [8], [3]),
    "split": lambda x: paddle.split(x, 2, axis=1)[1],
    "unbind": lambda x: paddle.unbind(x, 1)[3],
    "reshape_transpose": lambda x: x.reshape([8, 4]).T,
    "unsqueeze_slice": lambda x: x.unsqueeze(0)[:, 1:],
}
WEIGHTS = np.random.RandomState(3).randn(64).astype('float32')


def view_grad(view):
    x = t(x0 / 7, True)
    y = view(x)
    (y * t(WEIGHTS[:int(np.prod(y.shape))].reshape(y.shape))).sum().backward()
    return [y.numpy(), x.grad.numpy()]


for name, view in VIEWS.items():
    chk(f"{name}_grad", lambda view=view: view_grad(view))

paddle.set_device('cpu')
paddle.seed(1)
_init = {k: v.numpy() for k, v in paddle.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).state_dict().items()}
def tel():
    layer = paddle.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
    layer.set_state_dict({k: paddle.to_tensor(v) for k, v in _init.items()})
    x = t(np.random.RandomState(0).randn(2, 5, 16).astype('float32'), True)
    y = layer(x)
    # a weighted sum: y.mean() after the layer's LayerNorm (weights of one) has a zero gradient
    (y * t(np.random.RandomState(2).randn(2, 5, 16).astype('float32'))).sum().backward()
    return [y.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in layer.parameters()]
try:
    c, d = both(tel)
    # relative to the largest gradient: k_proj's bias has a zero gradient (softmax does not see a
    # shift of every key), so its entries are both sides' rounding noise
    res["encoder_forward_rel"] = float(np.max(np.abs(c[0] - d[0])) / np.max(np.abs(c[0])))
    top = max(float(np.max(np.abs(a))) for a in c[1:])
    res["encoder_backward_rel"] = max(float(np.max(np.abs(a - b))) for a, b in zip(c[1:], d[1:], strict=True)) / top
except Exception as e:  # noqa: BLE001 -- reported by name
    res["encoder_forward_rel"] = "ERR " + str(e).splitlines()[0][:300]
print("RESULT", json.dumps(res))
