"""Reads of results still being computed, while the thread's current device keeps changing
under the device (docs/torch.md, "The current device").

The chip's library has one current device per thread, which both anychip's runtime (the
allocator, streams, synchronize) and the plugin.h face the extension drives (kernels, copies)
set; the NULL stream, each device's default stream, is the current device's. Each round
computes on one device and one of its streams (the default or one of two others) while
anychip's runtime last made that device or another current, then makes anychip's runtime use
another device (an allocation, a stream, a synchronize), then reads the pending result back:
to the host, to another device, or as a scalar. Every value must be the one computed. Prints
FIRST lines (two first uses), ROUNDS <n> STALE <n> ERRORS <n>, then each failure.

    python device_switch.py [rounds]       (ANYCHIP_TORCH picks the chip)
"""
import sys

import torch

import anychip.torch as at

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
n = min(at.device_count(), 4)
big = 1 << 20                   # long enough a kernel that a read not ordered after it sees stale values

# first uses: anychip:1 made current by its first tensor while anychip:0's kernel is pending,
# then a pending result copied to anychip:2 as its first use
x = torch.ones(1 << 22, device="anychip:0")
at.synchronize()
y = x + x
w = torch.empty(4, device="anychip:1")
print("FIRST anychip:1", y[:4].cpu().tolist())
y = x + x + x
print("FIRST anychip:2", y.to("anychip:2")[-4:].cpu().tolist())

streams = [[None, torch.Stream(device=f"anychip:{d}"), torch.Stream(device=f"anychip:{d}")] for d in range(n)]
stale, errors, failures = 0, 0, []


def elsewhere(e: int, r: int) -> None:
    """anychip's runtime makes device e current on this thread (as torch's work on e does)."""
    kind = r % 4
    if kind == 0:
        torch.empty(big + 64 * r, device=f"anychip:{e}")       # a size the cache has not seen: a new block
    elif kind == 1:
        at.synchronize(e)
    elif kind == 2:
        at.anychip_device(e).alloc(4096 + r).free()
    else:                                                       # a new stream, used at once
        with torch.accelerator.device_index(e), torch.Stream(device=f"anychip:{e}"):
            got = (torch.ones(4, device=f"anychip:{e}") * 2).cpu().tolist()
        if got != [2.0] * 4:
            raise AssertionError(f"a new stream of anychip:{e} computed {got}")


for r in range(rounds):
    d, e = r % n, (r * 3 + 1) % n
    if e == d:
        e = (d + 1) % n
    s = streams[d][r % 3]
    value = float(r % 97 + 1)
    try:
        with torch.accelerator.device_index(d):
            ctx = torch.accelerator.current_stream(d) if s is None else s
            with ctx:
                x = torch.full((big,), value, device=f"anychip:{d}")
                at.synchronize(d)
                if (r // 4) % 2:
                    at.synchronize(e)             # anychip's runtime last made e current, not d
                y = x + x                         # on the chip's kernel, pending
                elsewhere(e, r)
                how = (r // 3) % 3
                if how == 0:
                    got = y[-4:].cpu().tolist()
                elif how == 1:
                    got = y.to(f"anychip:{e}")[-4:].cpu().tolist()
                else:
                    got = [y[-1].item()] * 4
        if got != [2 * value] * 4:
            stale += 1
            failures.append(f"round {r} anychip:{d} stream {r % 3} read {how}: {got}, want {2 * value}")
    except Exception as exc:            # noqa: BLE001  (reported, counted)
        errors += 1
        failures.append(f"round {r} anychip:{d} stream {r % 3}: {type(exc).__name__}: {exc}")

print(f"ROUNDS {rounds} STALE {stale} ERRORS {errors}")
for line in failures[:10]:
    print(line)
