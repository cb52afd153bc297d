"""Slow tests carry `@pytest.mark.slow` themselves (`-m "not slow"` is the development loop,
CONTRIBUTING.md), and a test that starts rank processes (`anychip launch -n`, mpiexec) is one of
them unless it is a launcher check kept in the fast loop on purpose (FAST_LAUNCHES)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

#: what starts rank processes, written in a test or in a helper of its module that it calls
LAUNCH = re.compile(r'"launch",\s*"-n"|\bmpiexec\b|\bmpirun\b|torch\.multiprocessing|mp\.spawn|'
                    r'paddle\.distributed\.launch')

#: the tests that start ranks and that the fast loop kept when the marks moved onto the tests
#: (the launcher's own checks, refusals before any rank starts, short jobs): `file::test`. A new
#: test that starts ranks is marked slow, or argued into this list
FAST_LAUNCHES = {
    "test_collectives.py::test_zero_copy_mappings_are_evicted_and_remade",
    "test_collectives.py::test_ranks_started_by_mpiexec",
    "test_collectives_api.py::test_launch_prefixes_output_and_sets_the_variables",
    "test_collectives_api.py::test_launch_output_into_a_closed_pipe_drops_the_rest_quietly",
    "test_collectives_api.py::test_launch_propagates_the_first_failure_and_stops_the_others",
    "test_collectives_api.py::test_launch_reports_a_signal_as_128_plus_its_number",
    "test_collectives_api.py::test_example_allreduce_on_simulated_ascend",
    "test_collectives_api.py::test_init_twice_in_one_job",
    "test_collectives_api.py::test_a_terminated_launcher_stops_its_ranks",
    "test_collectives_api.py::test_launch_a_module",
    "test_collectives_api.py::test_ranks_stopped_while_a_communicator_is_made_leave_no_segment",
    "test_faults.py::test_a_second_ctrl_c_kills_ranks_that_trap_sigterm",
    "test_faults.py::test_a_killed_launcher_leaves_no_rank",
    "test_mpi.py::test_uneven_hosts_fall_back_to_flat_mpi",
    "test_mpi.py::test_one_host_under_mpiexec_uses_the_engine_without_mpi",
    "test_mpi_host.py::test_spanning_hosts_without_mpi_is_refused",
    "test_mpi_host.py::test_mpi_transport_refuses_a_job_mpi_did_not_start",
    "test_cplugin.py::test_collectives_that_move_no_data_give_wrong_results",
    "test_cplugin_scaffold.py::test_installed_plugins_run_collectives",
    "test_paddle_launcher_choice.py::test_the_launcher_runs_on_the_plugins_chip",
    "test_paddle_provider.py::test_process_group_custom_like_paddles_test",
    "test_parallel.py::test_example_needs_four_ranks",
    "test_parallel.py::test_collectives_derived",
    "test_bad_arguments.py::test_launch_flags_are_checked_before_any_rank_starts",
    "test_bad_arguments.py::test_launch_of_an_unknown_backend",
    "test_bad_arguments.py::test_launch_of_a_program_that_cannot_run",
}


def _is_slow(node: ast.FunctionDef) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in node.decorator_list)


def _tests(source: str) -> dict[str, tuple[ast.FunctionDef, bool]]:
    """test function -> (its node, whether it starts ranks, directly or through a helper of its module)."""
    tree = ast.parse(source)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    # each function's calls and text, found once (ast.get_source_segment splits the whole source
    # on every call: 29 s for the suite's 728 tests on a busy two-core machine)
    calls = {name: {c.func.id for c in ast.walk(n) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
             for name, n in funcs.items()}
    lines = source.splitlines(keepends=True)
    launchers = {name for name, n in funcs.items() if LAUNCH.search("".join(lines[n.lineno - 1:n.end_lineno]))}
    grew = True
    while grew:
        more = {name for name in funcs if not name.startswith("test_") and calls[name] & launchers}
        grew = not more <= launchers
        launchers |= more
    return {name: (n, name in launchers or bool(calls[name] & launchers))
            for name, n in funcs.items() if name.startswith("test_")}


def _all_tests() -> dict[str, tuple[ast.FunctionDef, bool]]:
    return {f"{f.name}::{name}": t
            for f in sorted(TESTS.rglob("test_*.py")) if f.name != Path(__file__).name    # (its example launches)
            for name, t in _tests(f.read_text()).items()}


def test_every_test_that_starts_ranks_is_slow():
    found = _all_tests()
    unmarked = sorted(name for name, (node, ranks) in found.items()
                      if ranks and not _is_slow(node) and name not in FAST_LAUNCHES)
    assert unmarked == [], "tests that start rank processes without @pytest.mark.slow:\n" + "\n".join(unmarked)
    assert sorted(FAST_LAUNCHES - {n for n, (_, ranks) in found.items() if ranks}) == []
    assert sum(_is_slow(node) for node, _ in found.values()) > 40


def test_the_check_sees_a_launch_through_a_helper():
    source = ('import pytest, subprocess, sys\n'
              'def run(n):\n    return subprocess.run([sys.executable, "-m", "anychip.cli", "launch", "-n", str(n)])\n'
              'def twice():\n    run(2)\n'
              'def test_fast():\n    twice()\n'
              '@pytest.mark.slow\ndef test_marked():\n    run(4)\n'
              'def test_alone():\n    pass\n')
    found = _tests(source)
    assert {name: (ranks, _is_slow(node)) for name, (node, ranks) in found.items()} == {
        "test_fast": (True, False), "test_marked": (True, True), "test_alone": (False, False)}


def test_one_timeout_policy():
    """pyproject's per-test limit is conftest's TEST_SECONDS, ci/test does not override it, each
    child bound is under its test's limit, and no test writes its own long child bound."""
    import re

    from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS, TEST_SECONDS

    root = TESTS.parent
    assert re.search(r"^timeout = (\d+)$", (root / "pyproject.toml").read_text(), re.M).group(1) == str(TEST_SECONDS)
    assert "--timeout" not in (root / "ci" / "test").read_text()
    assert CHILD_SECONDS < TEST_SECONDS and LONG_CHILD_SECONDS < LONG_TEST_SECONDS
    literal = re.compile(r"\btimeout(?:=|: \w+ = )(\d+)|mark\.timeout\((\d+)\)")
    long_ones = [f"{f.relative_to(TESTS)}: {m.group(0)}" for f in sorted(TESTS.rglob("*.py"))
                 for m in literal.finditer(f.read_text()) if int(m.group(1) or m.group(2)) >= 120]
    assert long_ones == []


@pytest.mark.slow
def test_serial_tests_run_alone_or_not_at_all():
    """conftest's --serial: `only` keeps the tests marked serial (ci/test -n runs them alone
    first), `skip` the others (then run on several processes); the scaffold's installs are serial."""
    import subprocess
    import sys

    from conftest import CHILD_SECONDS
    files = ["tests/devices/test_cplugin_scaffold.py", "tests/test_fixture_cache.py"]

    def ids(mode: str) -> list[str]:
        r = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", f"--serial={mode}",
                            *files], capture_output=True, text=True, cwd=TESTS.parent, timeout=CHILD_SECONDS)
        assert r.returncode == 0, r.stdout + r.stderr
        return [line for line in r.stdout.splitlines() if "::" in line]
    every, only, skip = ids("run"), ids("only"), ids("skip")
    assert only and skip and sorted(only + skip) == sorted(every)
    assert all(i.startswith(files[0]) for i in only) and not any(i.startswith(files[0]) for i in skip)
