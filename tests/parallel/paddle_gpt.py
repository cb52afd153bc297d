"""examples/transformer_parallel.py's GPT (``--small``) written in Paddle and trained from the
initial weights and data that tests/parallel/parallel_ops_worker.py ``dump PATH`` saved from anychip's
2x2 mesh run; prints one JSON line comparing the first step's gradients, the losses and the
weights after the steps with anychip's (tests/parallel/test_parallel.py reads it).

    python tests/parallel/paddle_gpt.py PATH

The key biases are left out of the comparison of gradients and weights: softmax does not change
when the same number is added to every score of a row, so their gradient is zero in exact
arithmetic and rounding noise (about 1e-9) in both frameworks, which AdamW's normalized step
turns into updates of either sign.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812  (Paddle's spelling)

HEADS, LAYERS = 4, 2


def main() -> None:
    saved = np.load(sys.argv[1])
    ids = saved["ids"]
    w = {k[len("init/"):]: paddle.to_tensor(saved[k], stop_gradient=False) for k in saved.files
         if k.startswith("init/")}
    seq = ids.shape[1] - 1
    mask = paddle.to_tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))

    def linear(x, name, bias=True):
        y = paddle.matmul(x, w[name + ".weight"])
        return y + w[name + ".bias"] if bias else y

    def norm(x, name):
        return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], 1e-5)

    def model(tokens):
        x = F.embedding(tokens, w["tok.weight"]) + w["pos"]
        for i in range(LAYERS):
            p = f"block{i}."
            h = norm(x, p + "ln1")
            b, s, d = h.shape
            hd = d // HEADS
            q, k, v = (linear(h, p + n).reshape([b, s, HEADS, hd]).transpose([0, 2, 1, 3]) for n in "qkv")
            scores = paddle.matmul(q, k, transpose_y=True) * (1 / math.sqrt(hd)) + mask
            ctx = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([b, s, d])
            x = x + linear(ctx, p + "o")
            x = x + linear(F.gelu(linear(norm(x, p + "ln2"), p + "fc1"), approximate=True), p + "fc2")
        return linear(norm(x, "ln_f"), "head", bias=False)

    compared = [n for n in w if not n.endswith("k.bias")]
    opt = paddle.optimizer.AdamW(learning_rate=3e-3, parameters=list(w.values()), weight_decay=0.01)
    tokens, labels = paddle.to_tensor(ids[:, :-1]), paddle.to_tensor(ids[:, 1:])
    losses, grad_diff = [], 0.0
    for step in range(len(saved["losses"])):
        loss = F.cross_entropy(model(tokens), labels.unsqueeze(-1))
        loss.backward()
        if step == 0:
            grad_diff = max(float(np.abs(w[n].grad.numpy() - saved["grad/" + n]).max() /
                                  np.abs(saved["grad/" + n]).max()) for n in compared)
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(losses, saved["losses"], strict=True))
    weight_diff = max(float(np.abs(w[n].numpy() - saved["final/" + n]).max()) for n in compared)
    print(json.dumps({"paddle_losses": losses, "anychip_losses": saved["losses"].tolist(), "loss_diff": loss_diff,
                      "grad_diff": grad_diff, "weight_diff": weight_diff}))


if __name__ == "__main__":
    main()
