"""The conformance suite itself: its run on every built-in backend, its tables, JSON, plot and
exit codes, a plugin whose collectives move no data (it must fail with #wrong > 0, and each
fault case must report what it expected and what came), and the pytest plugin."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS

import anychip
from anychip.conformance import cases
from anychip.conformance.cases import CASE_NAMES, OPS, Config, parse_size, plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILTIN = ("ascend", "kunlun", "hygon", "opencl", "cpu")


def _available(name: str) -> bool:
    return any(b.name == name and b.available for b in anychip.backends())


def conformance(*args: str, env: dict | None = None, cwd: str | None = None,
                timeout: float = CHILD_SECONDS) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("ANYCHIP_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "anychip.cli", "conformance", *args], capture_output=True,
                          text=True, timeout=timeout, env=full, cwd=cwd or ROOT)


# -- the plan and the inputs ---------------------------------------------------------------------

def test_sizes_are_parsed_as_nccl_tests_writes_them() -> None:
    assert [parse_size(s) for s in ("8", "64K", "64M", "1G", "4KiB", "512B", " 2m ")] == \
        [8, 65536, 64 << 20, 1 << 30, 4096, 512, 2 << 20]
    for bad in ("", "K", "1.5M", "-8", "8X"):
        with pytest.raises(anychip.InvalidArgumentError, match="is not a size; write bytes like 8, 64K"):
            parse_size(bad)


def test_plan_rows_counts_and_roots() -> None:
    cfg = Config(ranks=3, min_bytes=8, max_bytes=64, factor=8, ops=("all_reduce", "all_gather", "reduce"),
                 dtypes=("float32", "int8"), redops=("sum", "max"), roots=None, coverage=(), boundary=())
    rows = plan(cfg)
    ar = [r for r in rows if r.op == "all_reduce"]
    assert [(r.nbytes, r.count, r.dtype, r.redop, r.root) for r in ar] == [
        (8, 2, "float32", "sum", -1), (8, 2, "float32", "max", -1), (8, 8, "int8", "sum", -1),
        (8, 8, "int8", "max", -1), (64, 16, "float32", "sum", -1), (64, 16, "float32", "max", -1),
        (64, 64, "int8", "sum", -1), (64, 64, "int8", "max", -1)]
    ag = [(r.nbytes, r.count, r.per_rank(3)) for r in rows if r.op == "all_gather"]
    # whole elements per rank, at least one: 8 B of float32 on 3 ranks is 3 elements
    assert ag == [(12, 3, 1), (6, 6, 2), (60, 15, 5), (63, 63, 21)]
    assert sorted({r.root for r in rows if r.op == "reduce"}) == [0, 1, 2]
    assert len([r for r in rows if r.op == "reduce"]) == 2 * 2 * 2 * 3
    # the quick defaults (3 ranks): a float32 sum sweep of 7 sizes; every dtype x reduce op at 4 KiB
    # with prime counts (rooted ops at the last rank, and every root once for float32), at 130 KB
    # every dtype (sum) and every reduce op (float32); one row per dtype size one element off a
    # 4 MiB multiple; there, max (float32) and avg of large int64 and int32 values, and the rooted
    # ops at the last root
    quick = plan(Config())
    ar = [r for r in quick if r.op == "all_reduce"]
    assert len(ar) == 7 + 8 * 5 + (8 + 4) + 4 + 3
    assert [(r.count, r.dtype, r.redop) for r in ar if r.nbytes > 2 << 20] == [
        ((4 << 20) + 1, "int8", "sum"), ((2 << 20) - 1, "bfloat16", "sum"), ((1 << 20) + 1, "float32", "sum"),
        ((512 << 10) - 1, "int64", "sum"), ((1 << 20) - 1, "float32", "max"), ((512 << 10) + 1, "int64", "avg"),
        ((1 << 20) - 1, "int32", "avg")]
    big = [(r.op, r.redop, r.root) for r in quick if r.nbytes > 2 << 20 and (r.redop not in ("sum", "none")
                                                                            or r.root > 0)]
    assert big == [("all_reduce", "max", -1), ("all_reduce", "avg", -1), ("all_reduce", "avg", -1),
                   ("broadcast", "none", 2), ("reduce", "max", 2), ("reduce", "avg", 2),
                   ("reduce_scatter", "max", -1), ("reduce_scatter", "avg", -1)]
    assert [r.count for r in ar if r.dtype == "int8" and r.redop == "sum"][:2] == [4093, 132989]   # primes
    assert len([r for r in quick if r.op == "broadcast"]) == 7 + (8 + 3 - 1) + 8 + 4 + 1
    assert sorted({r.root for r in quick if r.op == "reduce"}) == [0, 1, 2]
    ag = [r for r in quick if r.op == "all_gather" and r.dtype == "uint8"]
    assert [r.per_rank(3) for r in ag] == [1361, 44293]          # primes per rank, 3 ranks
    assert len(set(quick)) == len(quick)
    assert cases.BUSBW_FACTOR("all_reduce", 4) == 1.5
    assert cases.BUSBW_FACTOR("all_to_all", 4) == 0.75 and cases.BUSBW_FACTOR("sendrecv", 4) == 1.0


def _stepwise(xs: list[np.ndarray], order: list[int], op: str, dt: str) -> np.ndarray:
    """The reduction as a library computes it: in ``order``, rounding (or wrapping) to the dtype
    after every step."""
    acc = cases.decode(cases.encode(xs[order[0]], dt), dt)
    for q in order[1:]:
        with np.errstate(over="ignore"):
            acc = cases.reduced([acc, xs[q]], op)
        acc = cases.decode(cases.encode(acc, dt), dt)
    return acc


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_inputs_have_one_result_in_every_order_and_it_needs_rounding_or_wraps(n: int) -> None:
    rng = np.random.default_rng(n)
    for dt in cases.DTYPES:
        for op in ("sum", "prod", "min", "max"):
            xs = [cases.inputs(4099, dt, op, n, r, seed=5) for r in range(n)]
            assert not all(np.array_equal(xs[0], x) for x in xs[1:])            # ranks differ
            nan = dt.startswith(("float", "bfloat"))
            for x in xs:                                                     # each input is exact in dt
                assert np.array_equal(cases.decode(cases.encode(x, dt), dt), x, equal_nan=nan), (dt, op)
            want = cases.decode(cases.encode(cases.reduced(xs, op), dt), dt)
            for _ in range(3):                                               # any order: the same result
                order = [int(q) for q in rng.permutation(n)]
                assert np.array_equal(_stepwise(xs, order, op, dt), want, equal_nan=nan), (dt, op, order)
            if op in ("min", "max") and nan:            # NaN on one rank, and on every rank, at some elements
                some = np.count_nonzero(np.any([np.isnan(x) for x in xs], axis=0))
                every = np.count_nonzero(np.all([np.isnan(x) for x in xs], axis=0))
                assert 4099 // 200 < every < some < 4099 // 5, (dt, op, every, some)
            exact = cases.reduced(xs, op)
            if op in ("sum", "prod") and dt != "float64":      # (float64's exact result is its own)
                # what a truncating conversion or a saturating sum gets wrong is there to see
                if dt == "int64":        # wrapped in int64 already: compare with the sum in floats
                    unwrapped = cases.reduced([x.astype(np.float64) for x in xs], op)
                    off = np.count_nonzero(np.abs(unwrapped - exact) > 2.0**60)
                else:
                    off = np.count_nonzero(cases.decode(cases.encode(exact, dt), dt) != exact)
                assert off > 4099 // 8, (dt, op, off)
    # float sums round to nearest even: truncation differs from it on many elements
    xs = [cases.inputs(4099, "bfloat16", "sum", 3, r, seed=1) for r in range(3)]
    exact = cases.reduced(xs, "sum").astype(np.float32).view(np.uint32)
    assert np.count_nonzero((exact >> 16) != cases.encode(exact.view(np.float32), "bfloat16")) > 500
    # past one period the inputs repeat
    long = cases.inputs(cases.PERIOD * 2 + 5, "int8", "sum", 3, 1, seed=2)
    assert np.array_equal(long[cases.PERIOD:2 * cases.PERIOD], long[:cases.PERIOD])


def test_count_wrong_is_exact_and_avg_has_a_tolerance() -> None:
    expect = np.array([10, -20, 30, 7], np.int64)
    got = cases.decode(cases.encode(expect, "bfloat16"), "bfloat16")
    assert cases.count_wrong(got, expect, "bfloat16", "sum", 2) == 0
    got[2] = 31
    assert cases.count_wrong(got, expect, "bfloat16", "sum", 2) == 1
    # avg of sums 10, -20, 30, 7 over 2 ranks: 5, -10, 15, 3.5
    assert cases.count_wrong(np.array([5, -10, 15, 3.5]), expect, "float32", "avg", 2) == 0
    assert cases.count_wrong(np.array([5, -10, 15, 3.51]), expect, "float32", "avg", 2) == 1
    assert cases.count_wrong(np.array([5, -10, 15, 3.51]), expect, "bfloat16", "avg", 2) == 0
    assert cases.count_wrong(np.array([5, -10, 15, 3]), expect, "int32", "avg", 2) == 0
    assert cases.count_wrong(np.array([5, -10, 15, 2]), expect, "int32", "avg", 2) == 1
    assert cases.count_wrong(np.array([5, -10, 15, 4]), expect, "int64", "avg", 2) == 0


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_integer_avg_is_checked_exactly_above_float_precision(dt: str) -> None:
    """avg of int32 / int64: sums far above 2^24 (and, int64, 2^53); a float32 average is wrong."""
    n = 3
    xs = [cases.inputs(4099, dt, "avg", n, r, seed=3) for r in range(n)]
    total = cases.reduced(xs, "avg")
    assert np.abs(total).max() > (1 << 30 if dt == "int32" else 1 << 61)
    exact = total // n
    assert cases.count_wrong(exact, total, dt, "avg", n) == 0
    assert cases.count_wrong(exact + 2, total, dt, "avg", n) == 4099          # two more: off by more than one
    in_f32 = (total.astype(np.float32) / np.float32(n)).astype(np.int64)
    assert cases.count_wrong(in_f32, total, dt, "avg", n) > 4099 // 2


def test_nan_in_max_is_nan_or_the_others_max_and_nan_when_all_are() -> None:
    """NCCL's max / min: a plain comparison (NaN kept or dropped by order) or fmax (dropped): either
    result is right where a rank holds NaN; an element NaN on every rank must be NaN."""
    n = 3
    xs = [cases.inputs(4099, "float32", "max", n, r, seed=4) for r in range(n)]
    row = cases.Row("all_reduce", 4099 * 4, 4099, "float32", "max", -1)
    expect = cases._expected(row, xs, 0, n)
    nan_ok = np.isnan(cases._expected(row, xs, 0, n, propagate=True))
    dropped = cases.encode(cases.reduced(xs, "max"), "float32")
    propagated = cases.encode(cases.reduced(xs, "max", propagate=True), "float32")
    plain = xs[0].astype(np.float32)                                      # rank order, x < y ? y : x
    for x in xs[1:]:
        plain = np.where(plain < x, x, plain).astype(np.float32)
    for got in (dropped, propagated, plain):
        assert cases._wrong(got, expect, "float32", "max", n, nan_ok) == 0
    every = np.all([np.isnan(x) for x in xs], axis=0)
    from_identity = np.where(every, -np.inf, dropped).astype(np.float32)   # started at -inf, compared with >
    assert cases._wrong(from_identity, expect, "float32", "max", n, nan_ok) == int(every.sum()) > 0
    assert cases._wrong(np.where(nan_ok, 0, dropped).astype(np.float32), expect, "float32", "max", n, nan_ok) > 0


# -- the suite on every built-in backend ----------------------------------------------------------

# five backends, three ranks on the simulated chips: minutes on 2 busy cores
@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_quick_pass_on_every_builtin_backend(tmp_path) -> None:
    """`anychip conformance` with no arguments: every available backend, 3 ranks where it has 3
    devices (the simulated chips), else 2, a summary."""
    out = tmp_path / "all.json"
    p = conformance("--json", str(out), timeout=LONG_CHILD_SECONDS)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["passed"] is True and doc["config"]["ranks"] == 3 and doc["config"]["mode"] == "quick"
    by = {b["backend"]: b for b in doc["backends"]}
    for name in BUILTIN:
        if not _available(name):
            assert "unavailable" in by[name]
            continue
        b = by[name]
        assert b["verdict"] == "PASS", b["cases"]
        assert b["ranks"] == (2 if name in ("cpu", "opencl") else 3)
        # the CPU backend has no kernel set to check; a host backend's, or a shared device's, free memory
        # moves with others' memory; one device has no peer
        # and the CPU's memset runs when it is queued: no record can be pending behind held work
        skips = {"cpu": {"kernels", "mem_info", "copy_peer", "wait_binding"},
                 "opencl": {"mem_info", "copy_peer"}}.get(name, set())
        skipped = len(skips)
        assert b["counts"] == {"run": len(CASE_NAMES), "passed": len(CASE_NAMES) - skipped, "failed": 0,
                               "skipped": skipped}
        assert {c["name"] for c in b["cases"] if c["status"] == "skipped"} == skips, b["cases"]
        assert [c["name"] for c in b["cases"]] == list(CASE_NAMES)
        assert b["kind"] == {"cpu": "host", "opencl": "host"}.get(name, "simulated")
        assert {r["op"] for r in b["rows"]} == set(OPS)
        assert len(b["rows"]) == len(plan(Config(ranks=b["ranks"])))
        assert all(r["oop"]["wrong"] == 0 and r.get("ip", {"wrong": 0})["wrong"] == 0 for r in b["rows"])
        assert b["avg_busbw"] > 0
    lines = p.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("BACKEND"))
    assert lines[head].split() == ["BACKEND", "KIND", "RANKS", "CASES", "PASSED", "FAILED", "SKIPPED", "BUSBW",
                                   "GB/s", "TIME", "VERDICT"]
    table = {line.split()[0]: line.split() for line in lines[head + 2:] if line.strip()
             and not line.startswith("conformance:")}
    for name in BUILTIN:
        if _available(name):
            skipped = {"cpu": 4, "opencl": 2}.get(name, 0)
            assert table[name][3:7] == [str(len(CASE_NAMES)), str(len(CASE_NAMES) - skipped), "0", str(skipped)], \
                table[name]
            assert table[name][-1] == "PASS" and table[name][1] == by[name]["kind"]
    assert "unavailable:" in next(line for line in lines if line.startswith("cuda"))
    assert lines[-1] == "conformance: PASS"


@pytest.mark.slow
def test_tables_json_plot_and_progress(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'anychip[plot]')")
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    p = conformance("--device", "cpu", "-n", "3", "-b", "8", "-e", "64K", "-f", "32", "-c", "all_reduce,all_gather",
                    "-d", "float32,int8", "-o", "sum,max", "--iters", "2", "--warmup", "1", "--no-faults",
                    "--json", str(js), "--plot", str(png), "--progress")
    assert p.returncode == 0, p.stdout + p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    b = json.loads(js.read_text())["backends"][0]
    assert [c["name"] for c in b["cases"]] == [*cases.DEVICE_CASES, "all_reduce", "all_gather", *cases.COMM_CASES]
    rows = b["rows"]
    assert [(r["op"], r["size"], r["count"], r["dtype"], r["redop"]) for r in rows if r["dtype"] == "int8"] == [
        ("all_reduce", 8, 8, "int8", "sum"), ("all_reduce", 8, 8, "int8", "max"),
        ("all_reduce", 256, 256, "int8", "sum"), ("all_reduce", 256, 256, "int8", "max"),
        ("all_reduce", 8192, 8192, "int8", "sum"), ("all_reduce", 8192, 8192, "int8", "max"),
        ("all_gather", 6, 6, "int8", "none"), ("all_gather", 255, 255, "int8", "none"),
        ("all_gather", 8190, 8190, "int8", "none")]
    assert len(rows) == 3 * 2 * 2 + 3 * 2
    for r in rows:
        for place in ("oop", "ip"):
            f = r[place]
            assert f["wrong"] == 0 and f["time_us"] > 0
            assert f["algbw"] == pytest.approx(r["size"] / f["time_us"] / 1e3)
            assert f["busbw"] == pytest.approx(f["algbw"] * (4 / 3 if r["op"] == "all_reduce" else 2 / 3))
    # the table: nccl-tests' columns, a footer per collective
    out = p.stdout
    assert "# all_reduce: 3 ranks on cpu:0 via shm/host" in out
    assert "#       size        count      type  redop  root       time   algbw   busbw #wrong" in out
    line = next(x for x in out.splitlines() if x.split()[:5] == ["8192", "8192", "int8", "max", "-1"])
    assert line.split()[8] == "0" and line.split()[12] == "0"
    assert out.count("# Verdict              : PASS") == 2
    assert "# Avg bus bandwidth    : " in out
    assert "[" + "#" * 30 + "]" in p.stderr and "cpu" in p.stderr      # the progress bar, finished


@pytest.mark.parametrize("args,message", [
    (["--device", "nosuchchip"], "conformance: unknown backend 'nosuchchip'; known: "),
    (["--device", "cpu", "-b", "64X"], "size '64X' is not a size"),
    (["--device", "cpu", "-d", "float8"], "dtype float8 unknown; use all or a comma list of int8, uint8"),
    (["--device", "cpu", "-o", "mean"], "reduce op mean unknown"),
    (["--device", "cpu", "-r", "2"], "--root 2 is out of range for 2 ranks (0..1)"),
    (["--device", "cpu", "-b", "1M", "-e", "8"], "want 1 <= -b (1048576) <= -e (8)"),
])
def test_bad_arguments_exit_1_with_the_reason(args: list[str], message: str) -> None:
    p = conformance(*args)
    assert p.returncode == 1
    assert message in p.stderr, p.stderr


# -- a plugin whose collectives move no data --------------------------------------------------------

BROKEN = '''
"""A chip whose collective library says success and moves nothing."""
import cffi

from anychip.runtime import NativeLibrary
from anychip.chips.cpu import CPUPlugin

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")


class SilentCcl(NativeLibrary):
    api = "SILENT"
    backend = "brokenchip"
    kinds = frozenset(KINDS)
    dtypes = {d: i for i, d in enumerate(DTYPES)}
    redops = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}

    def __init__(self):
        super().__init__(cffi.FFI(), None, "<none>", False)

    def unique_id(self):
        return b"silent"

    def init(self, nranks, uid, rank):
        return object()

    def async_error(self, comm):
        return 0

    def destroy(self, comm):
        return 0

    def group_start(self):
        return 0

    def group_end(self):
        return 0

    def op(self, comm, kind, send, recv, count, dtype, redop, root, stream):
        return 0

    def use_device(self, plugin, index):
        pass

    def stream_handle(self, plugin, raw):
        return None


class BrokenChip(CPUPlugin):
    name = "brokenchip"
    accelerator = True

    def native_ccl(self):
        return SilentCcl()
'''


@pytest.fixture
def broken_plugin(tmp_path) -> dict:
    """The package on PYTHONPATH with a dist-info naming it under anychip.plugins: every rank
    process finds it through the registry, as an installed plugin."""
    (tmp_path / "brokenchip").mkdir()
    (tmp_path / "brokenchip" / "__init__.py").write_text(textwrap.dedent(BROKEN))
    dist = tmp_path / "brokenchip-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenchip\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[anychip.plugins]\nbrokenchip = brokenchip:BrokenChip\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}


@pytest.mark.slow
def test_collectives_that_move_no_data_fail_with_wrong_elements(broken_plugin, tmp_path) -> None:
    js = tmp_path / "broken.json"
    p = conformance("--device", "brokenchip", "-e", "64K", "--iters", "1", "--json", str(js), env=broken_plugin)
    assert p.returncode == 1, p.stdout + p.stderr
    b = json.loads(js.read_text())["backends"][0]
    assert b["transport"] == "native/SILENT" and b["verdict"] == "FAIL"
    by = {c["name"]: c for c in b["cases"]}
    for op in OPS:
        c = by[op]
        assert c["status"] == "failed", c
        assert c["expected"] == "#wrong 0" and c["got"].startswith("#wrong ") and int(c["got"].split()[1]) > 0
        assert c["extra"]["wrong"] > 0
        rows = [r for r in b["rows"] if r["op"] == op]
        assert all(r["status"] == "failed" and r["oop"]["wrong"] > 0 for r in rows), op
    # out of place, every element a rank receives is wrong (recv keeps its fill); in place,
    # only where the rank's own input differs from the result
    ar = next(r for r in b["rows"] if r["op"] == "all_reduce" and r["size"] == 4096 and r["dtype"] == "float32"
              and r["redop"] == "sum")
    assert ar["oop"]["wrong"] == 2 * 1024 * 3          # 2 ranks (one device) x 1024 elements x 3 repetitions
    assert 0 < ar["ip"]["wrong"] <= 2 * 1024 * 3
    # the device API is the CPU's and passes; the front end's check still refuses a bad root
    assert all(by[name]["status"] == "passed" for name in cases.DEVICE_CASES
               if name not in ("oom_recovery", "kernels", "mem_info", "copy_peer", "wait_binding"))
    # two ranks share its one device: no peer to copy to, and free memory moves with the other rank's;
    # the CPU's memset runs when it is queued, so no record can be pending behind held work
    assert by["mem_info"]["status"] == by["copy_peer"]["status"] == by["wait_binding"]["status"] == "skipped"
    assert by["kernels"]["status"] == "skipped"          # the CPU's plugin underneath: no kernel set
    assert by["bad_root"]["status"] == "passed"
    # faults the library should report and does not: each says what was expected and what came
    assert by["mismatched_count"]["status"] == "failed"
    assert by["mismatched_count"]["expected"] == (
        "CollectiveError mentioning 'mismatched collective' and 'rank 0 called all_reduce(count=10, float32, sum)' "
        "and 'rank 1 called all_reduce(count=11, float32, sum)'")
    assert by["mismatched_count"]["got"] == "no error"
    assert by["timeout"]["status"] == "failed" and by["timeout"]["got"] == "no error"
    assert by["timeout"]["detail"].startswith("rank 0: all_reduce that rank 1 never calls, ")
    assert by["killed_rank"]["status"] == "failed"
    assert by["killed_rank"]["expected"] == "CollectiveError naming missing rank 1 within 10 s"
    assert by["killed_rank"]["got"].startswith("none after ") and by["killed_rank"]["got"].endswith(" s: no error")
    # the report says the same on stdout
    assert "collective all_reduce         FAIL" in p.stdout
    assert "expected: #wrong 0" in p.stdout
    assert "conformance: FAIL on brokenchip" in p.stdout


# -- under pytest ---------------------------------------------------------------------------------------

def _pytest(*args: str, env: dict | None = None, cwd: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("ANYCHIP_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                           "anychip.conformance", *args], capture_output=True, text=True,
                          timeout=CHILD_SECONDS, env=full,
                          cwd=cwd)


@pytest.mark.slow
def test_pytest_plugin_runs_the_cases_per_device(tmp_path) -> None:
    # from outside the source tree (as an installed package) and from the repository root
    p = _pytest("--anychip-device", "cpu,nosuchchip", "-q", "-rs", cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    # cpu: every case but kernels (no kernel set), mem_info (host memory), copy_peer (one device) and
    # wait_binding (its memset runs when queued); nosuchchip: every case skipped
    assert f"{len(CASE_NAMES) - 4} passed, {len(CASE_NAMES) + 4} skipped" in p.stdout, p.stdout
    assert "cpu has no kernel set" in p.stdout
    assert "held work ran when it was queued" in p.stdout
    assert "unknown backend 'nosuchchip'" in p.stdout
    p = _pytest("--anychip-device", "cpu", "-k", "all_reduce or bad_free", "-v", cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "test_case[cpu-all_reduce] PASSED" in p.stdout and "test_case[cpu-bad_free] PASSED" in p.stdout
    assert f"2 passed, {len(CASE_NAMES) - 2} deselected" in p.stdout


@pytest.mark.slow
def test_pytest_plugin_reports_expected_and_got(broken_plugin, tmp_path) -> None:
    p = _pytest("--anychip-device", "brokenchip", "-q", "-k", "all_gather or killed_rank or memset", cwd=str(tmp_path),
                env=broken_plugin)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 failed, 1 passed" in p.stdout, p.stdout
    assert "FAILED" in p.stdout and "test_case[brokenchip-all_gather]" in p.stdout
    assert "expected: #wrong 0" in p.stdout
    assert "expected: CollectiveError naming missing rank 1 within 10 s" in p.stdout


def test_row_deadlines_scale_with_the_measured_bandwidth() -> None:
    """A collective row's deadline: the run's until a row of 1 MiB or more was timed, then 8 times
    its traffic at the slowest rate seen, never less than the run's; an explicit --deadline stays."""
    from anychip.conformance._rank import RowDeadlines, traffic
    cfg = Config(mode="full", checks=3, iters=10, warmup=1)
    small, big = cases.Row("all_reduce", 8 << 10, 2048, "float32", "sum", -1), \
        cases.Row("all_reduce", 64 << 20, 16 << 20, "float32", "sum", -1)
    assert traffic(big, cfg, True) == (64 << 20) * 2 * (4 + 11)
    d = RowDeadlines(cfg, 45.0)
    assert d.of(big, True) == 45.0
    d.saw(small, True, 100.0)                      # small rows say nothing about the bandwidth
    assert d.of(big, True) == 45.0
    mib = cases.Row("all_reduce", 32 << 20, 8 << 20, "float32", "sum", -1)
    d.saw(mib, True, traffic(mib, cfg, True) / 20e6)          # 20 MB/s: a slow library under load
    assert d.of(big, True) == pytest.approx(8 * traffic(big, cfg, True) / 20e6)      # 8 x 100 s
    assert d.of(small, True) == 45.0
    d.saw(mib, True, traffic(mib, cfg, True) / 1e9)            # a faster row does not shorten it
    assert d.of(big, True) == pytest.approx(8 * traffic(big, cfg, True) / 20e6)
    fixed = RowDeadlines(Config(deadline=30.0), 30.0)
    fixed.saw(mib, True, 1000.0)
    assert fixed.of(big, True) == 30.0
