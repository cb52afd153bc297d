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


BAD = [
    ("cpu:banana", "term 'cpu:banana': device 'banana' is not a non-negative integer"),
    ("cpu:-1", "device '-1' is not a non-negative integer"),
    ("cpu:1", "cpu has 1 device (indices 0..0), there is no cpu:1"),
    ("ascend:4", "ascend has 4 devices (indices 0..3), there is no ascend:4"),
    ("ascend:0,,1", "empty device entry (a stray ',')"),
    ("ascend:0,", "empty device entry (a stray ',')"),
    ("ascend:", "missing devices after ':'"),
    (":0", "missing backend name before ':'"),
    ("banana:0", "unknown backend 'banana'"),
    ("gpu", "unknown backend 'gpu'"),
    ("cuda:0", "backend 'cuda' is unavailable: CuPy is not installed"),
    ("cpu:0;;ascend:0", "empty term"),
    (";", "empty term"),
    ("!", "'!' must be followed by backend:devices"),
    ("!cpu:0;ascend:0", "accepting terms must come before every discard term"),
    ("cpu:0:1", "more than one ':'"),
    ("cp u:0", "'cp u' is not a backend name"),
    ("cpu:1.5", "device '1.5' is not a non-negative integer"),
    ("!cpu:*;!opencl:*;!ascend:*;!kunlun:*", "selects no device"),
    ("!*:*", "selects no device"),
    ("!banana:*", "unknown backend 'banana'"),
    ("*:7", "selects no device"),
]


@pytest.mark.parametrize("value,message", BAD, ids=[repr(v) for v, _ in BAD])
def test_bad_values(value, message):
    with pytest.raises(SelectionError) as info:
        select(value, BACKENDS)
    text = str(info.value)
    assert message in text
    # every error lists the known backends, with the reason of the unavailable one
    assert "cuda: unavailable (CuPy is not installed)" in text
    assert "ascend: 4 devices" in text


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
