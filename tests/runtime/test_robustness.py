"""Hostile input to the public API: every bad call gets an anychip error that says
what was wrong, never a raw Python exception or a message printed by a finalizer."""
from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest

import anychip

BAD_NAMES = ["cpu:²", "ascend:١", "cpu:０", "cpu:٣", "cpu:-1", "cpu:0x1", "cpu:1.0", "cpu: "]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("call", ["device", "set_device", "Stream", "Event"])
def test_device_names_take_ascii_digits_only(name, call):
    with pytest.raises(anychip.SelectionError) as info:
        getattr(anychip, call)(name)
    assert str(info.value) == (f"bad device name {name!r}: expected 'backend:N' with N in ASCII digits, "
                               "e.g. 'cpu:0'")


def test_object_arrays_are_refused(device):
    buf = device.alloc(64)
    objs = np.array([1, "a", None, 2.5], dtype=object)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        buf.copy_from(objs)
    assert str(info.value) == ("the source array holds Python objects (dtype object); only plain data can be "
                               "copied to or from a device")
    with pytest.raises(anychip.InvalidArgumentError, match="^the destination array holds Python objects"):
        buf.copy_to(np.empty(8, dtype=object))
    with pytest.raises(anychip.InvalidArgumentError, match="^the source array holds Python objects .*dtype"):
        buf.copy_from(np.zeros(2, dtype=[("a", "i4"), ("o", "O")]))
    with pytest.raises(anychip.InvalidArgumentError, match=r"^the source holds Python objects \(format 'O'\)"):
        buf.copy_from(memoryview(objs))


def test_non_contiguous_memoryview(device):
    buf = device.alloc(8)
    src = np.arange(16, dtype=np.uint8)
    buf.copy_from(memoryview(src)[::2])          # a source is read through NumPy, as a strided array is
    assert buf.to_numpy().tolist() == list(range(0, 16, 2))
    with pytest.raises(anychip.InvalidArgumentError) as info:
        buf.copy_to(memoryview(np.zeros(16, np.uint8))[::2])
    assert str(info.value) == "the destination host object must be C-contiguous"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dtype": np.dtype("V0")}, "dtype '|V0' has size 0; pass a dtype with a size (e.g. 'V8', np.float32)"),
    ({"dtype": object}, "dtype object holds Python object references, which device memory cannot hold; "
                        "use a numeric or other plain-data dtype"),
    ({"dtype": "nope"}, "dtype 'nope' is not a NumPy dtype (data type 'nope' not understood)"),
    ({"shape": (-1,)}, "shape (-1,): every dimension must be >= 0, got -1"),
    ({"shape": (2, "x")}, "shape (2, 'x'): every dimension must be an integer, got str 'x'"),
    ({"shape": 2.0}, "shape must be an int or a sequence of ints, got 2.0"),
    ({"shape": (10**12,)}, "to_numpy: shape (1000000000000,) of uint8 needs 1000000000000 bytes, but the buffer "
                           "has 1024 bytes from offset 0"),
    ({"dtype": np.float32, "shape": (4, 65)}, "to_numpy: shape (4, 65) of float32 needs 1040 bytes, but the "
                                              "buffer has 1024 bytes from offset 0"),
    ({"offset": 5000}, "to_numpy: offset 5000 is past the end of the 1024-byte buffer"),
    ({"offset": -1}, "offset must be >= 0, got -1"),
    ({"dtype": np.float64, "offset": 4}, "to_numpy: the 1020 bytes from offset 4 are not a whole number of "
                                         "float64 (8 bytes each); pass shape="),
])
def test_to_numpy_bad_arguments(kwargs, message):
    buf = anychip.device("cpu:0").alloc(1024)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        buf.to_numpy(**kwargs)
    assert str(info.value) == message


def test_to_numpy_edges(device):
    buf = device.alloc(16).copy_from(np.arange(4, dtype=np.int32))
    assert buf.to_numpy(np.int32, offset=16).shape == (0,)       # the end itself is a valid offset
    assert buf.to_numpy(np.int32, (2,), offset=8).tolist() == [2, 3]
    assert buf.to_numpy(np.int32, np.int64(2)).tolist() == [0, 1]
    assert buf.to_numpy(np.int32, (0, 5)).shape == (0, 5)


def test_buffer_cannot_be_constructed_directly():
    code = ("import anychip, gc\n"
            "try:\n    anychip.Buffer()\nexcept anychip.InvalidArgumentError as e:\n    print('E', e)\n"
            "gc.collect()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("E anychip.Buffer cannot be constructed directly; use Device.alloc(nbytes), "
                        "e.g. anychip.device('cpu:0').alloc(1024)\n")
    assert r.stderr == ""                                 # no "Exception ignored in Buffer.__del__"
    with pytest.raises(anychip.InvalidArgumentError):
        anychip.Buffer()
    gc.collect()


def test_device_names_match_in_any_case_as_in_anychip_devices():
    cpu = anychip.device("cpu:0")
    assert anychip.device("CPU:0") is cpu
    assert anychip.device(" Cpu : 0 ") is cpu
    assert anychip.device("CPU") is cpu
    assert anychip.devices("CPU") == [cpu]
    with pytest.raises(anychip.SelectionError, match="^unknown backend 'TPU' in device name 'TPU:0'; known backends: "):
        anychip.device("TPU:0")
