"""The two places the Paddle bridge's kernels depend on Paddle's internals, checked against the
installed wheel's own headers and library: the TensorRef attributes (below) and the exception a
kernel that cannot run raises (Paddle's own EnforceNotMet, kernels_throw.cc; at the end).

Paddle's kernel C API cannot read an attribute the static executor computed in the program
(a one-element tensor standing for a Scalar or an IntArray). The bridge reads it through
``phi::KernelContext::AttrAt<phi::TensorRef>``, a symbol of Paddle's ``libphi_core.so``, and
takes the returned ``TensorRef`` as the ``const phi::DenseTensor *`` it holds (a PD_Tensor).
That holds only while (1) the symbol keeps the mangled name the bridge looks up, (2) the
library exports it, and (3) a TensorRef is that one pointer. These tests compile small C++
programs against ``paddle.sysconfig.get_include()`` and fail, saying which, when a Paddle
release changes any of them.

Skipped, saying why, where paddlepaddle or a C++ compiler is absent."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS, paddle_dir

from anychip._data import sources_dir

PADDLE = paddle_dir()
if PADDLE is None:
    pytest.skip("paddlepaddle is not installed (pip install 'anychip[paddle]')", allow_module_level=True)

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) to build against Paddle's headers")
SYMBOL_RE = re.compile(r'"(_ZNK3phi13KernelContext6AttrAt[A-Za-z0-9_]*TensorRef[A-Za-z0-9_]*)"')


def _include() -> Path:
    return PADDLE / "include"


def _bridge_symbol() -> str:
    """The mangled name the bridge's kernels look up, read from the sources anychip ships."""
    found = set()
    for src in (sources_dir() / "paddle").glob("*.c"):
        found.update(SYMBOL_RE.findall(src.read_text(errors="replace")))
    assert len(found) == 1, f"want one AttrAt<TensorRef> name in the bridge's sources, found {sorted(found)}"
    return found.pop()


