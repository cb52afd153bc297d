"""Build the C parts of anychip.

``anychip._lib._alloc`` is a Python extension module: the compiled core of the
caching allocator (csrc/alloc, see src/anychip/runtime/allocator.py). Every entry
of ``C_LIBRARIES`` is compiled into a plain shared library inside
the package (``src/anychip/_lib/<name>.<ext-suffix>``). They are not Python
extension modules: the backends ``dlopen`` them through cffi (ABI mode), exactly
as they would open a vendor's library. ``anychip.runtime._libs.find_library``
locates them. A C source added later only needs a line here.
"""
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# every warning is an error: the C code builds clean or not at all
COMMON_FLAGS = ["-O2", "-std=gnu11", "-fvisibility=default", "-Wall", "-Wextra", "-Werror"]

# the chip simulator's core, one file per concern (see csrc/sim/core.h)
SIM_CORE = [f"csrc/sim/{name}.c" for name in ("config", "memory", "ipc", "handles", "wait", "stream", "event")]
# the simulated chips' tensor kernels (enqueued on simulated streams)
# (the elementwise loops are split by dtype over several files, which compile in parallel)
SIM_CORE += [f"csrc/sim/{name}.c"
             for name in ("kernels", "kernels_elementwise", "kernels_ew_int8", "kernels_ew_int", "kernels_ew_half")]

# the collective engine, one file per concern (csrc/ccl/internal.h); it compiles at -O3 wherever it goes
CCL_ENGINE = [f"csrc/ccl/{name}.c" for name in ("comm", "wait", "reduce", "algorithms", "p2p", "run", "util")]

# name -> (sources, extra libraries)
C_LIBRARIES: dict[str, tuple[list[str], list[str]]] = {
    # the chip simulator: one core, one front end per vendor API (see docs/simulator.md)
    "libascend_sim": ([*SIM_CORE, "csrc/sim/acl.c"], ["dl", "m"]),
    "libkunlun_sim": ([*SIM_CORE, "csrc/sim/xpu.c"], ["dl", "m"]),
    "libhygon_sim": ([*SIM_CORE, "csrc/sim/hip.c"], ["dl", "m"]),
    # the shared-memory collective engine (see csrc/ccl/ccl.h; its files are listed in internal.h)
    "libanychip_ccl": (list(CCL_ENGINE), []),
}

# the tensor kernels (csrc/sim/kernels*.c) call libm (expf, logf, ...)
for _lib in ("libascend_sim", "libkunlun_sim", "libhygon_sim"):
    C_LIBRARIES[_lib][1].append("m")

# extra compiler flags per library (signed integer sums in the engine wrap, as NCCL's do)
EXTRA_FLAGS: dict[str, list[str]] = {"libanychip_ccl": ["-O3", "-fwrapv"]}

# the vendors' collective APIs (HCCL, BKCL, RCCL) in the simulator libraries, on the engine
# (see csrc/sim/collective.h), with the engine linked in with private symbols (ccl.h's
# CCL_EXPORT), so that the library exports only the vendors' names and anychip_sim_*
SIM_COLLECTIVES = {"libascend_sim": "hccl", "libkunlun_sim": "bkcl", "libhygon_sim": "rccl"}
for _lib, _api in SIM_COLLECTIVES.items():
    C_LIBRARIES[_lib][0].extend([f"csrc/sim/{_api}.c", "csrc/sim/collective.c", *CCL_ENGINE])
    EXTRA_FLAGS.setdefault(_lib, []).extend(["-fwrapv", '-DCCL_EXPORT=__attribute__((visibility("hidden")))'])


# The vendors' library names, for C programs built with the vendor's link lines (-lascendcl
# -lhccl, -lxpurt -lbkcl, -lamdhip64 -lrccl): in src/anychip/_lib/link, GNU ld scripts that stand
# for the simulator library (runtime and collectives are one library there), found through
# -L src/anychip/_lib (see `anychip info --cflags`). The simulator libraries carry their file name
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


