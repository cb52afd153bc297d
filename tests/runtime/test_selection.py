"""ANYCHIP_DEVICES: a table of values, good and bad, against a fixed set of backends."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from anychip.runtime.errors import SelectionError
from anychip.runtime.selection import parse, select


@dataclass
class FakeBackend:
    name: str
    available: bool
    reason: str
    device_count: int


# default priority order, as the registry sorts it: real accelerators, simulated, host
BACKENDS = [
    FakeBackend("opencl", True, "PoCL", 1),
    FakeBackend("ascend", True, "simulated", 4),
    FakeBackend("kunlun", True, "simulated", 2),
    FakeBackend("cpu", True, "host memory", 1),
    FakeBackend("cuda", False, "CuPy is not installed", 0),
]
ALL = ["opencl:0", "ascend:0", "ascend:1", "ascend:2", "ascend:3", "kunlun:0", "kunlun:1", "cpu:0"]


def names(value):
    return [f"{n}:{i}" for n, i in select(value, BACKENDS)]


GOOD = [
    (None, ALL),
    ("", ALL),
    ("   ", ALL),
    ("*", ALL),
    ("*:*", ALL),
    ("cpu:0", ["cpu:0"]),
    ("cpu", ["cpu:0"]),
    ("cpu:*", ["cpu:0"]),
    ("ascend:0,1", ["ascend:0", "ascend:1"]),
    ("ascend:3,1", ["ascend:3", "ascend:1"]),
    ("ascend:1,1,2", ["ascend:1", "ascend:2"]),
    ("ascend:0,1;kunlun:*", ["ascend:0", "ascend:1", "kunlun:0", "kunlun:1"]),
    ("kunlun:*;ascend:0", ["kunlun:0", "kunlun:1", "ascend:0"]),
    ("cpu:0;ascend:2", ["cpu:0", "ascend:2"]),
    (" cpu : 0 ; ascend : 1 ", ["cpu:0", "ascend:1"]),
    ("cpu:0;", ["cpu:0"]),
    ("*:0", ["opencl:0", "ascend:0", "kunlun:0", "cpu:0"]),
    ("*:1", ["ascend:1", "kunlun:1"]),
    ("!cpu:*", ALL[:-1]),
    ("!ascend:*;!kunlun:*", ["opencl:0", "cpu:0"]),
    ("!ascend:1,2", ["opencl:0", "ascend:0", "ascend:3", "kunlun:0", "kunlun:1", "cpu:0"]),
    ("ascend:*;!ascend:0", ["ascend:1", "ascend:2", "ascend:3"]),
    ("*:*;!opencl:*", ALL[1:]),
    ("*:*;!*:0", ["ascend:1", "ascend:2", "ascend:3", "kunlun:1"]),
    ("cpu:0;cpu:0", ["cpu:0"]),
    ("ascend:0;*:*", ["ascend:0", "opencl:0", "ascend:1", "ascend:2", "ascend:3", "kunlun:0", "kunlun:1", "cpu:0"]),
    ("!cuda:*", ALL),
    ("ascend:00", ["ascend:0"]),
]


@pytest.mark.parametrize("value,expected", GOOD, ids=[repr(v) for v, _ in GOOD])
def test_good_values(value, expected):
    assert names(value) == expected


KNOWN = "known: opencl, ascend, kunlun, cpu, cuda"

BAD = [
    ("cpu:banana", "term 'cpu:banana': device 'banana' is not an index (ASCII digits) or *"),
    ("cpu:-1", "term 'cpu:-1': device '-1' is not an index (ASCII digits) or *"),
    ("cpu:1", "term 'cpu:1': cpu has 1 device (indices 0..0), there is no cpu:1"),
    ("ascend:4", "term 'ascend:4': ascend has 4 devices (indices 0..3), there is no ascend:4"),
    ("ascend:0,,1", "term 'ascend:0,,1': empty device entry (a stray ',')"),
    ("ascend:0,", "term 'ascend:0,': empty device entry (a stray ',')"),
    ("ascend:", "term 'ascend:': missing devices after ':' (use *, N or N,M,...)"),
    (":0", "term ':0': missing backend name before ':'"),
    ("banana:0", f"term 'banana:0': unknown backend 'banana' ({KNOWN})"),
    ("gpu", f"term 'gpu': unknown backend 'gpu' ({KNOWN})"),
    ("cuda:0", "term 'cuda:0': backend 'cuda' is unavailable: CuPy is not installed"),
    ("cpu:0;;ascend:0", "term '': empty term"),
    (";", "term '': empty term"),
    ("!", "term '!': '!' must be followed by backend:devices"),
    ("!cpu:0;ascend:0", "term 'ascend:0': accepting terms must come before every discard term (!)"),
    ("cpu:0:1", "term 'cpu:0:1': more than one ':' (write backend:devices)"),
    ("cp u:0", "term 'cp u:0': 'cp u' is not a backend name"),
    ("cpu:1.5", "term 'cpu:1.5': sub-device '1.5' is not supported by anychip; select whole devices (N or *)"),
    ("cpu:١", "term 'cpu:١': device '١' is not an index (ASCII digits) or *"),
    ("cpu:²", "term 'cpu:²': device '²' is not an index (ASCII digits) or *"),
    ("!banana:*", f"term '!banana:*': unknown backend 'banana' ({KNOWN})"),
]


@pytest.mark.parametrize("value,message", BAD, ids=[repr(v) for v, _ in BAD])
def test_bad_values(value, message):
    with pytest.raises(SelectionError) as info:
        select(value, BACKENDS)
    first, _, detail = str(info.value).partition("\n\n")
    # the first line is the whole message; the grammar and the backends follow in a second paragraph
    assert first == f"bad ANYCHIP_DEVICES={value!r}: {message}"
    assert "term = [!]backend:devices" in detail
    assert "cuda: unavailable (CuPy is not installed)" in detail
    assert "ascend: 4 devices" in detail


NOTHING = ["!cpu:*;!opencl:*;!ascend:*;!kunlun:*", "!*:*", "*:7"]


@pytest.mark.parametrize("value", NOTHING)
def test_values_selecting_nothing(value):
    with pytest.raises(SelectionError) as info:
        select(value, BACKENDS)
    first, _, detail = str(info.value).partition("\n\n")
    assert first == f"ANYCHIP_DEVICES={value!r} selects no device"
    assert detail.startswith("  known backends:")


# Cases of oneAPI's own selector tests, with anychip's backends in place of oneAPI's
# (level_zero, hip -> ascend): intel/llvm sycl/doc/EnvironmentVariables.md and
# sycl/test-e2e/OneapiDeviceSelector/*.cpp,
# unified-runtime test/conformance/device/urDeviceGetSelected.cpp and
# test/loader/device_selector/{backend,device,filter,matcher}.cpp.
# A list is the selected devices; a string is the problem the error names.
SUB = "is not supported by anychip; select whole devices (N or *)"
TYPE = "is not supported by anychip; select devices by index (N, N,M or *)"
ONEAPI = [
    # urDeviceGetSelected.cpp
    ("*:*", ALL),
    ("*:0", ["opencl:0", "ascend:0", "kunlun:0", "cpu:0"]),
    ("*:0,*", ALL),                                         # '*' inside a list
    ("*:0;!*:1", ["opencl:0", "ascend:0", "kunlun:0", "cpu:0"]),
    (":garbage", "missing backend name before ':'"),
    ("garbage:0", f"unknown backend 'garbage' ({KNOWN})"),
    ("*", ALL),                                             # anychip: a bare '*' is accepted
    ("*:", "missing devices after ':' (use *, N or N,M,...)"),
    ("*:0,,2", "empty device entry (a stray ',')"),
    ("*:0.1.2.3", "device '0.1.2.3' is not an index (ASCII digits) or *"),
    ("*:*.", "device '*.' is not an index (ASCII digits) or *"),
    ("*:*.0", f"sub-device '*.0' {SUB}"),
    ("*:0.4321", f"sub-device '0.4321' {SUB}"),
    ("*:0.0.4321", f"sub-device '0.0.4321' {SUB}"),
    # loader device_selector/backend.cpp: backend names in any case
    ("OpenCL:*", ["opencl:0"]),
    ("Ascend:0", ["ascend:0"]),
    ("NotABackendName:0", f"unknown backend 'NotABackendName' ({KNOWN})"),
    # loader device_selector/device.cpp
    ("ascend:NotADeviceName", "device 'NotADeviceName' is not an index (ASCII digits) or *"),
    ("ascend:*garbage", "device '*garbage' is not an index (ASCII digits) or *"),
    ("ascend:gpu", f"device type 'gpu' {TYPE}"),
    ("ascend:cpu", f"device type 'cpu' {TYPE}"),
    ("ascend:fpga", f"device type 'fpga' {TYPE}"),
    ("ascend:mca", f"device type 'mca' {TYPE}"),
    ("ascend:npu", f"device type 'npu' {TYPE}"),
    ("ascend:*.*", f"sub-device '*.*' {SUB}"),
    ("ascend:0c", "device '0c' is not an index (ASCII digits) or *"),
    ("ascend:1.crap", "device '1.crap' is not an index (ASCII digits) or *"),
    ("ascend:1.", "device '1.' is not an index (ASCII digits) or *"),
    ("ascend:0.0", f"sub-device '0.0' {SUB}"),
    ("ascend:0.*", f"sub-device '0.*' {SUB}"),
    ("ascend:0.0.0", f"sub-device '0.0.0' {SUB}"),
    ("ascend:0.0.*", f"sub-device '0.0.*' {SUB}"),
    ("ascend:*.*.*", f"sub-device '*.*.*' {SUB}"),
    ("ascend:,gpu", "empty device entry (a stray ',')"),
    ("ascend:gpu,", f"device type 'gpu' {TYPE}"),
    ("ascend:gpu,cpu", f"device type 'gpu' {TYPE}"),
    ("ascend:0,2", ["ascend:0", "ascend:2"]),
    ("ascend:*,*.*", f"sub-device '*.*' {SUB}"),
    # loader device_selector/filter.cpp
    ("ascend0", f"unknown backend 'ascend0' ({KNOWN})"),    # anychip: a bare name is a backend
    ("InvalidBackend:0", f"unknown backend 'InvalidBackend' ({KNOWN})"),
    ("ascend:*", ["ascend:0", "ascend:1", "ascend:2", "ascend:3"]),
    # loader device_selector/matcher.cpp
    ("opencl:*", ["opencl:0"]),
    ("ascend:gpu;kunlun:gpu", f"device type 'gpu' {TYPE}"),
    ("opencl:gpu,cpu", f"device type 'gpu' {TYPE}"),
    ("opencl:0", ["opencl:0"]),
    ("opencl:0.*", f"sub-device '0.*' {SUB}"),
    ("opencl:0.2", f"sub-device '0.2' {SUB}"),
    ("ascend:*,*.*", f"sub-device '*.*' {SUB}"),
    ("ascend:*;!ascend:0", ["ascend:1", "ascend:2", "ascend:3"]),
    ("!*:cpu", f"device type 'cpu' {TYPE}"),
    # sycl/test-e2e/OneapiDeviceSelector
    ("macaroni:*", f"unknown backend 'macaroni' ({KNOWN})"),          # illegal_input, illegal_BE_error
    (":", "missing backend name before ':'"),
    ("ascend:.", "device '.' is not an index (ASCII digits) or *"),
    ("macaroni_ascend:.", "device '.' is not an index (ASCII digits) or *"),
    ("ascend:macaroni_gpu", "device 'macaroni_gpu' is not an index (ASCII digits) or *"),
    ("ascend:0..0", "device '0..0' is not an index (ASCII digits) or *"),
    ("ascend:", "missing devices after ':' (use *, N or N,M,...)"),
    ("ascend:::gpu", "more than one ':' (write backend:devices)"),
    ("ascend:.1", "device '.1' is not an index (ASCII digits) or *"),
    ("OPENCL:*", ["opencl:0"]),                                       # case_sensitivity
    ("*:GPU", f"device type 'GPU' {TYPE}"),
    ("*:gpu", f"device type 'gpu' {TYPE}"),
    ("ascend", ["ascend:0", "ascend:1", "ascend:2", "ascend:3"]),      # backendonly_error: anychip accepts
    ("", ALL),                                                        # empty_input_string
    ("opencl:*,cpu", f"device type 'cpu' {TYPE}"),                    # no_duplicate_devices
    ("kunlun:*,0", ["kunlun:0", "kunlun:1"]),
    ("KUNLUN:*", ["kunlun:0", "kunlun:1"]),
    ("Cpu:*", ["cpu:0"]),
    ("!*:gpu", f"device type 'gpu' {TYPE}"),                          # discard_filters
    ("*:*;!KunLun:1", [d for d in ALL if d != "kunlun:1"]),
    # sycl/doc/EnvironmentVariables.md (ONEAPI_DEVICE_SELECTOR)
    ("*:gpu;!cuda:*", f"device type 'gpu' {TYPE}"),
    ("opencl:*;!*:cpu", f"device type 'cpu' {TYPE}"),
    ("ascend:0;!ascend:1", ["ascend:0"]),                             # discarding what is not selected: no effect
    ("opencl:*;!opencl:0", "selects no device"),
]


@pytest.mark.parametrize("value,expected", ONEAPI, ids=[repr(v) for v, _ in ONEAPI])
def test_oneapi_selector_cases(value, expected):
    if isinstance(expected, list):
        assert names(value) == expected
        return
    with pytest.raises(SelectionError) as info:
        select(value, BACKENDS)
    first = str(info.value).partition("\n\n")[0]
    if expected == "selects no device":
        assert first == f"ANYCHIP_DEVICES={value!r} selects no device"
        return
    assert first.startswith(f"bad ANYCHIP_DEVICES={value!r}: term ")
    assert first.endswith(f": {expected}")
    assert "is not a non-negative integer or *" not in str(info.value)


def test_syntax_errors_quote_the_term_and_show_the_grammar():
    with pytest.raises(SelectionError) as info:
        select("ascend:0;cpu:banana", BACKENDS)
    text = str(info.value)
    assert "bad ANYCHIP_DEVICES='ascend:0;cpu:banana'" in text
    assert "term 'cpu:banana'" in text
    assert "term = [!]backend:devices" in text and "ANYCHIP_DEVICES='ascend:0,1;cpu:*'" in text


def test_table_is_large_enough():
    assert len(GOOD) + len(BAD) >= 30


def test_parse_keeps_terms():
    terms = parse("ascend:2,0;!ascend:0")
    assert [(t.discard, t.backend, t.indices) for t in terms] == [(False, "ascend", (2, 0)), (True, "ascend", (0,))]


def test_no_backend_available():
    with pytest.raises(SelectionError, match="no device is available"):
        select(None, [FakeBackend("cuda", False, "no GPU", 0)])
