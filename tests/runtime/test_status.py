"""runtime/status.py: the one translation of C-ABI status codes into anychip's errors."""
from __future__ import annotations

import pickle

import pytest

import anychip
from anychip.runtime import StatusCodes
from anychip.runtime.errors import (
    CollectiveError,
    CollectiveTimeout,
    DeviceError,
    InvalidArgumentError,
    OutOfMemoryError,
    PluginError,
)

NAMES = {1: "VND_ERROR_PARAM", 2: "VND_ERROR_NOMEM", 7: "VND_ERROR_NOT_READY", 9: "VND_ERROR_TIMEOUT"}


def _codes(**kw: object) -> StatusCodes:
    return StatusCodes("vnd", name=lambda c: NAMES.get(c, f"status {c}"), text=lambda c: f"text of {c}", **kw)


def test_a_failure_carries_the_backend_the_code_and_its_name() -> None:
    err = _codes().error(5, "vndCopy")
    assert type(err) is DeviceError
    assert str(err) == "[vnd] vndCopy failed: text of 5 (status 5 = 5)"
    assert (err.backend, err.code, err.code_name) == ("vnd", 5, "status 5")
    err = _codes().error(1, "vndCopy")
    assert str(err) == "[vnd] vndCopy failed: text of 1 (VND_ERROR_PARAM = 1)"
    assert pickle.loads(pickle.dumps(err)).code_name == "VND_ERROR_PARAM"


def test_check_raises_only_for_failures() -> None:
    codes = _codes(success=(0, 1))
    codes.check(0, "a")
    codes.check(1, "a")                  # a warning code that means done
    with pytest.raises(DeviceError, match=r"^\[vnd\] a failed: text of 2 \(VND_ERROR_NOMEM = 2\)$"):
        codes.check(2, "a")
    calls: list[tuple] = []
    codes.call(lambda *a: calls.append(a) or 0, "f", 3, 4)
    assert calls == [(3, 4)]
    with pytest.raises(DeviceError, match="^.vnd. f failed: text of 9"):
        codes.call(lambda: 9, "f")


def test_the_class_follows_the_code() -> None:
    codes = _codes(invalid={1}, timeout={9}, failure=CollectiveError)
    assert type(codes.error(1, "op")) is InvalidArgumentError and str(codes.error(1, "op")) == "op failed: text of 1"
    assert type(codes.error(9, "op")) is CollectiveTimeout
    assert type(codes.error(5, "op")) is CollectiveError
    assert type(_codes().error(5, "load", failure=PluginError)) is PluginError


def test_done_reads_a_query() -> None:
    codes = _codes(not_ready=7)
    assert codes.done(0, "q") is True
    assert codes.done(7, "q") is False
    with pytest.raises(DeviceError, match=r"q failed: text of 5"):
        codes.done(5, "q")
    with pytest.raises(DeviceError):
        _codes().done(7, "q")              # no not-ready code: 7 is a failure


def test_an_allocation_failure() -> None:
    codes = _codes(oom={2})
    err = codes.oom_error(2, "vndMalloc", 1 << 20, "vnd:0", lambda: (4096, 1 << 30))
    assert type(err) is OutOfMemoryError
    assert (err.requested, err.free, err.total, err.code, err.code_name, err.device) == (
        1 << 20, 4096, 1 << 30, 2, "VND_ERROR_NOMEM", "vnd:0")
    assert str(err).endswith(": vndMalloc: text of 2 (VND_ERROR_NOMEM = 2)")
    other = codes.oom_error(5, "vndMalloc", 64, "vnd:0")
    assert type(other) is DeviceError and str(other) == "[vnd] vndMalloc of 64 bytes failed: text of 5 (status 5 = 5)"

    def broken() -> tuple[int, int]:
        raise DeviceError("no info")

    err = _codes(oom_unnamed=True).oom_error(5, "alloc", 8, "vnd:1", broken)
    assert type(err) is OutOfMemoryError and (err.free, err.total) == (None, None)


def test_every_c_binding_translates_through_it() -> None:
    dev = anychip.device("ascend:0")
    assert isinstance(dev.plugin.status, StatusCodes)
    with pytest.raises(DeviceError) as info:
        dev.plugin._call("set_device", 999)
    assert info.value.code_name is not None and info.value.code_name.startswith("ACL_")
    assert str(info.value).startswith("[ascend] set_device failed: ")
    assert isinstance(dev.plugin.native_ccl().status, StatusCodes)
