"""Baidu Kunlun XPUs: the XPU + BKCL adapter (csrc/adapters/xpu/plugin_xpu.c) as a backend.

On the XPU runtime (libxpurt.so and libbkcl.so) the adapter built for the vendor's libraries
binds to them; without it (and ``ANYCHIP_SIMULATE`` not ``never``) the simulator library
``libkunlun_sim`` stands in. The XPU runtime has no memset, no event timing and no
free-memory query: on the vendor's library the adapter leaves them out (anychip's C plugin
fallbacks serve: fills from host copies, capacity as free memory); the simulator's adapter
has them. Discovery and the rest are chips/_adapter.py's.
"""
from __future__ import annotations

from ._adapter import VendorAdapter, roots
from ._headers import ADAPTER_CODES, Codes

__all__ = ["KunlunPlugin"]


class KunlunPlugin(VendorAdapter):
    name = "kunlun"
    priority = 20
    vendor_libraries = ("libxpurt.so",)
    ccl_libraries = ("libbkcl.so",)
    ccl_roots = (("BKCL_HOME", "XCCL_HOME"), ("/usr/local/xccl", "/usr/local/bkcl"))
    simulator_library = "libkunlun_sim"
    adapter_library = "libanychip_xpu"
    ccl_api = "BKCL"
    api_label = "Kunlun XPU runtime"
    #: XPUError_t (xpu/runtime.h) and BKCLResult_t (bkcl/bkcl.h): BKCL's codes lie below XPU's
    code_names = Codes(*ADAPTER_CODES["xpu"])

    ccl_invalid_codes = frozenset({1})        # BKCL_INVALID_ARGUMENT

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("XPU_HOME", "XPURT_HOME"), ("/usr/local/xpu", "/opt/xpu", "/usr/local/xpurt")):
            dirs += [f"{root}/lib64", f"{root}/lib", f"{root}/so", f"{root}/xre/so", f"{root}/runtime/lib64"]
        return dirs

    def code_name(self, code: int) -> str:
        return self.code_names.get(abs(code), f"status {code}")     # some releases return -code
