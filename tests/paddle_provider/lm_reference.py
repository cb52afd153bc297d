"""The benchmark's Transformer LM (benchmarks/bench_paddle_provider.py: vocabulary 1000, width
128, 4 heads, 2 layers, batch 8 x 32, AdamW; GELU for ReLU, below) on a device type anychip
provides (argv[1]), in the mode argv[2] (eager or to_static), for argv[3] steps, against
Paddle's CPU place in the same process. Prints one JSON line;
tests/paddle_provider/test_paddle_provider.py runs it.

- step by step: before each step the device's model takes the CPU model's weights, so each step
  compares one forward and backward from the same weights, over the weights training visits:
  the loss's relative difference and each gradient's largest difference relative to that
  gradient's largest value. The key projections' biases are listed apart: their exact gradient is
  zero (a bias added to every key adds the same number to all of a query's scores, which softmax
  ignores), so what either place computes there is rounding, compared with the largest gradient
  of the model. The feed-forward layers use GELU here, not the default ReLU: ReLU's gradient
  jumps at zero, so an input that rounds to -3e-9 on one place and +3e-8 on the other (step 2
  of this run with ReLU) changes a gradient column by 1 % though both are right to float32.
- free running: the device trains on its own, twice, and Paddle's CPU place trains in float32
  and in float64 (the reference); their losses."""
import json
import sys

import numpy as np
import paddle

VOCAB, D = 1000, 128


class LM(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = paddle.nn.Embedding(VOCAB, D)
        layer = paddle.nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.0, activation="gelu")
        self.enc = paddle.nn.TransformerEncoder(layer, 2)
        self.out = paddle.nn.Linear(D, VOCAB)

    def forward(self, ids):
        return self.out(self.enc(self.emb(ids)))


class Trainer:
    def __init__(self, place: str, mode: str, dtype: str = "float32"):
        self.place = place
        paddle.set_device(place)
        paddle.set_default_dtype(dtype)
        paddle.seed(0)
        self.model = LM()
        paddle.set_default_dtype("float32")
        self.opt = paddle.optimizer.AdamW(1e-3, parameters=self.model.parameters())

        def loss_of(x, y):
            return paddle.nn.functional.cross_entropy(self.model(x).reshape([-1, VOCAB]), y.reshape([-1]))

        self.loss_of = paddle.jit.to_static(loss_of, full_graph=True) if mode == "to_static" else loss_of

    def forward_backward(self, batch: np.ndarray) -> float:
        paddle.set_device(self.place)
        loss = self.loss_of(paddle.to_tensor(batch[:, :-1]), paddle.to_tensor(batch[:, 1:]))
        loss.backward()
        return float(loss)

    def update(self) -> None:
        paddle.set_device(self.place)
        self.opt.step()
        self.opt.clear_grad()

    def grads(self) -> dict[str, np.ndarray]:
        return {n: p.grad.numpy().astype(np.float64) for n, p in self.model.named_parameters()}


def main() -> None:
    device, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = np.random.default_rng(0).integers(0, VOCAB, (steps, 8, 33))

    cpu, dev = Trainer("cpu", "eager"), Trainer(device, mode)
    loss_rel, grad_rel, key_bias = [], [], []
    for i in range(steps):
        dev.model.set_state_dict(cpu.model.state_dict())
        want, got = cpu.forward_backward(data[i]), dev.forward_backward(data[i])
        loss_rel.append(abs(got - want) / abs(want))
        g_cpu, g_dev = cpu.grads(), dev.grads()
        largest = max(np.abs(g).max() for g in g_cpu.values())
        worst = 0.0
        for name, g in g_cpu.items():
            diff = np.abs(g_dev[name] - g).max()
            if name.endswith("k_proj.bias"):
                key_bias.append(float(max(np.abs(g).max(), np.abs(g_dev[name]).max()) / largest))
            else:
                worst = max(worst, float(diff / np.abs(g).max()))
        grad_rel.append(worst)
        cpu.update()
        dev.update()

    def free_run(place: str, mode: str, dtype: str = "float32") -> list[float]:
        t = Trainer(place, mode, dtype)
        out = []
        for i in range(steps):
            out.append(t.forward_backward(data[i]))
            t.update()
        return out

    print("RESULT " + json.dumps({
        "loss_rel": loss_rel, "grad_rel": grad_rel, "key_bias": key_bias,
        "device": free_run(device, mode), "device_again": free_run(device, mode),
        "cpu": free_run("cpu", "eager"), "float64": free_run("cpu", "eager", "float64")}), flush=True)


if __name__ == "__main__":
    main()