# ---- the built-in chips' anychip/plugin.h adapters (csrc/adapters, see its README.md) --------
# Written against the vendor APIs only (ACL + HCCL, XPU + BKCL, HIP + RCCL): compiled into each
# simulator library (with the simulator's kernel table), which is how anychip, PyTorch and
# Paddle reach the simulated chips.
ADAPTERS = {"libascend_sim": "acl", "libkunlun_sim": "xpu", "libhygon_sim": "hip"}
for _lib, _api in ADAPTERS.items():
    C_LIBRARIES[_lib][0].append(f"csrc/adapters/{_api}/plugin_{_api}.c")
    EXTRA_FLAGS.setdefault(_lib, []).append("-DANYCHIP_SIMULATOR")
# The same adapters built for the vendors' own libraries (without the simulator's extensions):
# they link against nothing, and anychip loads the vendor's runtime and collective libraries
# with global symbols first (chips/_adapter.py), so one build serves every install of the API.
for _api in ADAPTERS.values():
    C_LIBRARIES[f"libanychip_{_api}"] = ([f"csrc/adapters/{_api}/plugin_{_api}.c"], [])
# Their error strings carry the vendors' code names: tables generated from the vendor headers
# (src/anychip/chips/_headers.py reads them for the Python side too), written under build/include
# before anything compiles and shipped with the headers.
GENERATED_INCLUDE = os.path.join("build", "include")


