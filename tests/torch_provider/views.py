"""c10d all_reduce on tensors that start inside their storage, on 2 ranks: each op's values,
how often the communicator checked and prepared an op, and the device memory once the
storages are gone (a cached op must not keep a freed or resized storage's memory).
With ANYCHIP_TORCH_C10D_DIRECT=0 the ops run through the communicator (its prepared-op
cache); otherwise through the process group's C++ path, which never reaches it (0 checks).
Prints MODE direct|communicator, CHECK <what> ok|FAIL lines and DONE <rank> failures=<n>."""
import torch
import torch.distributed as dist

import anychip.torch
import anychip.torch.distributed  # noqa: F401

dist.init_process_group("anychip")
pg = dist.distributed_c10d._get_default_group()
comm = pg.comm
direct = pg._direct is not None
print(f"MODE {'direct' if direct else 'communicator'}", flush=True)
rank, size = dist.get_rank(), dist.get_world_size()
dev = torch.device("anychip", torch.accelerator.current_device_index())
want = float(sum(r + 1 for r in range(size)))

# count the communicator's checks and preparations: a hit of its prepared-op cache does neither
calls = {"check": 0, "prepare": 0}
check, prepare = comm._check, comm.transport.prepare


def counted_check(*args):
    calls["check"] += 1
    return check(*args)


def counted_prepare(specs):
    calls["prepare"] += 1
    return prepare(specs)


comm._check, comm.transport.prepare = counted_check, counted_prepare
failures = 0


def counted(n: int) -> dict[str, int]:
    """The checks and preparations n distinct ops cost the communicator (none on the C++ path)."""
    return {"check": 0, "prepare": 0} if direct else {"check": n, "prepare": n}



def expect(what: str, ok: bool, detail: object = "") -> None:
    global failures
    failures += not ok
    print(f"CHECK {what} {'ok' if ok else 'FAIL'} {detail}", flush=True)


def memory() -> int:
    anychip.torch.synchronize()
    return torch.anychip.memory_allocated()


base = memory()
# 1. a fresh view tensor at each call, 25 calls: checked and prepared once
big = torch.zeros(4096, device=dev)
for _ in range(25):
    v = big[100:1124]
    v.fill_(rank + 1)
    dist.all_reduce(v)
host = big.cpu()
expect("view.values", bool((host[100:1124] == want).all()) and not host[:100].any() and not host[1124:].any())
expect("view.prepared_once", calls == counted(1), calls)
# async, with other views of the same storage in flight: one more range, one more entry
works = [dist.all_reduce(big[2000 + 8 * i:2008 + 8 * i], async_op=True) for i in range(4)]
works += [dist.all_reduce(big[2000 + 8 * i:2008 + 8 * i], async_op=True) for i in range(4)]
for w in works:
    w.wait()
expect("view.async_entries", calls == counted(5), calls)

# 2. the storage freed, a new one (likely the same memory and Buffer address) in its place:
# checked and prepared anew, its own values; no memory kept for the old one
del big, v, host, works, w
expect("view.freed_released", memory() == base, (memory(), base))
big = torch.full((4096,), 10.0 * (rank + 1), device=dev)
dist.all_reduce(big[100:1124])
host = big.cpu()
expect("view.reused_storage", bool((host[100:1124] == 10 * want).all()) and
       bool((host[:100] == 10 * (rank + 1)).all()), host[98:102].tolist())
expect("view.reused_prepared_again", calls == counted(6), calls)

# 3. the storage resized (new memory under the same storage): the old memory is released and
# a view of the new one is checked and prepared anew
storage = big.untyped_storage()
storage.resize_(4 * 8192)
grown = torch.empty(0, device=dev).set_(storage, 100, (1024,))
grown.fill_(rank + 1)
dist.all_reduce(grown)
expect("view.resized_values", bool((grown.cpu() == want).all()))
expect("view.resized_prepared_again", calls == counted(7), calls)
del big, host, grown
expect("view.resized_old_released", memory() == base + 4 * 8192, (memory() - base,))
del storage
expect("view.all_released", memory() == base, (memory(), base))

dist.destroy_process_group()
print(f"DONE {rank} failures={failures}", flush=True)
