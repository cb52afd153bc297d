"""paddle.static programs trained with Adam, Momentum, AdamW and SGD, and eager AMP O1 / O2
float16 with GradScaler, on a device type against Paddle's CPU place in the same process.
Prints one JSON line: RESULT {name: [device values, cpu values]}; tests/paddle_provider/
test_paddle_provider.py compares them."""
import json
import sys

import numpy as np
import paddle

DEVICE, PART = sys.argv[1], sys.argv[2]        # PART: "static" or "amp"
R = np.random.RandomState(0)
X = R.randn(8, 6).astype("float32")
Y = R.randn(8, 3).astype("float32")
W0 = (R.randn(6, 3) * 0.3).astype("float32")
B0 = (R.randn(3) * 0.1).astype("float32")


def static_run(place: str, make_opt) -> list[float]:
    """A linear model's squared loss over 4 steps of a static program; the weights after them."""
    paddle.enable_static()
    try:
        main, start = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, start):
            x = paddle.static.data("x", [8, 6], "float32")
            y = paddle.static.data("y", [8, 3], "float32")
            w = paddle.create_parameter([6, 3], "float32",
                                        default_initializer=paddle.nn.initializer.Assign(W0))
            b = paddle.create_parameter([3], "float32", default_initializer=paddle.nn.initializer.Assign(B0))
            loss = paddle.square(paddle.matmul(x, w) + b - y).mean()
            make_opt().minimize(loss)
        kind, _, index = place.partition(":")
        exe = paddle.static.Executor(paddle.CPUPlace() if place == "cpu" else paddle.CustomPlace(kind, int(index)))
        exe.run(start)
        losses = [float(exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss])[0]) for _ in range(4)]
        scope = paddle.static.global_scope()
        return losses + np.array(scope.find_var(w.name).get_tensor()).ravel().tolist()
    finally:
        paddle.disable_static()


OPTS = {
    "adam": lambda: paddle.optimizer.Adam(learning_rate=0.05),
    "momentum": lambda: paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9),
    "momentum_nesterov_l2": lambda: paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, use_nesterov=True,
                                                              weight_decay=paddle.regularizer.L2Decay(0.01)),
    "adamw": lambda: paddle.optimizer.AdamW(learning_rate=0.05, weight_decay=0.01),
    "sgd": lambda: paddle.optimizer.SGD(learning_rate=0.05),
}


AMP_OPTS = {
    "sgd": lambda ps: paddle.optimizer.SGD(learning_rate=0.05, parameters=ps),
    "momentum": lambda ps: paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=ps),
    "adam": lambda ps: paddle.optimizer.Adam(learning_rate=0.01, parameters=ps),
    "adamw": lambda ps: paddle.optimizer.AdamW(learning_rate=0.01, weight_decay=0.01, parameters=ps),
}


def amp_run(place: str, level: str, optimizer: str) -> list[float]:
    """An MLP trained 4 steps under auto_cast float16 with a GradScaler: the losses, the scale."""
    paddle.set_device(place)
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(6, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3))
    rs = np.random.RandomState(1)
    net.set_state_dict({k: paddle.to_tensor((rs.randn(*v.shape) * 0.3).astype("float32"))
                        for k, v in net.state_dict().items()})
    opt = AMP_OPTS[optimizer](net.parameters())
    if level == "O2":
        net, opt = paddle.amp.decorate(models=net, optimizers=opt, level="O2", dtype="float16")
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
    x, y = paddle.to_tensor(X), paddle.to_tensor(Y)
    out = []
    for _ in range(4):
        with paddle.amp.auto_cast(level=level, dtype="float16"):
            loss = paddle.square(net(x) - y).mean()
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        out.append(float(loss.astype("float32").numpy().item()))
    return out + [float(scaler._scale.numpy().item()) if scaler._enable else -1.0]


def main() -> None:
    res: dict = {}
    for name, make in OPTS.items() if PART == "static" else ():
        res[f"static_{name}"] = [static_run(DEVICE, make), static_run("cpu", make)]
    for level, optimizer in (("O1", "sgd"), ("O1", "adamw"), *(("O2", o) for o in AMP_OPTS)) if PART == "amp" else ():
        try:
            res[f"amp_{level}_{optimizer}"] = [amp_run(DEVICE, level, optimizer), amp_run("cpu", level, optimizer)]
        except Exception as exc:            # noqa: BLE001 -- reported, the test names it
            res[f"amp_{level}_{optimizer}"] = str(exc).splitlines()[0][:300]
    print("RESULT " + json.dumps(res))


main()
