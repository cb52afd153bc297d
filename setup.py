"""Build the C parts of anychip.

``anychip._lib._alloc`` is a Python extension module: the compiled core of the
caching allocator (csrc/alloc, see anychip/runtime/allocator.py). Every entry
of ``C_LIBRARIES`` is compiled into a plain shared library inside
the package (``anychip/_lib/<name>.<ext-suffix>``). They are not Python
extension modules: the backends ``dlopen`` them through cffi (ABI mode), exactly
as they would open a vendor's library. ``anychip.runtime._libs.find_library``
locates them. A C source added later only needs a line here.
"""
import importlib.util
import os
import shutil
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.modified import newer_group

# every warning is an error: the C code builds clean or not at all
COMMON_FLAGS = ["-O2", "-std=gnu11", "-fvisibility=default", "-Wall", "-Wextra", "-Werror"]

# the chip simulator's core, one file per concern (see csrc/sim/core.h)
SIM_CORE = [f"csrc/sim/{name}.c" for name in ("config", "memory", "ipc", "handles", "wait", "stream", "event")]
# the simulated chips' tensor kernels (enqueued on simulated streams)
# (the elementwise loops are split by dtype over several files, which compile in parallel)
SIM_CORE += [f"csrc/sim/{name}.c"
             for name in ("kernels", "kernels_elementwise", "kernels_ew_int8", "kernels_ew_int", "kernels_ew_half")]

# name -> (sources, extra libraries)
C_LIBRARIES: dict[str, tuple[list[str], list[str]]] = {
    # the chip simulator: one core, one front end per vendor API (see docs/simulator.md)
    "libascend_sim": ([*SIM_CORE, "csrc/sim/acl.c"], ["dl", "m"]),
    "libkunlun_sim": ([*SIM_CORE, "csrc/sim/xpu.c"], ["dl", "m"]),
    "libhygon_sim": ([*SIM_CORE, "csrc/sim/hip.c"], ["dl", "m"]),
    # the shared-memory collective engine (see csrc/ccl/ccl.h)
    "libanychip_ccl": (["csrc/ccl/ccl.c"], []),
}

# the tensor kernels (csrc/sim/kernels*.c) call libm (expf, logf, ...)
for _lib in ("libascend_sim", "libkunlun_sim", "libhygon_sim"):
    C_LIBRARIES[_lib][1].append("m")

# extra compiler flags per library (signed integer sums in the engine wrap, as NCCL's do)
EXTRA_FLAGS: dict[str, list[str]] = {"libanychip_ccl": ["-O3", "-fwrapv"]}

# the vendors' collective APIs (HCCL, BKCL, RCCL) in the simulator libraries, on the engine
# (see csrc/sim/collective.h); ccl_embed.c compiles the engine in with private symbols
SIM_COLLECTIVES = {"libascend_sim": "hccl", "libkunlun_sim": "bkcl", "libhygon_sim": "rccl"}
for _lib, _api in SIM_COLLECTIVES.items():
    C_LIBRARIES[_lib][0].extend([f"csrc/sim/{_api}.c", "csrc/sim/collective.c", "csrc/sim/ccl_embed.c"])
    EXTRA_FLAGS.setdefault(_lib, []).append("-fwrapv")      # ccl_embed.c raises the engine to -O3


# The vendors' library names, for C programs built with the vendor's link lines (-lascendcl
# -lhccl, -lxpurt -lbkcl, -lamdhip64 -lrccl): in anychip/_lib/link, GNU ld scripts that stand
# for the simulator library (runtime and collectives are one library there), found through
# -L anychip/_lib (see `anychip info --cflags`). The simulator libraries carry their file name
# as SONAME, so a program linked through a script needs them by name (the rpath finds them).
_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
VENDOR_NAMES = {"libascend_sim": ("libascendcl.so", "libhccl.so"), "libkunlun_sim": ("libxpurt.so", "libbkcl.so"),
                "libhygon_sim": ("libamdhip64.so", "librccl.so")}
# -Bsymbolic: the simulator's own calls (its plugin.h adapter calling its ACL, say) stay inside it,
# even where a vendor's library exporting the same names was loaded with global symbols first
LINK_FLAGS: dict[str, list[str]] = {name: [f"-Wl,-soname,{name}{_SUFFIX}", "-Wl,-Bsymbolic"] for name in VENDOR_NAMES}


