"""One header per vendor API: csrc/include holds the declarations of ACL + HCCL, XPU + BKCL
and HIP + RCCL (plus the simulator's own controls, anychip/sim.h). The simulator is compiled
against them, the Python backends give cffi their marked section, they are installed with the
package, and ``anychip info --cflags BACKEND`` builds a C program against them unchanged.
"""
from __future__ import annotations

import filecmp
import os
import shlex
import shutil
import subprocess
import sys

import cffi
import pytest
from conftest import CHILD_SECONDS

from anychip.chips import _headers
from anychip.chips.ascend import AscendPlugin
from anychip.chips.hygon import HygonPlugin
from anychip.chips.kunlun import KunlunPlugin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_INCLUDE = os.path.join(ROOT, "csrc", "include")

HEADERS = [("acl/acl.h",), ("xpu/runtime.h",), ("hip/hip_runtime_api.h",), ("hccl/hccl_types.h", "hccl/hccl.h"),
           ("bkcl/bkcl.h",), ("rccl/rccl.h",), ("anychip/sim.h",)]


@pytest.mark.parametrize("headers", HEADERS, ids=[h[-1] for h in HEADERS])
def test_marked_sections_are_valid_cffi_declarations(headers):
    ffi = cffi.FFI()
    ffi.cdef(_headers.cdef_of(*headers))


def test_code_names_are_read_from_the_headers():
    """The backends' and the adapters' names of the vendors' codes come from the headers, one
    table per adapter (runtime and collective library; RCCL's past RCCL_BASE)."""
    names = AscendPlugin.code_names
    assert names[207001] == "ACL_ERROR_RT_MEMORY_ALLOCATION" and names[0] == "ACL_SUCCESS"
    assert names[1] == "HCCL_E_PARA" and names[9] == "HCCL_E_TIMEOUT"
    assert KunlunPlugin.code_names[705] == "XPUERR_NOMEM" and KunlunPlugin.code_names[1] == "BKCL_INVALID_ARGUMENT"
    assert HygonPlugin.code_names[2] == "hipErrorOutOfMemory" and HygonPlugin.code_names[10004] == "ncclInvalidArgument"
    with open(os.path.join(SOURCE_INCLUDE, "acl", "acl.h")) as f:
        defined = {line.split()[1] for line in f if line.startswith("#define ACL_ERROR_")}
    assert defined - {"ACL_ERROR_NONE"} <= set(names.values())       # (0 is named ACL_SUCCESS)
    table = _headers.c_code_table("acl")
    assert '{207001, "ACL_ERROR_RT_MEMORY_ALLOCATION"}' in table and '{1, "HCCL_E_PARA"}' in table
    with pytest.raises(ValueError, match="no enum"):
        _headers.code_names("acl/acl.h", "noSuchEnum_t")


def test_values_seen_through_cffi_are_the_vendors():
    ffi = cffi.FFI()
    ffi.cdef(_headers.cdef_of("hip/hip_runtime_api.h"))
    assert ffi.sizeof("hipDeviceProp_tR0600") == 1472
    assert ffi.offsetof("hipDeviceProp_tR0600", "totalGlobalMem") == 288
    lib = ffi.dlopen(None)
    assert (lib.hipDeviceAttributeWarpSize, lib.hipEventDisableTiming, lib.hipErrorInvalidHandle) == (87, 2, 400)
    ffi = cffi.FFI()
    ffi.cdef(_headers.cdef_of("acl/acl.h"))
    lib = ffi.dlopen(None)
    assert (lib.ACL_ERROR_RT_NO_DEVICE, lib.ACL_HBM_MEM_P2P_HUGE1G, lib.ACL_MEMCPY_DEFAULT) == (207004, 11, 4)
    assert (lib.ACL_ERROR_RT_STREAM_NO_CB_REG, lib.ACL_EVENT_WAIT_STATUS_NOT_READY) == (107015, 1)


def test_a_directive_between_the_markers_is_refused(tmp_path, monkeypatch):
    (tmp_path / "acl").mkdir()
    (tmp_path / "acl" / "acl.h").write_text("/* ANYCHIP-CDEF-BEGIN */\n#define OK_VALUE 0x10\n"
                                            "#include <stdio.h>\n/* ANYCHIP-CDEF-END */\n")
    monkeypatch.setattr(_headers, "include_dir", lambda: str(tmp_path))
    with pytest.raises(ValueError, match=r"'#include <stdio.h>' cannot be given to cffi"):
        _headers.cdef_of.__wrapped__("acl/acl.h")
    (tmp_path / "acl" / "bare.h").write_text("int f(void);\n")
    with pytest.raises(ValueError, match="has no /\\* ANYCHIP-CDEF-BEGIN \\*/"):
        _headers.cdef_of.__wrapped__("acl/bare.h")


def test_the_headers_are_installed_with_the_package():
    installed = os.path.join(os.path.dirname(_headers.__file__), "..", "_include")
    if not os.path.isdir(installed):
        pytest.skip("running from a source tree that was not built")
    for dirpath, _, files in os.walk(SOURCE_INCLUDE):
        rel = os.path.relpath(dirpath, SOURCE_INCLUDE)
        for f in files:
            assert filecmp.cmp(os.path.join(dirpath, f), os.path.join(installed, rel, f), shallow=False), (rel, f)
    assert _headers.include_dir() == os.path.realpath(installed) or os.path.samefile(_headers.include_dir(),
                                                                                       installed)


