"""Random tensor ops against NumPy on every device: elementwise ops (with broadcasting and every
pair of dtypes), unary ops, reductions, matmul and casts over shapes that include empty ones.
Every case either equals NumPy's result (its dtype and shape, exactly for integers and bools,
within float rounding otherwise) or is one of the documented refusals: a result NumPy types as
int16 (int8 with uint8), which tensors do not have, and relu / neg of bool."""
from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.tensor import _ops

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
SHAPES = [(), (0,), (3,), (2, 3), (0, 3), (3, 0), (1, 3), (2, 1), (4, 5), (2, 0, 3)]
CASES = 400


def _array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(int(info.min), -100), min(int(info.max), 100), shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def _case(rng: np.random.Generator, dev: anychip.Device) -> tuple[str, object, object]:
    """(what, NumPy's result or the exception it raises, a thunk giving anychip's)."""
    kind = ["binary", "unary", "reduce", "matmul", "cast"][int(rng.integers(5))]
    d1, d2 = DTYPES[int(rng.integers(len(DTYPES)))], DTYPES[int(rng.integers(len(DTYPES)))]
    s1 = SHAPES[int(rng.integers(len(SHAPES)))]
    if kind == "binary":
        op = sorted(_ops.BINARY)[int(rng.integers(len(_ops.BINARY)))]
        s2 = s1 if rng.random() < 0.5 else SHAPES[int(rng.integers(len(SHAPES)))]
        a, b = _array(rng, s1, d1), _array(rng, s2, d2)
        if op == "pow":
            b = np.abs(b) % 3 if b.dtype.kind in "iu" else b
        return (f"{op}({d1}{s1}, {d2}{s2})", lambda: _ops.BINARY[op](a, b),
                lambda: _ops.binary(op, anychip.tensor(a, device=dev), anychip.tensor(b, device=dev)))
    if kind == "unary":
        op = sorted(_ops.UNARY)[int(rng.integers(len(_ops.UNARY)))]
        a = _array(rng, s1, d1)
        return f"{op}({d1}{s1})", lambda: _ops.UNARY[op](a), lambda: _ops.unary(op, anychip.tensor(a, device=dev))
    if kind == "reduce":
        op = ["sum", "mean", "max"][int(rng.integers(3))]
        a = _array(rng, s1, d1)
        axis = None if rng.random() < 0.4 or not s1 else int(rng.integers(len(s1)))
        acc = np.int64 if op == "sum" and d1 in ("bool", "int8", "uint8", "int32", "int64") else None

        def want() -> object:
            if op == "max":
                return np.max(a, axis=axis)
            return getattr(np, op)(a, axis=axis, dtype=acc) if acc else getattr(np, op)(a, axis=axis)
        return (f"{op}({d1}{s1}, axis={axis})", want,
                lambda: _ops.reduce(op, anychip.tensor(a, device=dev), axis))
    if kind == "matmul":
        m, k, n = (int(v) for v in rng.integers(0, 4, 3))
        a, b = _array(rng, (m, k), d1), _array(rng, (k, n), d2)
        return (f"matmul({d1}{a.shape}, {d2}{b.shape})", lambda: np.matmul(a, b),
                lambda: _ops.matmul(anychip.tensor(a, device=dev), anychip.tensor(b, device=dev)))
    a = _array(rng, s1, d1)
    return f"cast({d1}{s1} -> {d2})", lambda: a.astype(d2), lambda: anychip.tensor(a, device=dev).cast(d2)


def _refused(what: str, exc: Exception) -> bool:
    """The documented refusals (see the module docstring)."""
    text = str(exc)
    return isinstance(exc, anychip.UnsupportedError) and (
        "gives int16 in NumPy, which anychip tensors do not support" in text or
        ("is not defined for bool tensors" in text and what.startswith(("relu(bool", "neg(bool"))))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_random_ops_agree_with_numpy(device: anychip.Device) -> None:
    rng = np.random.default_rng(2026)
    agree = refused = 0
    wrong = []
    for _ in range(CASES):
        what, numpy_fn, ours = _case(rng, device)
        try:
            with np.errstate(all="ignore"):
                want = np.asarray(numpy_fn())
        except (TypeError, ValueError, np.exceptions.DTypePromotionError):
            continue                               # NumPy refuses it too
        try:
            got = ours().numpy()
        except anychip.AnychipError as exc:
            if _refused(what, exc):
                refused += 1
            else:
                wrong.append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        reduce_type = what.startswith(("sum(", "mean(", "max("))
        same = got.shape == want.shape and (got.dtype == want.dtype or reduce_type)
        if same and (got.dtype.kind == "f" or want.dtype.kind == "f"):
            tol = 1e-2 if np.float16 in (got.dtype, want.dtype) else 1e-5
            same = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
        elif same:
            same = np.array_equal(got, want)
        if same:
            agree += 1
        else:
            wrong.append(f"{what}: got {got.dtype}{got.shape} {got.ravel()[:4]}, want {want.dtype}{want.shape} "
                         f"{want.ravel()[:4]}")
    assert wrong == [], f"{len(wrong)} of {CASES} disagree with NumPy:\n" + "\n".join(wrong[:20])
    assert agree > 0.85 * CASES and refused < 0.1 * CASES, (agree, refused)
