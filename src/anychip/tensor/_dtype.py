"""Element types of tensors: the collectives' dtypes plus ``bool``.

NumPy has no bfloat16, so a bfloat16 tensor stores its elements as ``uint16``
bit patterns; host code widens them to float32 to compute and rounds back
(to nearest, ties to even), as chips do. ``ml_dtypes.bfloat16`` arrays are
accepted and returned when that package is installed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError, UnsupportedError

# (to_bfloat16_bits, from_bfloat16_bits and result_type serve the package's tensors and ops)
__all__ = ["DType", "dtype", "bool_", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
           "float64", "DTYPES"]


class DType:
    """One element type: ``name``, ``itemsize`` (bytes), ``storage`` (the NumPy dtype its
    bytes are held as) and ``kind`` (``"b"`` bool, ``"i"`` signed, ``"u"`` unsigned,
    ``"f"`` float). Compares equal to its name and to the NumPy dtype of the same name."""

    __slots__ = ("name", "itemsize", "storage", "kind", "dlpack")

    def __init__(self, name: str, storage: str, kind: str, dlpack: tuple[int, int]) -> None:
        self.name = name
        self.storage = np.dtype(storage)
        self.itemsize = self.storage.itemsize
        self.kind = kind
        self.dlpack = dlpack            # (DLDataTypeCode, bits)

    @property
    def is_floating(self) -> bool:
        return self.kind == "f"

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype of this type's values (float32 computes bfloat16)."""
        return np.dtype(np.float32) if self.name == "bfloat16" else self.storage

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DType):
            return other is self
        try:
            return dtype(other) is self
        except (InvalidArgumentError, UnsupportedError):
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"anychip.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> Any:
        return (dtype, (self.name,))


# DLPack type codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
bool_ = DType("bool", "bool", "b", (6, 8))
int8 = DType("int8", "int8", "i", (0, 8))
uint8 = DType("uint8", "uint8", "u", (1, 8))
int32 = DType("int32", "int32", "i", (0, 32))
int64 = DType("int64", "int64", "i", (0, 64))
float16 = DType("float16", "float16", "f", (2, 16))
bfloat16 = DType("bfloat16", "uint16", "f", (4, 16))
float32 = DType("float32", "float32", "f", (2, 32))
float64 = DType("float64", "float64", "f", (2, 64))

#: name -> DType, every type a tensor may have
DTYPES: dict[str, DType] = {d.name: d for d in (bool_, int8, uint8, int32, int64, float16, bfloat16, float32,
                                                float64)}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16", "fp16": "float16",
            "fp32": "float32", "fp64": "float64", "int": "int64", "long": "int64", "bool_": "bool"}


def dtype(value: Any) -> DType:
    """The DType named by ``value``: a DType, a name (``"float32"``, ``"bf16"``...), a NumPy
    dtype or scalar type, or a torch dtype. Unsupported types raise UnsupportedError."""
    if isinstance(value, DType):
        return value
    if value is bool:
        return bool_
    if value is float:
        return float64
    if value is int:
        return int64
    if isinstance(value, str):
        name = value.strip().lower()
        name = _ALIASES.get(name, name)
    else:
        name = _foreign_name(value)
    found = DTYPES.get(name)
    if found is None:
        shown = value if isinstance(value, str) else name
        raise UnsupportedError(f"dtype {shown!r} is not supported by anychip tensors; use one of "
                               f"{', '.join(DTYPES)}")
    return found


def _foreign_name(value: Any) -> str:
    text = str(value)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        return np.dtype(value).name
    except TypeError:
        raise InvalidArgumentError(f"{value!r} ({type(value).__name__}) is not a dtype; pass a name such as "
                                   f"'float32', a NumPy dtype or an anychip dtype") from None


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float values -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint32, copy=True)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _np_for_promotion(d: DType) -> np.dtype:
    return d.storage if d.name != "bfloat16" else np.dtype(np.float32)


def result_type(a: DType, b: DType | bool | int | float) -> DType:
    """The type of ``a <op> b`` with NumPy's promotion (Python scalars are weak, NEP 50);
    bfloat16 with bfloat16, an integer, bool or a Python float stays bfloat16, and with
    float16 becomes float32 (as in PyTorch)."""
    if isinstance(b, DType):
        if a is b:
            return a
        if bfloat16 in (a, b):
            other = b if a is bfloat16 else a
            if other.kind in "biu":
                return bfloat16
            return float32 if other is float16 else other
        return dtype(np.result_type(a.storage, b.storage))
    if a is bfloat16:
        return bfloat16
    return dtype(np.result_type(a.storage, b))


def _host_values(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Host values converted to ``dtype``'s storage (bfloat16 rounded to nearest even)."""
    if dtype is bfloat16:
        if arr.dtype.name == "bfloat16":
            return arr.view(np.uint16)
        return to_bfloat16_bits(arr.astype(np.float32))
    if arr.dtype.name == "bfloat16":
        arr = arr.astype(np.float32)
    return arr.astype(dtype.storage, copy=False)