PROGRAMS = {
    "ascend": r"""
#include <stdio.h>
#include <acl/acl.h>
#include <acl/acl_prof.h>
#include <hccl/hccl.h>
int main(void) {
    uint32_t n = 0;
    if (aclInit(NULL) != ACL_SUCCESS || aclrtGetDeviceCount(&n) != ACL_SUCCESS) return 1;
    printf("%u %s\n", n, HcclGetErrorString(HCCL_E_PARA) ? "hccl" : "none");
    return aclFinalize();
}""",
    "kunlun": r"""
#include <stdio.h>
#include <xpu/runtime.h>
#include <bkcl/bkcl.h>
int main(void) {
    int n = 0;
    BKCLUniqueId id;
    if (xpu_device_count(&n) != XPU_SUCCESS || bkcl_get_unique_id(&id) != BKCL_SUCCESS) return 1;
    printf("%d bkcl\n", n);
    return 0;
}""",
    "hygon": r"""
#include <stdio.h>
#include <hip/hip_runtime.h>
#include <rccl/rccl.h>
int main(void) {
    hipDeviceProp_t p;
    int v = 0;
    if (hipGetDeviceProperties(&p, 0) != hipSuccess || ncclGetVersion(&v) != ncclSuccess) return 1;
    printf("%d %s\n", v, p.gcnArchName);
    return 0;
}""",
}
EXPECTED = {"ascend": "8 hccl", "kunlun": "8 bkcl", "hygon": "22005 gfx906:sramecc+:xnack-"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith("ANYCHIP_SIM")}
    return subprocess.run([sys.executable, "-m", "anychip.cli", *args], capture_output=True, text=True, env=env,
                          timeout=CHILD_SECONDS)


@pytest.mark.parametrize("backend", sorted(PROGRAMS))
@pytest.mark.slow
def test_cflags_build_a_program_written_for_the_vendor_api(tmp_path, backend):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    out = _cli("info", "--cflags", backend)
    assert out.returncode == 0, out.stderr
    flags = shlex.split(out.stdout)
    assert flags[0] == f"-I{_headers.include_dir()}"
    src = tmp_path / f"{backend}.c"
    src.write_text(PROGRAMS[backend])
    exe = tmp_path / backend
    build = subprocess.run([gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", str(src), "-o", str(exe), *flags],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith("ANYCHIP_SIM")}
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == EXPECTED[backend]


@pytest.mark.slow
def test_cflags_of_a_backend_without_a_c_api():
    out = _cli("info", "--cflags", "cuda")
    assert out.returncode == 1
    assert "no C API for backend 'cuda'; want one of ascend, kunlun, hygon" in out.stderr


# A collective program linked with the vendor's link line (runtime and collective library by
# their vendor names) against the simulator: the names are linker scripts for the one
# simulator library, which the program then needs by its SONAME.
COLLECTIVE_PROGRAMS = {"ascend": ("hccl_v.c", "hccl v", ("-lascendcl", "-lhccl")),
                       "kunlun": ("bkcl_v.c", "bkcl v", ("-lxpurt", "-lbkcl")),
                       "hygon": ("nccl_split.c", "nccl split", ("-lamdhip64", "-lrccl"))}


@pytest.mark.parametrize("backend", sorted(COLLECTIVE_PROGRAMS))
@pytest.mark.slow
def test_cflags_link_a_collective_program_by_the_vendor_library_names(tmp_path, backend):
    gcc, readelf = shutil.which("gcc") or shutil.which("cc"), shutil.which("readelf")
    if gcc is None or readelf is None:
        pytest.skip("no C compiler or readelf")
    source, tag, libs = COLLECTIVE_PROGRAMS[backend]
    out = _cli("info", "--cflags", backend)
    assert out.returncode == 0, out.stderr
    flags = shlex.split(out.stdout)
    assert [f for f in flags if f.startswith("-l") and f != "-lpthread"] == list(libs)
    exe = tmp_path / backend
    build = subprocess.run([gcc, "-std=c11", "-Wall", "-Werror", "-Werror=implicit-function-declaration",
                            os.path.join(ROOT, "tests", "c", source), "-o", str(exe), *flags],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    needed = subprocess.run([readelf, "-d", str(exe)], capture_output=True, text=True, check=True).stdout
    sim = {"ascend": "libascend_sim", "kunlun": "libkunlun_sim", "hygon": "libhygon_sim"}[backend]
    assert f"Shared library: [{sim}." in needed, needed        # by SONAME, found through the rpath
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith(("ANYCHIP_SIM", "ANYCHIP_CCL"))}
    run = subprocess.run([str(exe), "2"], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.stdout.splitlines()) == [f"{tag} ok rank 0", f"{tag} ok rank 1"]


def test_cflags_on_a_vendor_install_name_both_vendor_libraries(monkeypatch):
    """No vendor install here: a plugin that found one (CANN's lib64 with libascendcl.so and
    libhccl.so) stands in for it; the flags link both of the vendor's files."""

    class Found:
        simulated = False
        library_path = "/opt/cann/lib64/libascendcl.so"
        ccl_path = "/opt/cann/hccl/lib64/libhccl.so"

        def available(self) -> tuple[bool, str]:
            return True, ""

    monkeypatch.setattr(sys.modules[AscendPlugin.__module__], "AscendPlugin", Found)
    assert _headers.cflags("ascend") == (
        f"-I{_headers.include_dir()} -L/opt/cann/lib64 -L/opt/cann/hccl/lib64 -l:libascendcl.so -l:libhccl.so "
        "-Wl,-rpath,/opt/cann/lib64 -Wl,-rpath,/opt/cann/hccl/lib64 -lpthread")