def write_link_scripts(lib_dir: str) -> None:
    link = os.path.join(lib_dir, "link")
    shutil.rmtree(link, ignore_errors=True)
    os.makedirs(link)
    for sim, names in VENDOR_NAMES.items():
        for name in names:
            with open(os.path.join(link, name), "w") as f:
                f.write(f"/* GNU ld script: {name} is the anychip simulator's {sim} */\nINPUT({sim}{_SUFFIX})\n")


# ---- Paddle CustomDevice provider (see docs/paddle.md, "Paddle on anychip") ---------------
# The simulated chips' anychip/plugin.h faces: adapters written against the vendor APIs only
# (ACL + HCCL, XPU + BKCL, HIP + RCCL), compiled into each simulator library.
SIM_PLUGIN_FACES = {"libascend_sim": "plugin_acl", "libkunlun_sim": "plugin_xpu", "libhygon_sim": "plugin_hip"}
for _lib, _face in SIM_PLUGIN_FACES.items():
    C_LIBRARIES[_lib][0].append(f"csrc/sim/{_face}.c")
    EXTRA_FLAGS.setdefault(_lib, []).append("-DANYCHIP_SIMULATOR")
# The same adapters built for the vendors' own libraries (without the simulator's extensions):
# they link against nothing, and anychip loads the vendor's runtime and collective libraries
# with global symbols first (devices/_adapter.py), so one build serves every install of the API.
for _face in SIM_PLUGIN_FACES.values():
    C_LIBRARIES[f"libanychip_{_face[len('plugin_'):]}"] = ([f"csrc/sim/{_face}.c"], [])
# Their error strings carry the vendors' code names: tables generated from the vendor headers
# (anychip/devices/_headers.py reads them for the Python side too), written under build/include
# before anything compiles and shipped with the headers.
GENERATED_INCLUDE = os.path.join("build", "include")


def write_code_tables(dest: str) -> None:
    spec = importlib.util.spec_from_file_location("_anychip_headers", os.path.join("anychip", "devices", "_headers.py"))
    headers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headers)
    os.makedirs(os.path.join(dest, "anychip"), exist_ok=True)
    for api in headers.ADAPTER_CODES:
        path = os.path.join(dest, "anychip", f"adapter_codes_{api}.h")
        text = headers.c_code_table(api)
        if not os.path.exists(path) or Path(path).read_text() != text:     # unchanged: no rebuild
            Path(path).write_text(text)


write_code_tables(GENERATED_INCLUDE)
# The bridge (csrc/include/anychip/paddle/bridge.c, shipped for C plugins) over the simulated
# chip ANYCHIP_PADDLE names (the Ascend by default): paddle_custom_device/libanychip_sim next
# to the anychip package, where Paddle looks when CUSTOM_DEVICE_ROOT is unset.
os.makedirs("paddle_custom_device", exist_ok=True)   # an in-place build copies the bridges there


