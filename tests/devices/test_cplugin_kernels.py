"""The kernel table of C plugins (anychip/plugin.h minor 1): the tensor layer's kernel set, and
`anychip plugin check`'s comparison of every entry and claimed dtype with NumPy.

The plugins are the scaffolded device (`anychip plugin new`, whose src/kernels.c fills the
table) and variants of it from tests/c/plugin_variants.c (a table of float32 only, none, an
ABI 1.0 plugin, an unknown table version, a mask bit beyond bool, planted kernel defects).
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CHILD_SECONDS, build_template_wrapper

import anychip
from anychip.chips import cplugin
from anychip.chips._plugin_kernels import PluginKernels
from anychip.conformance.kernel_table import check_kernel_table
from anychip.runtime import kernels_of, registry
from anychip.runtime.plugin import D2H
from anychip.scaffold import new_plugin

HERE = Path(__file__).parent
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build the test plugins")
VARIANTS = {"KERNELS_F32": "tkf32", "KERNELS_NONE": "tknone", "MINOR0": "tkminor0", "KERNELS_V2": "tkv2",
            "KERNELS_BADMASK": "tkbadmask", "KERNELS_MUTANT": "tkmutant"}
ANYCHIP = [sys.executable, "-m", "anychip.cli"]


def build_variant(project: Path, variant: str, name: str, out: Path) -> Path:
    lib = out / f"lib{name}.so"
    return build_template_wrapper(CC, project, HERE.parent / "c" / "plugin_variants.c", lib,
                                  f'-DNAME="{name}"', f"-DVARIANT_{variant}", roots=(project.parent,))


@pytest.fixture(scope="module")
def variant_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kvariants")
    project = new_plugin("tmpl", "c", root)
    return {v: build_variant(project, v, name, root) for v, name in VARIANTS.items()}


@pytest.fixture
def load(variant_libs: dict[str, Path]):
    """Load a variant as a registered backend for the test: (its device 0, its plugin)."""
    names: list[str] = []

    def use(variant: str) -> tuple[anychip.Device, Any]:
        name, loader = cplugin.probe(str(variant_libs[variant]))
        plugin = loader()
        registry.register_plugin(plugin, source=f"variant {variant}")
        names.append(name)
        return anychip.device(f"{name}:0"), plugin
    yield use
    for name in names:
        anychip.device(f"{name}:0").synchronize()
        registry.unregister_plugin(name)


def _d2h_copies(monkeypatch: pytest.MonkeyPatch, plugin: Any) -> list[int]:
    """Count the device-to-host copies of ``plugin`` (the host fallback reads its inputs so)."""
    seen: list[int] = []
    real = plugin._copy

    def counted(index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
                stream: Any) -> None:
        if kind == D2H:
            seen.append(nbytes)
        real(index, dst, dst_off, src, src_off, nbytes, kind, stream)
    monkeypatch.setattr(plugin, "_copy", counted)
    return seen


# -- the scaffold's table ---------------------------------------------------------------

def test_the_scaffolds_table_is_its_kernel_set(scaffold_device: anychip.Device) -> None:
    k = scaffold_device.plugin.kernels
    assert isinstance(k, PluginKernels) and kernels_of(scaffold_device).set is k
    assert k.masks == {"binary": 0x1FF, "unary": 0x1FF, "reduce": 0x1FF, "gemm": 0xF0, "fill": 0x1FF}
    assert scaffold_device.plugin.kernels_problem() is None
    yes = [("add", "int8"), ("add", "float16"), ("eq", "bool"), ("maximum", "bool"), ("div", "bfloat16"),
           ("copy", "bool"), ("sqrt", "float64"), ("sum", "bool"), ("max", "int64"), ("matmul", "float16")]
    no = [("div", "int32"), ("add", "bool"), ("relu", "bool"), ("exp", "int64"), ("sqrt", "int32"),
          ("matmul", "int32"), ("pow", "float32"), ("tanh", "float32"), ("erf", "float32"), ("add", "complex64")]
    assert [op for op in yes if not k.supports(0, *op)] == []
    assert [op for op in no if k.supports(0, *op)] == []


def test_tensor_ops_run_on_the_device_through_the_table(scaffold_device: anychip.Device,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    dev = scaffold_device
    x_np = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    x = anychip.tensor(x_np, device=dev)
    w = anychip.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2), device=dev)
    launches = dev.plugin.kernels.launches
    launches.clear()
    d2h = _d2h_copies(monkeypatch, dev.plugin)
    s = x + x.T.contiguous().T                  # a transposed copy (unary), then add (binary)
    assert launches == Counter(unary=1, binary=1)
    r = (s @ w).relu()
    m = (x > 0).cast("int64").sum(axis=0)
    f = x.cast("float16").mean(axis=1)
    assert launches == Counter(unary=4, binary=2, gemm=1, reduce=2)   # relu and two casts
    assert d2h == []                            # nothing read back: no host fallback
    np.testing.assert_array_equal(s.numpy(), x_np * 2)
    np.testing.assert_allclose(r.numpy(), np.maximum((x_np * 2) @ w.numpy(), 0), rtol=1e-6)
    assert m.tolist() == [1, 1, 2, 2] and m.dtype.name == "int64"
    np.testing.assert_array_equal(f.numpy(), x_np.astype(np.float16).mean(axis=1, dtype=np.float32)
                                  .astype(np.float16))


def _gemm_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The scaffold's GEMM: each sum adds its terms kk ascending, in float for float32 and float16
    (in double for float64), each product and each sum rounded, then rounded to the dtype."""
    acc_type = np.float64 if a.dtype == np.float64 else np.float32
    acc = np.zeros((a.shape[0], b.shape[1]), acc_type)
    for kk in range(a.shape[1]):
        acc += a[:, kk, None].astype(acc_type) * b[None, kk, :].astype(acc_type)
    return acc.astype(a.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_the_scaffolds_blocked_loops_give_the_reference_results(scaffold_device: anychip.Device,
                                                                dtype: str) -> None:
    """The scaffold's tiled GEMM (6 x 16 float sums or 6 x 8 double sums in registers, operands
    packed into zero-padded panels) and its row loops (broadcast and transposed operands, column
    sums) give exactly the one-sum-at-a-time reference: shapes with every remainder (m % 6,
    n % 16 and n % 8), transposed operands."""
    dev, rng = scaffold_device, np.random.default_rng(7)
    launches = dev.plugin.kernels.launches
    for m, k, n in ((7, 13, 130), (6, 8, 64), (1, 1, 1), (33, 5, 200), (13, 300, 17)):
        a_np = rng.standard_normal((m, k)).astype(dtype)
        bt_np = rng.standard_normal((n, k)).astype(dtype)        # b given transposed: strides (1, k)
        a, bt = anychip.tensor(a_np, device=dev), anychip.tensor(bt_np, device=dev)
        launches.clear()
        got = (a @ bt.T).numpy()
        assert launches["gemm"] == 1
        np.testing.assert_array_equal(got, _gemm_reference(a_np, bt_np.T))
        np.testing.assert_array_equal((a.T.contiguous().T @ bt.T).numpy(), got)   # a transposed too
    x_np = rng.standard_normal((5, 70)).astype(dtype)
    bias_np = rng.standard_normal(70).astype(dtype)
    x, bias = anychip.tensor(x_np, device=dev), anychip.tensor(bias_np, device=dev)
    np.testing.assert_array_equal((x + bias).numpy(), x_np + bias_np)          # broadcast rows
    np.testing.assert_array_equal((x.T.contiguous() * 2).numpy(), x_np.T * 2)  # a transposed read
    np.testing.assert_array_equal(x.T.contiguous().exp().numpy(), np.exp(x_np.T.astype(np.float64)).astype(dtype))
    col = np.zeros(70, np.float64)
    for r in range(5):
        col += x_np[r].astype(np.float64)
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), col.astype(dtype))


