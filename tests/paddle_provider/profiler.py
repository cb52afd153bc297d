"""Paddle's profiler with the custom-device target on the device type: a profiled training step
(a Linear layer's forward, backward and SGD update, a host -> device and a device -> host copy)
exported as Paddle's Chrome trace. Prints RESULT {...}: the device's kernel and memcpy events
(name, start, duration, stream) and the profiled window; test_paddle_provider.py checks them."""
import json
import os
import sys
import tempfile
import time

import numpy as np
import paddle
import paddle.profiler as profiler

dev = sys.argv[1]
paddle.set_device(dev)
paddle.seed(0)
layer = paddle.nn.Linear(64, 32)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())
x_host = np.random.default_rng(0).standard_normal((16, 64)).astype("float32")


def step():
    x = paddle.to_tensor(x_host, place=dev)             # host -> device
    loss = (layer(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    return float(loss.numpy())                          # device -> host


step()                                                  # warm-up, not profiled
out = tempfile.mkdtemp()
before = time.time_ns()
prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU, profiler.ProfilerTarget.CUSTOM_DEVICE],
                         custom_device_types=[dev.split(":")[0]], on_trace_ready=profiler.export_chrome_tracing(out))
prof.start()
loss = step()
prof.step()
prof.stop()
after = time.time_ns()
trace = json.load(open(os.path.join(out, os.listdir(out)[0])))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("Kernel", "Memcpy", "Memset")]
ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "Operator"]
runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") == "CudaRuntime"]
print("RESULT " + json.dumps({
    "loss": loss, "window_us": [before / 1000, after / 1000],
    "device": [[e["cat"], e["name"], e["ts"], e["dur"], e.get("tid"), e.get("args", {})] for e in device],
    "runtime": [[e["name"], e["ts"], e["dur"], e.get("args", {})] for e in runtime],
    "ops": sorted({e["name"] for e in ops}),
}))
