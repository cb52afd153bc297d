"""Build the C parts of anychip.

Every entry of ``C_LIBRARIES`` is compiled into a plain shared library inside
the package (``anychip/_lib/<name>.<ext-suffix>``). They are not Python
extension modules: the backends ``dlopen`` them through cffi (ABI mode), exactly
as they would open a vendor's library. ``anychip.runtime._libs.find_library``
locates them. A C source added later only needs a line here.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMMON_FLAGS = ["-O2", "-std=gnu11", "-fvisibility=default", "-Wall", "-Wno-unused-function"]

# name -> (sources, extra libraries)
C_LIBRARIES: dict[str, tuple[list[str], list[str]]] = {
    # the chip simulator: one core, one front end per vendor API (see docs/simulator.md)
    "libascend_sim": (["csrc/sim/core.c", "csrc/sim/acl.c"], []),
    "libkunlun_sim": (["csrc/sim/core.c", "csrc/sim/xpu.c"], []),
    "libhygon_sim": (["csrc/sim/core.c", "csrc/sim/hip.c"], []),
    # the shared-memory collective engine (see csrc/ccl/ccl.h)
    "libanychip_ccl": (["csrc/ccl/ccl.c"], []),
}

# extra compiler flags per library (signed integer sums in the engine wrap, as NCCL's do)
EXTRA_FLAGS: dict[str, list[str]] = {"libanychip_ccl": ["-O3", "-fwrapv"]}

# the vendors' collective APIs (HCCL, BKCL, RCCL) in the simulator libraries, on the engine
# (see csrc/sim/collective.h); ccl_embed.c compiles the engine in with private symbols
SIM_COLLECTIVES = {"libascend_sim": "hccl", "libkunlun_sim": "bkcl", "libhygon_sim": "rccl"}
for _lib, _api in SIM_COLLECTIVES.items():
    C_LIBRARIES[_lib][0].extend([f"csrc/sim/{_api}.c", "csrc/sim/collective.c", "csrc/sim/ccl_embed.c"])
    EXTRA_FLAGS.setdefault(_lib, []).extend(["-O3", "-fwrapv"])


class build_clib_as_ext(build_ext):
    """Plain shared libraries: no PyInit symbol is required or exported."""

    def get_export_symbols(self, ext):
        return []


ext_modules = [
    Extension(
        f"anychip._lib.{name}",
        sources=sources,
        include_dirs=["csrc/include", "csrc"],
        extra_compile_args=COMMON_FLAGS + EXTRA_FLAGS.get(name, []),
        libraries=["pthread", "rt", *libs],
    )
    for name, (sources, libs) in C_LIBRARIES.items()
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_clib_as_ext})