# every layout of a GEMM operand the kernel table allows: (storage shape, the view's slices or
# transpose); the view is what the kernel reads, through its element strides
_GEMM_LAYOUTS = {
    "contiguous": lambda shape: (shape, lambda s: s),
    "transposed": lambda shape: (shape[::-1], lambda s: s.T),
    "sliced": lambda shape: ((2 * shape[0] + 1, 3 * shape[1] + 2), lambda s: s[1::2, 2::3]),
    "reversed": lambda shape: (shape, lambda s: s[::-1, ::-1]),
    "transposed, sliced": lambda shape: ((2 * shape[1], shape[0] + 3), lambda s: s[::2, 3:].T),
    "row broadcast": lambda shape: ((1, shape[1]), lambda s: np.broadcast_to(s, shape)),
    "column broadcast": lambda shape: ((shape[0], 1), lambda s: np.broadcast_to(s, shape)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_the_scaffolds_gemm_reads_every_layout_of_its_operands(scaffold_device: anychip.Device,
                                                              dtype: str) -> None:
    """gemm through the kernel table's front end with a and b in every layout plugin.h allows
    (row and column strides: transposed, every other row and third column from an offset,
    negative, zero): each result equals the reference summed from the view's values, and is
    within float32's accumulation bound of NumPy's matmul."""
    dev, rng = scaffold_device, np.random.default_rng(11)
    front = kernels_of(dev)
    item = np.dtype(dtype).itemsize
    m, k, n = 9, 37, 21
    for a_layout, b_layout in [(la, lb) for la in _GEMM_LAYOUTS for lb in _GEMM_LAYOUTS]:
        operands = []
        for layout, shape in ((a_layout, (m, k)), (b_layout, (k, n))):
            storage_shape, view_of = _GEMM_LAYOUTS[layout](shape)
            storage = rng.standard_normal(storage_shape).astype(dtype)
            view = view_of(storage)
            assert view.shape == shape
            offset = (view.__array_interface__["data"][0] - storage.__array_interface__["data"][0])
            buf = dev.alloc(storage.nbytes).copy_from(storage)
            operands.append((np.array(view), (buf, offset, tuple(st // item for st in view.strides))))
        (a, a_op), (b, b_op) = operands
        out = dev.alloc(m * n * item)
        front.gemm((out, 0), a_op, b_op, m, k, n, dtype)
        got = out.to_numpy(dtype, (m, n))
        what = f"{dtype}, a {a_layout}, b {b_layout}"
        np.testing.assert_array_equal(got, _gemm_reference(a, b), err_msg=what)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = k * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        assert np.all(np.abs(got.astype(np.float64) - exact) <= bound + np.spacing(np.abs(got))), what


def test_a_failed_entry_is_the_plugins_device_error(scaffold_device: anychip.Device) -> None:
    dev = scaffold_device
    k = dev.plugin.kernels
    buf = dev.alloc(16)
    k.launches.clear()
    with pytest.raises(anychip.DeviceError) as info:    # past the front end's checks: the plugin's own
        k.elementwise(dev.index, "add", (buf, 1 << 40), (buf, 0, (1,)), (buf, 0, (1,)), (4,), "float32",
                      dev.current_stream())
    err = info.value
    assert err.code == 3 and err.backend == "tkern"
    assert str(err) == (f"[tkern] kernels.binary failed: not a valid device pointer: binary: elements [0, 3] from "
                        f"{hex(buf.ptr + (1 << 40))} are not memory of device 0 (status = 3)")
    with pytest.raises(anychip.UnsupportedError, match="^the kernel table's reduce takes no max over zero elements$"):
        k.reduce(dev.index, "max", (buf, 0), "float32", (buf, 0), "float32", 1, 0, 1, dev.current_stream())
    assert k.launches == Counter()


# -- masks, and tables anychip does not use -------------------------------------------------

def test_dtypes_outside_the_masks_take_the_host_fallback(load, monkeypatch: pytest.MonkeyPatch) -> None:
    dev, plugin = load("KERNELS_F32")
    k = plugin.kernels
    assert k.masks == {"binary": 0x40, "unary": 0x40, "reduce": 0x40, "gemm": 0, "fill": 0x40}
    a32 = anychip.tensor(np.array([1.5, -2.0, 3.25], np.float32), device=dev)
    a64 = anychip.tensor(np.array([1.5, -2.0, 3.25], np.float64), device=dev)
    k.launches.clear()
    d2h = _d2h_copies(monkeypatch, plugin)
    assert (a32 + a32).tolist() == [3.0, -4.0, 6.5]
    assert k.launches == Counter(binary=1)
    n = len(d2h)                                 # (tolist reads the result back)
    assert (a64 + a64).tolist() == [3.0, -4.0, 6.5]
    assert k.launches == Counter(binary=1) and len(d2h) > n + 1      # both inputs read: the host ran it
    m = anychip.tensor(np.eye(2, dtype=np.float32), device=dev)
    assert (m @ m).tolist() == [[1.0, 0.0], [0.0, 1.0]]              # no gemm entry: on the host
    assert k.launches == Counter(binary=1)


@pytest.mark.parametrize("variant", ["KERNELS_NONE", "MINOR0"])
def test_without_a_table_or_of_minor_0_every_op_runs_on_the_host(load, variant: str) -> None:
    dev, plugin = load(variant)
    assert plugin.abi == ((1, 0) if variant == "MINOR0" else (1, 3))
    assert plugin.kernels is None and kernels_of(dev) is None and plugin.kernels_problem() is None
    x = anychip.tensor(np.array([[1, 2], [3, 4]], np.int32), device=dev)
    assert ((x * 3).sum(axis=0)).tolist() == [12, 18]


@pytest.mark.parametrize("variant, problem", [
    ("KERNELS_V2", "tkv2: its kernel table has version 2; this anychip knows version 1 (ANYCHIP_KERNELS_VERSION "
                   "of plugin.h): rebuild the plugin against this anychip's header (anychip plugin cflags) or "
                   "upgrade anychip"),
    ("KERNELS_BADMASK", "tkbadmask: the kernel table's binary_dtypes 0x3ff sets bits beyond ANYCHIP_BOOL (1 << 8), "
                        "which name no dtype: want bits of anychip_dtype only (at most 0x1ff)"),
])
def test_a_table_anychip_cannot_read_is_refused_with_a_warning(load, variant: str, problem: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="anychip"):
        dev, plugin = load(variant)
    assert plugin.kernels_problem() == problem
    assert plugin.kernels is None and kernels_of(dev) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"anychip: {plugin.path}: its kernel table is not used (every tensor op runs on the host): {problem}"]
    assert (anychip.tensor([1.0, 2.0], device=dev) * 2).tolist() == [2.0, 4.0]


# -- anychip plugin check ---------------------------------------------------------------------

@pytest.mark.slow
def test_plugin_check_compares_every_entry_and_dtype_of_the_scaffold(scaffold_plugin: Any) -> None:
    r = subprocess.run([*ANYCHIP, "plugin", "check", scaffold_plugin.path], capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-2:] == [
        "on the host: nothing: every entry is set, for every dtype plugin.h allows it",
        "kernels:     5 entries (binary, unary, reduce, gemm, fill), 249 dtype cases checked (1560 calls) against "
        "NumPy: all agree"]


_EVERY_OP = "on the host: every tensor op (no kernel table used: binary, unary, reduce, gemm, fill)"
_BUT_F32 = "int8, uint8, int32, int64, float16, bfloat16, float64, bool"


@pytest.mark.parametrize("variant, line, rc, host", [
    ("KERNELS_V2", "kernels:     refused, every tensor op runs on the host: tkv2: its kernel table has version 2; "
                   "this anychip knows version 1", 1, _EVERY_OP),
    ("KERNELS_BADMASK", "kernels:     refused, every tensor op runs on the host: tkbadmask: the kernel table's "
                        "binary_dtypes 0x3ff sets bits beyond ANYCHIP_BOOL", 1, _EVERY_OP),
    ("KERNELS_NONE", "kernels:     none (no kernel table (kernels is NULL)): every tensor op runs on the host", 0,
     _EVERY_OP),
    ("MINOR0", "kernels:     none (the plugin is of ABI 1.0): every tensor op runs on the host", 0, _EVERY_OP),
    # what a table leaves to the host is named: the NULL entry, and per entry the dtypes its mask leaves out
    ("KERNELS_F32", "kernels:     4 entries (binary, unary, reduce, fill), 22 dtype cases checked", 0,
     f"on the host: gemm (NULL); binary for {_BUT_F32} (not in binary_dtypes); unary for {_BUT_F32} (not in "
     f"unary_dtypes); reduce for {_BUT_F32} (not in reduce_dtypes); fill for {_BUT_F32} (not in fill_dtypes)"),
])
@pytest.mark.slow
def test_plugin_check_refuses_a_table_it_cannot_read(variant_libs: dict[str, Path], variant: str, line: str,
                                                      rc: int, host: str) -> None:
    r = subprocess.run([*ANYCHIP, "plugin", "check", str(variant_libs[variant])], capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert r.returncode == rc, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith(line)
    assert r.stdout.splitlines()[-2] == host


@pytest.mark.parametrize("defect, failure", [
    ("sub_adds", "binary sub int8 [contiguous, contiguous, shape (3, 5, 67)]: 996 of 1005 elements wrong; first at "
                 "(0, 0, 0): expected 0, got -2"),
    ("float16_as_bfloat16", "binary add float16 [contiguous, contiguous, shape (3, 5, 67)]: 998 of 1005 elements "
                            "wrong; first at (0, 0, 0): expected 13.328125, got 15.46875"),
    # (a reversed operand read forwards runs past its end: how many of the 1005 differ depends on the
    # memory there, so the count, N, is not fixed)
    ("ignores_strides", "binary add int8 [reversed, contiguous, shape (3, 5, 67)]: N of 1005 elements wrong; first "
                        "at (0, 0, 1): expected -20, got 64"),
    ("mean_sums", "reduce mean int8 -> float64 [outer 3, n 67, inner 5]: 15 of 15 elements wrong; first at (0, 0): "
                  "expected 22.70149253731343, got 1521.0"),
    ("fill_through_double", "fill int64 4611686018427387905: 67 of 67 elements wrong; first at (0,): expected "
                            "4611686018427387905, got 4611686018427387904"),
    ("none", None),
])
@pytest.mark.slow
def test_the_check_names_each_planted_kernel_defect(load, monkeypatch: pytest.MonkeyPatch, defect: str,
                                                    failure: str | None) -> None:
    monkeypatch.setenv("KERNEL_DEFECT", defect)          # read by the variant's init
    dev, plugin = load("KERNELS_MUTANT")
    report = check_kernel_table(dev)
    if failure is not None and ": N of " in failure:
        assert report.failure is not None
        assert re.fullmatch(r"9[0-9][0-9]".join(map(re.escape, failure.split("N", 1))), report.failure), report.failure
    else:
        assert report.failure == failure
    assert report.entries == ["binary", "unary", "reduce", "gemm", "fill"]


@pytest.mark.slow
def test_the_simulated_chips_faces_pass_the_check() -> None:
    """The simulated chips' plugin.h faces fill the table from the simulator's kernels, an
    implementation of its own: NumPy agrees with it too."""
    for chip in ("ascend", "kunlun", "hygon"):
        _, loader = cplugin.probe(anychip.device(f"{chip}:0").plugin.library_path)
        face = loader()
        face.name = f"{chip}_face"                      # (beside the built-in backend of the name)
        registry.register_plugin(face, source="the simulator's plugin.h face (tests)")
        try:
            report = check_kernel_table(anychip.device(f"{chip}_face:0"))
            assert report.failure is None
            assert (report.cases, report.calls) == (246, 1549)      # no bool sums: its reduce mask leaves bool out
        finally:
            anychip.device(f"{chip}_face:0").synchronize()
            registry.unregister_plugin(f"{chip}_face")