def _source_module(*path: str):
    """A module of the source tree that imports nothing of anychip, loaded by its path (the
    package itself is not importable before it is built)."""
    spec = importlib.util.spec_from_file_location("_anychip_" + path[-1][:-3], os.path.join(*path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_generated_headers(dest: str) -> None:
    """Under ``dest``/anychip: the adapters' code tables (src/anychip/chips/_headers.py) and
    env_defaults.h, the defaults of the variables the C parts read themselves (the one table of
    variables, src/anychip/runtime/_variables.py). A header whose text is unchanged is not rewritten
    (no rebuild)."""
    headers = _source_module("src", "anychip", "chips", "_headers.py")
    variables = _source_module("src", "anychip", "runtime", "_variables.py")
    texts = {f"adapter_codes_{api}.h": headers.c_code_table(api) for api in headers.ADAPTER_CODES}
    texts["env_defaults.h"] = variables.c_defaults_header()
    os.makedirs(os.path.join(dest, "anychip"), exist_ok=True)
    for name, text in texts.items():
        path = os.path.join(dest, "anychip", name)
        if not os.path.exists(path) or Path(path).read_text() != text:
            Path(path).write_text(text)


write_generated_headers(GENERATED_INCLUDE)
# The bridge (csrc/paddle, shipped for C plugins) over the simulated chip ANYCHIP_PADDLE names
# (the Ascend by default): paddle_custom_device/libanychip_sim next to the anychip package,
# where Paddle looks when CUSTOM_DEVICE_ROOT is unset.
os.makedirs(os.path.join("src", "paddle_custom_device"), exist_ok=True)   # an in-place build copies the bridges there


#: the persistent build directory: object files and linked libraries, each with the key of what
#: made it (the compiler, its flags and the content of every file it read), reused by every build
#: (`pip install -e .`, `setup.py build_ext --inplace`, a wheel) until that key changes
BUILD_DIR = os.path.join("build", "c")


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _read_key(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_key(path: str, key: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(key, f)
    os.replace(path + ".tmp", path)


def _dependencies(depfile: str) -> list[str]:
    """The files a compile read, from the compiler's -MMD output (``obj: src hdr ...``)."""
    with open(depfile) as f:
        text = f.read().replace("\\\n", " ")
    return sorted(set(text.partition(":")[2].split()))


def _flags(ext) -> tuple:
    """What an extension compiles its sources with (one object per source and set of flags)."""
    macros = [*ext.define_macros, *((name,) for name in ext.undef_macros)]
    return tuple(ext.extra_compile_args), tuple(ext.include_dirs), tuple(macros)


class build_clib_as_ext(build_ext):
    """Plain shared libraries: no PyInit symbol is required or exported (except by the allocator core).
    The vendor API headers (csrc/include) are installed with the package as anychip/_include,
    for C programs built against the simulator (`anychip info --cflags BACKEND`).

    Each C source is compiled once, however many libraries link it (the simulator core goes into
    all three vendor libraries), and the compiles run in parallel, one per CPU; then every
    library is linked from those objects. The build is incremental and keyed on content
    (BUILD_DIR): a source is compiled again only when it, a header it includes, its flags or
    the compiler changed, and a library is linked again only when one of its objects or its
    link flags changed."""

    def build_extensions(self):
        self.check_extensions_list(self.extensions)
        self._compiler_id = _digest(self.compiler.compiler_so, subprocess.run(
            [self.compiler.compiler_so[0], "--version"], capture_output=True, text=True).stdout)
        self._objects = self._compile_once(self.extensions)
        self.parallel = False
        super().build_extensions()

    def build_extension(self, ext):
        """Link ``ext`` into BUILD_DIR when its key changed; copy the library to its place."""
        target = self.get_ext_fullpath(ext.name)
        linked = os.path.join(BUILD_DIR, "lib", os.path.basename(target))
        flags = _flags(ext)
        key = {"objects": [self._objects[s, flags][1] for s in ext.sources], "libraries": self.get_libraries(ext),
               "link_args": ext.extra_link_args, "exports": self.get_export_symbols(ext), "compiler": self._compiler_id}
        if _read_key(linked + ".key") != key or not os.path.exists(linked):
            os.makedirs(os.path.dirname(linked), exist_ok=True)
            objects = {s: self._objects[s, flags][0] for s in ext.sources}
            compile_one_by_one, self.compiler.compile = self.compiler.compile, lambda sources, *a, **k: [
                objects[s] for s in sources]
            self.get_ext_fullpath, force = (lambda name: linked), self.force
            self.force = True              # the key decided; the base class's dates do not
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile, self.force = compile_one_by_one, force
                del self.get_ext_fullpath
            _write_key(linked + ".key", key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if _file_digest(target) != _file_digest(linked):
            shutil.copyfile(linked, target + ".tmp")     # a new file: a process that maps the old one keeps it
            os.replace(target + ".tmp", target)

    def _compile_once(self, extensions):
        """(source, flags) -> (object file, its key), every distinct pair compiled once when its key
        changed (largest first, in parallel). A source built with a second set of flags (the vendor
        adapters, with and without the simulator's extensions) gets its object in a folder of its own."""
        jobs: dict[tuple, str] = {}
        seen: dict[str, int] = {}
        for ext in extensions:
            key = _flags(ext)
            for src in ext.sources:
                if (src, key) not in jobs:
                    variant = seen[src] = seen.get(src, -1) + 1
                    jobs[src, key] = os.path.join(BUILD_DIR, "obj", *([f"variant{variant}"] if variant else []))

        def compile_source(job):
            src, (args, include_dirs, macros) = job
            if src.endswith(".cc"):            # C++ (one file): the C standard flag does not apply
                args = tuple(a for a in args if not a.startswith("-std=")) + ("-std=c++11",)
            obj = os.path.join(jobs[job], self.compiler.object_filenames([src])[0])
            flags = _digest(self._compiler_id, args, include_dirs, macros, self.debug)
            old = _read_key(obj + ".key")
            if (old.get("flags") == flags and os.path.exists(obj)
                    and all(_file_digest(path) == digest for path, digest in old.get("files", {}).items())):
                return job, (obj, _digest(old))
            self.compiler.compile([src], output_dir=jobs[job], macros=list(macros),
                                  include_dirs=list(include_dirs), debug=self.debug,
                                  extra_postargs=[*args, "-MMD", "-MF", obj + ".d"])
            key = {"flags": flags, "files": {p: _file_digest(p) for p in _dependencies(obj + ".d")}}
            _write_key(obj + ".key", key)
            return job, (obj, _digest(key))

        largest_first = sorted(jobs, key=lambda job: os.path.getsize(job[0]), reverse=True)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return dict(pool.map(compile_source, largest_first))

    def _package_dir(self) -> str:
        """Where the anychip package is built: src/anychip in place, else under build_lib."""
        return os.path.join("src" if self.inplace else self.build_lib, "anychip")

    def run(self):
        super().run()
        write_link_scripts(os.path.join(self._package_dir(), "_lib"))
        dest = os.path.join(self._package_dir(), "_include")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(os.path.join("csrc", "include"), dest)
        shutil.copytree(GENERATED_INCLUDE, dest, dirs_exist_ok=True)      # the adapters' code tables

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
# The Paddle bridge (csrc/paddle, see bridge.h there): its units, compiled one by one and linked
# (src/anychip/paddle_provider.py's build_bridge compiles the same for a C plugin), with its kernel
# layer: the phi kernels (kernels.c, over the faces' kernel tables, as for any C plugin), written
# against anychip's copy of Paddle's kernel C API (phi_capi.h) and bound to Paddle's libphi_core at
# run time, so the library builds, and the install works, with or without Paddle. A kernel that
# cannot run raises a C++ exception (kernels_throw.cc), so the C is built to unwind.
PADDLE_BRIDGE = [f"csrc/paddle/{unit}" for unit in ("init.c", "device.c", "streams.c", "memory.c", "xccl.c")]
PADDLE_KERNELS = [f"csrc/paddle/{unit}" for unit in ("kernels.c", "profiler.c", "kernels_throw.cc")]
# provider_sim.c makes it the simulated chips' bridge; every unit gets the configuration:
# the chip's library, anychip's engine (the reductions a chip lacks), the kernel layer
ext_modules.append(
    Extension("paddle_custom_device.libanychip_sim",
              sources=[*PADDLE_BRIDGE, *PADDLE_KERNELS, "csrc/paddle/provider_sim.c"],
              include_dirs=["csrc/include", "csrc"], libraries=["pthread", "dl"],
              extra_compile_args=[*COMMON_FLAGS, "-fexceptions",
                                  f'-DANYCHIP_PADDLE_SIMULATORS="../anychip/_lib/lib%s_sim{_SUFFIX}"',
                                  f'-DANYCHIP_PADDLE_CCL="../anychip/_lib/libanychip_ccl{_SUFFIX}"',
                                  "-DANYCHIP_PADDLE_KERNELS=1"]))
# CPython's method signatures fix parameters (self, args, closure) a function may not use
PY_EXT_FLAGS = [*COMMON_FLAGS, "-Wno-unused-parameter"]
ext_modules.append(Extension("anychip._lib._alloc", sources=["csrc/alloc/core.c"], depends=["csrc/alloc/stats.h"],
                             extra_compile_args=PY_EXT_FLAGS))

#: csrc's source folders a wheel carries as anychip/_src (src/anychip/_data.py's list)
SHIPPED_SOURCES = ("torch", "paddle", "adapters", "ccl")


class build_py_with_templates(build_py):
    """Ships csrc/templates (what `anychip plugin new` copies) as anychip/_templates and the sources
    of SHIPPED_SOURCES as anychip/_src in the built package (see src/anychip/_data.py); the headers go
    as anychip/_include (build_ext above)."""

    def run(self):
        super().run()
        if self.editable_mode:             # an editable install reads csrc/ in place
            return
        dst = Path(self.build_lib) / "anychip" / "_templates"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(Path("csrc") / "templates", dst, ignore=shutil.ignore_patterns("__pycache__"))
        # the sources compiled at the user's site or against a vendor's SDK (src/anychip/_data.py)
        src = Path(self.build_lib) / "anychip" / "_src"
        shutil.rmtree(src, ignore_errors=True)
        for part in SHIPPED_SOURCES:
            if (Path("csrc") / part).is_dir():
                shutil.copytree(Path("csrc") / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))


setup(ext_modules=ext_modules, cmdclass={"build_ext": build_clib_as_ext, "build_py": build_py_with_templates})
