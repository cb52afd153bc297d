"""torch.profiler with the device's activities on the device ANYCHIP_TORCH names (a test plugin
of tests/c/plugin_variants.c): prints RESULT and, in JSON, the result's sum, the profile's CPU op
names, its device activities and the ops' device time."""
import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import anychip.torch  # noqa: F401

a = torch.ones(8, 8, device="anychip")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    b = (a + a).cpu()
ops = sorted({e.name for e in prof.events() if e.device_type == DeviceType.CPU})
device = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
time = sum(e.device_time_total for e in prof.key_averages())
print("RESULT", json.dumps({"sum": b.sum().item(), "ops": ops, "device": device, "device_time": time}))
