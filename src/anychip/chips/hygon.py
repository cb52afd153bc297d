"""Hygon DCUs: the HIP + RCCL adapter (csrc/adapters/hip/plugin_hip.c) as a backend.

On a HIP runtime (libamdhip64.so, or libgalaxyhip.so from Hygon's DTK, and librccl.so) the
adapter built for the vendor's libraries binds to them; without one (and
``ANYCHIP_SIMULATE`` not ``never``) the simulator library ``libhygon_sim`` stands in.
Discovery and the rest are chips/_adapter.py's.
"""
from __future__ import annotations

from ._adapter import VendorAdapter, roots
from ._headers import ADAPTER_CODES, Codes

__all__ = ["HygonPlugin"]

class HygonPlugin(VendorAdapter):
    name = "hygon"
    priority = 10
    vendor_libraries = ("libamdhip64.so", "libgalaxyhip.so")
    ccl_libraries = ("librccl.so", "librccl.so.1")
    simulator_library = "libhygon_sim"
    adapter_library = "libanychip_hip"
    ccl_api = "RCCL"
    api_label = "HIP runtime"
    #: hipError_t (hip/hip_runtime_api.h), and ncclResult_t (rccl/rccl.h) past RCCL_BASE (plugin_hip.c)
    code_names = Codes(*ADAPTER_CODES["hip"])

    ccl_invalid_codes = frozenset({10004})        # ncclInvalidArgument past RCCL_BASE

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("ROCM_PATH", "HIP_PATH", "DTK_HOME"), ("/opt/dtk", "/opt/rocm")):
            dirs += [f"{root}/lib", f"{root}/lib64", f"{root}/hip/lib"]
        return dirs