def _compile(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    src = tmp_path / "check.cc"
    src.write_text(source)
    inc = _include()
    cmd = [CXX, "-std=c++17", f"-I{inc}", f"-I{inc / 'third_party'}", str(src), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_SECONDS, cwd=tmp_path)


def test_the_wheel_ships_the_headers_the_check_needs() -> None:
    inc = _include()
    for header in ("paddle/phi/common/tensor_ref.h", "paddle/phi/core/kernel_context.h"):
        assert (inc / header).is_file(), f"{header} is not in {inc}"


@pytest.mark.slow
def test_the_bridge_looks_up_the_symbol_the_headers_declare(tmp_path: Path) -> None:
    # taking the member template's address makes the compiler name the instantiation exactly as
    # libphi_core.so exports it; the object's undefined symbol is that name
    done = _compile(tmp_path, """
#include "paddle/phi/common/tensor_ref.h"
#include "paddle/phi/core/kernel_context.h"
const phi::TensorRef &(phi::KernelContext::*g_at)(size_t) const = &phi::KernelContext::AttrAt<phi::TensorRef>;
""", "-c", "-o", "check.o")
    assert done.returncode == 0, done.stderr[-3000:]
    nm = subprocess.run(["nm", "-u", str(tmp_path / "check.o")], capture_output=True, text=True, check=True).stdout
    wanted = [line.split()[-1] for line in nm.splitlines() if "AttrAt" in line]
    assert wanted == [_bridge_symbol()]


def test_libphi_core_exports_the_symbol() -> None:
    libs = sorted(PADDLE.rglob("libphi_core.so"))
    assert libs, "the wheel has no libphi_core.so"
    nm = subprocess.run(["nm", "-D", "--defined-only", str(libs[0])], capture_output=True, text=True,
                        check=True).stdout
    assert re.search(rf"\s[TW]\s{re.escape(_bridge_symbol())}$", nm, re.M), f"{libs[0]} does not export it"


@pytest.mark.slow
def test_a_tensor_ref_is_its_dense_tensor_pointer(tmp_path: Path) -> None:
    done = _compile(tmp_path, """
#include "paddle/phi/common/tensor_ref.h"
#include <cstdio>
#include <cstring>
#include <type_traits>
static_assert(sizeof(phi::TensorRef) == sizeof(const phi::DenseTensor *), "a TensorRef holds more than a pointer");
static_assert(std::is_standard_layout<phi::TensorRef>::value, "a TensorRef is not standard layout");
int main() {
    const phi::DenseTensor *p = reinterpret_cast<const phi::DenseTensor *>(0x1230);
    phi::TensorRef ref(p);
    const void *first;
    std::memcpy(&first, &ref, sizeof first);
    std::printf("%s\\n", first == static_cast<const void *>(p) && ref.Get() == p ? "same" : "differs");
    return 0;
}
""", "-o", "check")
    assert done.returncode == 0, done.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert (run.returncode, run.stdout) == (0, "same\n")


# ---- the exception a kernel that cannot run raises (paddle/kernels_throw.cc) ---------------------------

ENFORCE_RE = re.compile(r'"(_Z[A-Za-z0-9_]*EnforceNotMet[A-Za-z0-9_]*)"')


def _enforce_symbols() -> list[str]:
    """The constructor, destructor and type_info names kernels_throw.cc looks up in libphi_core.so."""
    text = (sources_dir() / "paddle" / "kernels_throw.cc").read_text()
    names = ENFORCE_RE.findall(text)
    assert len(names) == 3, f"want the constructor, destructor and type_info names, found {names}"
    return names


@pytest.mark.slow
def test_the_bridge_builds_enforce_not_met_by_the_names_the_headers_give(tmp_path: Path) -> None:
    # throwing one makes the compiler emit (weakly) the inline constructor, the destructor and the
    # type_info under the names libphi_core.so exports them by
    done = _compile(tmp_path, """
#include "paddle/common/enforce.h"
void raise_it(const common::ErrorSummary &s) { throw common::enforce::EnforceNotMet(s, "f", 1); }
""", "-c", "-o", "check.o")
    assert done.returncode == 0, done.stderr[-3000:]
    nm = subprocess.run(["nm", str(tmp_path / "check.o")], capture_output=True, text=True, check=True).stdout
    emitted = {line.split()[-1] for line in nm.splitlines()}
    assert [name for name in _enforce_symbols() if name not in emitted] == []
    libs = sorted(PADDLE.rglob("libphi_core.so"))
    exported = subprocess.run(["nm", "-D", "--defined-only", str(libs[0])], capture_output=True, text=True,
                              check=True).stdout
    assert [n for n in _enforce_symbols() if not re.search(rf"\s[TWV]\s{re.escape(n)}$", exported, re.M)] == []


@pytest.mark.slow
def test_error_summary_and_enforce_not_met_have_the_layout_the_bridge_uses(tmp_path: Path) -> None:
    """kernels_throw.cc lays out common::ErrorSummary as {int code; std::string msg;}, uses the code
    PRECONDITION_NOT_MET = 6 and allocates 512 bytes for an EnforceNotMet."""
    libs = PADDLE / "libs"          # Paddle's libcommon.so: the header's inline code calls it
    done = _compile(tmp_path, """
#include "paddle/common/enforce.h"
#include <cstdio>
#include <cstring>
#include <string>
struct error_summary { int code; std::string msg; };
static_assert(sizeof(common::ErrorSummary) == sizeof(error_summary), "ErrorSummary's size differs");
static_assert(common::ErrorCode::PRECONDITION_NOT_MET == 6, "PRECONDITION_NOT_MET is not 6");
static_assert(sizeof(common::enforce::EnforceNotMet) <= 512, "EnforceNotMet is larger than 512 bytes");
int main() {
    common::ErrorSummary s(common::ErrorCode::PRECONDITION_NOT_MET, std::string("a message"));
    const error_summary *mine = reinterpret_cast<const error_summary *>(&s);
    std::printf("%s\\n", mine->code == 6 && mine->msg == "a message" ? "same" : "differs");
    return 0;
}
""", "-o", "check", f"-L{libs}", "-lcommon", f"-Wl,-rpath,{libs}")
    assert done.returncode == 0, done.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert (run.returncode, run.stdout) == (0, "same\n")
