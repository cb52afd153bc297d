"""Huawei Ascend NPUs: the ACL + HCCL adapter (csrc/adapters/acl/plugin_acl.c) as a backend.

On CANN (libascendcl.so and libhccl.so) the adapter built for the vendor's libraries binds
to them; without CANN (and ``ANYCHIP_SIMULATE`` not ``never``) the simulator library
``libascend_sim``, which implements ACL and HCCL with the adapter compiled in, stands in.
Discovery and the rest are chips/_adapter.py's.
"""
from __future__ import annotations

from ._adapter import VendorAdapter, roots
from ._headers import ADAPTER_CODES, Codes

__all__ = ["AscendPlugin"]


class AscendPlugin(VendorAdapter):
    name = "ascend"
    priority = 30
    vendor_libraries = ("libascendcl.so",)
    ccl_libraries = ("libhccl.so",)
    simulator_library = "libascend_sim"
    adapter_library = "libanychip_acl"
    ccl_api = "HCCL"
    api_label = "Ascend ACL runtime"
    #: aclError (acl/acl.h) and HcclResult (hccl/hccl_types.h): ACL's codes lie far above HCCL's
    code_names = Codes(*ADAPTER_CODES["acl"])
    oom_codes = frozenset({200000})              # ACL_ERROR_BAD_ALLOC (the table names ACL_ERROR_RT_MEMORY_ALLOCATION)

    ccl_invalid_codes = frozenset({1, 2, 5})        # HCCL_E_PARA, HCCL_E_PTR, HCCL_E_NOT_SUPPORT

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"), ("/usr/local/Ascend/ascend-toolkit/latest",)):
            dirs += [f"{root}/lib64", f"{root}/runtime/lib64", f"{root}/acllib/lib64", f"{root}/lib"]
        return dirs
