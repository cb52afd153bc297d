"""inductor's backend for the ``anychip`` device: ``torch.compile(model)`` with the default backend.

inductor asks the device module for its code generators the first time it compiles a graph
(``init_backend_registration`` reads ``torch.anychip.Scheduling``, ``PythonWrapperCodegen``,
``CppWrapperCodegen``, ``WrapperFxCodegen``); ``anychip.torch`` answers from this module, which
is imported then and only then.

Where the backend's device memory is host memory (plugin.h's ``ANYCHIP_PLUGIN_HOST_MEMORY``: the
simulated chips, whose arenas are mmap()ed host memory, and the scaffolded C plugin), the graph is
compiled as inductor compiles it for the CPU: its fused kernels are C++ run by the host on the
device's memory, its extern kernels (matmul, ...) are the device's own aten kernels, queued on
its streams, and its buffers come from the device's allocator. The host's kernels are not
queued, so before each one the wrapper waits for the device's current stream: the queued work
the kernel reads (or whose memory the allocator gave back to it) is done by then. Outputs are
device tensors.

Where the memory is not host memory, the host cannot run a kernel on it: torch.compile's default
backend runs the device's graphs through aot_eager instead, with one warning (anychip.torch's
NOT_HOST_MEMORY_FALLBACK), and inductor called as a backend of its own refuses them here with
NOT_HOST_MEMORY (an InductorError naming the reason), never runs them wrong.
"""
from __future__ import annotations

import sys
from typing import Any

from torch._inductor import config as _config
from torch._inductor import utils as _utils
from torch._inductor.codegen.common import DeviceOpOverrides, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
from torch._inductor.scheduler import BaseSchedulerNode
from torch._inductor.virtualized import V

#: the device's torch name and its anychip state (anychip.torch's NAME and _state), given by setup()
NAME = "anychip"
_state: Any = None
_module: Any = None

#: why a device whose memory is not host memory cannot run inductor's kernels
NOT_HOST_MEMORY = (
    "torch.compile on the {name} device ({backend}): its memory is not host memory (the plugin does not set "
    "ANYCHIP_PLUGIN_HOST_MEMORY), so the host cannot run inductor's generated C++ kernels on it; compile with "
    "torch.compile(model, backend='aot_eager'), which runs the graph as the device's own kernels")


def host_memory() -> bool:
    """Whether every device of the backend has host memory (ANYCHIP_PLUGIN_HOST_MEMORY)."""
    return bool(_module._host_memory())


class _HostKernelsOnDevice:
    """What the device's wrappers change: each C++ kernel call first waits for the current stream."""

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     triton: bool = True, **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type != NAME or triton:
            super()._generate_kernel_call_helper(  # type: ignore[misc]
                kernel_name, call_args, device=device, triton=triton, **kwargs)
            return
        self.writeline(f"torch.{NAME}._host_kernel_wait({device.index})")  # type: ignore[attr-defined]
        self.writeline(self.wrap_kernel_call(kernel_name, call_args))  # type: ignore[attr-defined]

    def make_allocation(self, name: str, device: Any, dtype: Any, shape: Any, stride: Any,
                        allocation_shape: Any = None, is_pinned: bool = False) -> str:
        """inductor allocates on devices other than the CPU, CUDA, XPU and MTIA with ``device='<type>'``,
        the current device, relying on a device guard that it writes for GPUs only: name the index."""
        line: str = super().make_allocation(  # type: ignore[misc]
            name, device, dtype, shape, stride, allocation_shape, is_pinned)
        if device.type == NAME and device.index is not None:
            line = line.replace(f"device='{NAME}'", f"device='{device}'")
        return line


class AnychipSubgraphWrapperCodegen(_HostKernelsOnDevice, SubgraphPythonWrapperCodegen):
    supports_caching = False


class AnychipWrapperCodegen(_HostKernelsOnDevice, PythonWrapperCodegen):
    """The Python wrapper of a graph on the device (inductor's, with the waits above). Its graphs stay
    out of inductor's FX graph cache, whose key knows torch's code but not this module's: a cached
    wrapper written by another version of it would run as it was written. (The C++ kernels, cached
    by their source, still are.)"""

    supports_caching = False

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: PythonWrapperCodegen | None,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return AnychipSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return AnychipWrapperCodegen()


class AnychipCppWrapperCodegen(CppWrapperCpu):
    """inductor's C++ wrapper (``torch._inductor.config.cpp_wrapper``, AOTInductor) is refused: it
    would run the host's kernels without waiting for the device's streams."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"torch.compile on the {NAME} device: inductor's C++ wrapper (config.cpp_wrapper, "
                           "AOTInductor) is not supported; the device's graphs use the Python wrapper, which "
                           "orders the host's kernels after the device's streams")


class AnychipScheduling(CppScheduling):
    """inductor's C++ (CPU) code generation, for the device's host-addressable memory."""

    def __init__(self, scheduler: Any) -> None:
        if not host_memory():
            raise RuntimeError(NOT_HOST_MEMORY.format(name=NAME, backend=_state.backend))
        super().__init__(scheduler)


class AnychipDeviceOpOverrides(DeviceOpOverrides):
    """The lines inductor's Python wrapper writes for the device."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from anychip.torch._dynamo_interface import raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return f"torch.{NAME}.set_device({device_idx})"

    def synchronize(self) -> str:
        return f"torch.{NAME}.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.{NAME}.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


#: what anychip.torch gives inductor's init_backend_registration, by the name it asks for
CODEGENS: dict[str, Any] = {
    "Scheduling": AnychipScheduling,
    "PythonWrapperCodegen": AnychipWrapperCodegen,
    "CppWrapperCodegen": AnychipCppWrapperCodegen,
    "WrapperFxCodegen": WrapperFxCodegen,
}

def _is_cpu(node: BaseSchedulerNode) -> bool:
    """inductor's scheduler asks each node whether it is on the CPU to choose between its C++ and
    its GPU (SIMD) fusion rules: a node on the device is compiled by the C++ backend, so it is."""
    device = node.get_device()
    return device is not None and device.type in ("cpu", NAME)


def _patch_current_backend() -> None:
    """inductor's get_current_backend answers "triton" for every device but the CPU, MPS, XPU and TPU;
    its C++ code generation (dtype propagation, index bounds checks) asks it which language a kernel
    is in: for the device, C++ (config.cpu_backend). Each module that imported the function gets the
    answer."""
    original = _utils.get_current_backend

    def get_current_backend(device_type: str | None = None) -> str:
        if (device_type or V.graph.get_current_device_or_throw().type) == NAME:
            return _config.cpu_backend
        return original(device_type)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("torch._inductor") and \
                getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend  # type: ignore[attr-defined]


def setup(module: Any) -> dict[str, Any]:
    """Register the device's op overrides for the device module ``module`` (anychip.torch); the
    code generators by the names inductor asks for."""
    global NAME, _state, _module
    NAME, _state, _module = module.NAME, module._state, module
    register_device_op_overrides(NAME, AnychipDeviceOpOverrides())
    if host_memory():
        BaseSchedulerNode.is_cpu = _is_cpu  # type: ignore[method-assign,assignment]
        _patch_current_backend()
    return CODEGENS

