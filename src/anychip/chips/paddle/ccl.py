"""A Paddle plugin's ``xccl_*`` entries as a native collective library."""
from __future__ import annotations

from typing import Any

from ...runtime.native_ccl import NativeLibrary
from .loader import STATUS

__all__ = ["PaddleXccl"]

class PaddleXccl(NativeLibrary):
    """A plugin's ``xccl_*`` entries, driven by the native transport as HCCL is."""

    api = "xccl"
    needed = ("xccl_get_unique_id_size", "xccl_get_unique_id", "xccl_comm_init_rank", "xccl_destroy_comm")
    codes = {k: v[0] for k, v in STATUS.items()}
    invalid_codes = frozenset({3})
    dtypes = {"int8": 6, "uint8": 2, "int32": 8, "int64": 9, "float16": 10, "float32": 11, "float64": 12,
              "bfloat16": 13}
    byte = 2                                    # UINT8
    redops = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4}
    _entries = {"all_reduce": "xccl_all_reduce", "broadcast": "xccl_broadcast", "reduce": "xccl_reduce",
                "all_gather": "xccl_all_gather", "reduce_scatter": "xccl_reduce_scatter",
                "all_to_all": "xccl_all_to_all", "send": "xccl_send", "recv": "xccl_recv"}

    def __init__(self, plugin: Any) -> None:
        super().__init__(plugin.ffi, plugin.iface, plugin.p.path, False)
        self.plugin = plugin
        grouped = plugin._has("xccl_group_start") and plugin._has("xccl_group_end")
        # without group entries send / recv pairs could deadlock: the engine runs them
        self.entries = frozenset(k for k, e in self._entries.items()
                               if plugin._has(e) and (grouped or k not in ("send", "recv", "all_to_all")))
        self._grouped = grouped
        self._comms: dict[int, tuple[int, int]] = {}
        try:
            self._comm_error: Any = plugin.p.lib.anychip_paddle_comm_error
        except AttributeError:
            self._comm_error = None

    def supports(self, spec: Any) -> bool:
        if spec.kind not in self.entries:
            return False
        if spec.kind in ("all_reduce", "reduce", "reduce_scatter"):
            return spec.dtype in self.dtypes and spec.op in self.redops
        return True

    def _rc(self, rc: int) -> int:
        return 0 if rc == 1 else int(rc)

    def unique_id(self) -> bytes:
        f, lib = self.ffi, self.lib
        size = f.new("size_t *")
        self.check(self._rc(lib.xccl_get_unique_id_size(size)), "xccl_get_unique_id_size")
        data = f.new("char[]", max(int(size[0]), 1))
        root = f.new("C_CCLRootId *", {"sz": int(size[0]), "data": data})
        self.check(self._rc(lib.xccl_get_unique_id(root)), "xccl_get_unique_id")
        return bytes(f.buffer(data, int(size[0])))

    def init(self, nranks: int, uid: bytes, rank: int) -> Any:
        f = self.ffi
        data = f.new("char[]", uid or b"\0")
        root = f.new("C_CCLRootId *", {"sz": len(uid), "data": data})
        out = f.new("C_CCLComm *")
        self.check(self._rc(self.lib.xccl_comm_init_rank(nranks, root, rank, out)),
                   f"xccl_comm_init_rank (rank {rank} of {nranks})")
        self._comms[int(f.cast("uintptr_t", out[0]))] = (rank, nranks)
        return out[0]

    def destroy(self, comm: Any) -> int:
        self._comms.pop(int(self.ffi.cast("uintptr_t", comm)), None)
        return self._rc(self.lib.xccl_destroy_comm(comm))

    def async_error(self, comm: Any) -> int:
        """C_ERROR when the plugin's error extension reports a failed op of ``comm``; without
        it, failures of enqueued ops surface only where the plugin reports them (its stream)."""
        return 3 if self.comm_detail(comm) else 0

    def comm_detail(self, comm: Any) -> str:
        if self._comm_error is None:
            return ""
        p = self._comm_error(comm)
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def group_start(self) -> int:
        return self._rc(self.lib.xccl_group_start()) if self._grouped else 0

    def group_end(self) -> int:
        return self._rc(self.lib.xccl_group_end()) if self._grouped else 0

    def use_device(self, plugin: Any, index: int) -> None:
        plugin._use(index)

    def stream_handle(self, plugin: Any, raw: Any) -> Any:
        return raw.raw

    def op(self, comm, kind, send, recv, count, dtype, redop, root, stream):  # noqa: ANN001, ANN201
        lib, f = self.lib, self.ffi
        if kind == "all_reduce":
            return self._rc(lib.xccl_all_reduce(send, recv, count, dtype, redop, comm, stream))
        if kind == "broadcast":
            rank, _ = self._comms[int(f.cast("uintptr_t", comm))]
            if rank == root and send != recv and count:          # xccl broadcasts in place
                self.plugin._call("async_memory_copy_d2d" if self.plugin._has("async_memory_copy_d2d")
                                  else "memory_copy_d2d", *self._d2d_args(stream, recv, send, count))
            return self._rc(lib.xccl_broadcast(recv, count, dtype, root, comm, stream))
        if kind == "reduce":
            return self._rc(lib.xccl_reduce(send, recv, count, dtype, redop, root, comm, stream))
        if kind == "all_gather":
            return self._rc(lib.xccl_all_gather(send, recv, count, dtype, comm, stream))
        if kind == "reduce_scatter":
            return self._rc(lib.xccl_reduce_scatter(send, recv, count, dtype, redop, comm, stream))
        if kind == "send":
            return self._rc(lib.xccl_send(send, count, dtype, root, comm, stream))
        if kind == "recv":
            return self._rc(lib.xccl_recv(recv, count, dtype, root, comm, stream))
        rank, size = self._comms[int(f.cast("uintptr_t", comm))]
        s, r = int(f.cast("uintptr_t", send)), int(f.cast("uintptr_t", recv))
        sends = f.new("void *[]", [f.cast("void *", s + p * count) for p in range(size)])
        recvs = f.new("void *[]", [f.cast("void *", r + p * count) for p in range(size)])
        counts = f.new("size_t[]", [count] * size)
        types = f.new("C_DataType[]", [dtype] * size)
        return self._rc(lib.xccl_all_to_all(f.cast("const void **", sends), counts, types, recvs, counts, types,
                                            rank, size, comm, stream))

    def _d2d_args(self, stream: Any, dst: Any, src: Any, nbytes: int) -> tuple:
        plugin = self.plugin
        index = getattr(plugin._tls, "dev", 0)
        dev = plugin._dev(index if index >= 0 else 0)
        if plugin._has("async_memory_copy_d2d"):
            return dev, stream, dst, src, nbytes
        plugin._call("synchronize_stream", dev, stream)
        return dev, dst, src, nbytes