class build_clib_as_ext(build_ext):
    """Plain shared libraries: no PyInit symbol is required or exported (except by the allocator core).
    The vendor API headers (csrc/include) are installed with the package as anychip/_include,
    for C programs built against the simulator (`anychip info --cflags BACKEND`).

    Each C source is compiled once, however many libraries link it (the simulator core goes into
    all three vendor libraries), and the compiles run in parallel, one per CPU; then every
    library is linked from those objects."""

    def build_extensions(self):
        self.check_extensions_list(self.extensions)
        objects = self._compile_once([e for e in self.extensions if self._stale(e)])
        compile_one_by_one = self.compiler.compile

        def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                    extra_postargs=None, depends=None):
            key = (tuple(extra_postargs or ()), tuple(include_dirs or ()), tuple(macros or ()))
            if all((s, key) in objects for s in sources):
                return [objects[s, key] for s in sources]
            return compile_one_by_one(sources, output_dir, macros, include_dirs, debug, extra_preargs,
                                      extra_postargs, depends)

        self.compiler.compile = compile
        self.parallel = False
        super().build_extensions()

    def _stale(self, ext):
        inputs = list(ext.sources) + list(ext.depends)
        return self.force or newer_group(inputs, self.get_ext_fullpath(ext.name), "newer")

    def _compile_once(self, extensions):
        """(source, flags) -> object file, every distinct pair compiled once (largest first, in
        parallel). A source built with a second set of flags (the vendor adapters, with and
        without the simulator's extensions) gets its object in a folder of its own."""
        jobs: dict[tuple, str] = {}
        seen: dict[str, int] = {}
        for ext in extensions:
            macros = [*ext.define_macros, *((name,) for name in ext.undef_macros)]
            key = (tuple(ext.extra_compile_args), tuple(ext.include_dirs), tuple(macros))
            for src in ext.sources:
                if (src, key) not in jobs:
                    variant = seen[src] = seen.get(src, -1) + 1
                    jobs[src, key] = os.path.join(self.build_temp, f"variant{variant}") if variant else self.build_temp

        def compile_source(job):
            src, (args, include_dirs, macros) = job
            if src.endswith(".cc"):            # C++ (one file): the C standard flag does not apply
                args = tuple(a for a in args if not a.startswith("-std=")) + ("-std=c++11",)
            return job, self.compiler.compile([src], output_dir=jobs[job], macros=list(macros),
                                              include_dirs=list(include_dirs), debug=self.debug,
                                              extra_postargs=list(args))[0]

        largest_first = sorted(jobs, key=lambda job: os.path.getsize(job[0]), reverse=True)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return dict(pool.map(compile_source, largest_first))

    def run(self):
        super().run()
        write_link_scripts(os.path.join("anychip" if self.inplace else os.path.join(self.build_lib, "anychip"), "_lib"))
        dest = os.path.join("anychip" if self.inplace else os.path.join(self.build_lib, "anychip"), "_include")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(os.path.join("csrc", "include"), dest)
        shutil.copytree(GENERATED_INCLUDE, dest, dirs_exist_ok=True)      # the adapters' code tables
        # the engine's header, for the Paddle bridges `anychip plugin paddle` compiles
        os.makedirs(os.path.join(dest, "ccl"), exist_ok=True)
        shutil.copy(os.path.join("csrc", "ccl", "ccl.h"), os.path.join(dest, "ccl", "ccl.h"))

    def get_export_symbols(self, ext):
        return super().get_export_symbols(ext) if ext.name == "anychip._lib._alloc" else []


ext_modules = [
    Extension(
        f"anychip._lib.{name}",
        sources=sources,
        include_dirs=["csrc/include", "csrc", GENERATED_INCLUDE],
        extra_compile_args=COMMON_FLAGS + EXTRA_FLAGS.get(name, []),
        libraries=["pthread", "rt", *libs],
        extra_link_args=LINK_FLAGS.get(name, []),
    )
    for name, (sources, libs) in C_LIBRARIES.items()
]
# With it, the bridge's phi kernels (csrc/include/anychip/paddle/kernels.c, over the faces' kernel
# tables, as for any C plugin): written against anychip's copy of Paddle's kernel C API
# (phi_capi.h) and bound to Paddle's libphi_core at run time, so the library builds, and the
# install works, with or without Paddle. A kernel that cannot run raises a C++ exception
# (kernels_throw.cc), so the C is built to unwind.
ext_modules.append(
    Extension("paddle_custom_device.libanychip_sim",
              sources=["csrc/paddle/provider_sim.c", "csrc/include/anychip/paddle/kernels_throw.cc"],
              depends=["csrc/include/anychip/paddle/bridge.c", "csrc/include/anychip/paddle/device_ext.h",
                       "csrc/include/anychip/paddle/phi_capi.h", "csrc/include/anychip/paddle/kernels.c",
                       "csrc/include/anychip/paddle/profiler.c",
                       "csrc/include/anychip/plugin.h"],
              include_dirs=["csrc/include", "csrc"], libraries=["pthread", "dl"],
              extra_compile_args=[*COMMON_FLAGS, "-fexceptions", f'-DANYCHIP_EXT_SUFFIX="{_SUFFIX}"']))
# CPython's method signatures fix parameters (self, args, closure) a function may not use
PY_EXT_FLAGS = [*COMMON_FLAGS, "-Wno-unused-parameter"]
ext_modules.append(Extension("anychip._lib._alloc", sources=["csrc/alloc/core.c"], depends=["csrc/alloc/stats.h"],
                             extra_compile_args=PY_EXT_FLAGS))

class build_py_with_templates(build_py):
    """Ships csrc/templates (what `anychip plugin new` copies) as anychip/_templates in the
    built package (see anychip/_data.py); the headers go as anychip/_include (build_ext above)."""

    def run(self):
        super().run()
        if self.editable_mode:             # an editable install reads csrc/ in place
            return
        dst = Path(self.build_lib) / "anychip" / "_templates"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(Path("csrc") / "templates", dst, ignore=shutil.ignore_patterns("__pycache__"))


setup(ext_modules=ext_modules, cmdclass={"build_ext": build_clib_as_ext, "build_py": build_py_with_templates})
