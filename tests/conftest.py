"""Shared fixtures: one test body runs against every selected device.

``device`` is parametrized over the first selected device of each available
backend (``ANYCHIP_DEVICES`` narrows it, e.g. ``ANYCHIP_DEVICES=opencl:0 ci/test``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import anychip

TESTS = Path(__file__).resolve().parent       # tests/, laid out like the package: runtime/, devices/, ...
ROOT = TESTS.parent

# The one timeout policy. pytest-timeout ends a test after TEST_SECONDS (pyproject.toml's
# `timeout`; ci/test does not override it). A test that waits for a child process gives it
# CHILD_SECONDS, less than its own limit, so that the child's timeout fires first and the
# failure shows the child's output. The few tests that run whole suites or compile a framework
# extension are marked `pytest.mark.timeout(LONG_TEST_SECONDS)` and give their children
# LONG_CHILD_SECONDS. A shorter bound written in a test is part of what it asserts (a fault
# ends in bounded time), not a policy.
TEST_SECONDS = 300
CHILD_SECONDS = 240
LONG_TEST_SECONDS = 900
LONG_CHILD_SECONDS = 840


def _first_device_of_each_backend() -> list[str]:
    seen: dict[str, str] = {}
    try:
        for d in anychip.devices():
            seen.setdefault(d.backend, d.name)
    except anychip.SelectionError:
        return []
    return list(seen.values())


DEVICE_NAMES = _first_device_of_each_backend()


def ccl_segments() -> set[str]:
    """anychip's shared-memory segments in /dev/shm (other programs, MPI's among them, make their own)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("anychip-ccl-")} if os.path.isdir("/dev/shm") else set()


def leaked_segments(before: set[str]) -> set[str]:
    """anychip segments that appeared since ``before`` and stay. Another job on the machine can
    hold one for a moment while its ranks join (it is unlinked once all have); a leak stays, so
    a name still there after 2 s is one."""
    deadline = time.monotonic() + 2.0
    left = ccl_segments() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left &= ccl_segments()
    return left


@pytest.fixture(params=DEVICE_NAMES)
def device(request: pytest.FixtureRequest) -> anychip.Device:
    return anychip.device(request.param)


#: the backend name of the scaffolded C plugin (`anychip plugin new`, unchanged) some tests load
SCAFFOLD = "tkern"


def build_scaffold(directory: Path, name: str = SCAFFOLD) -> Path:
    """Render `anychip plugin new NAME` (C) in ``directory`` and compile it as its Makefile does
    (skips the test without a C compiler): the library's path."""
    from anychip.scaffold import new_plugin

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the scaffolded plugin")
    project = new_plugin(name, "c", directory)
    lib = project / f"lib{name}.so"
    subprocess.run([cc, "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-fPIC",
                    f"-I{project / 'include'}", "-shared", "-o", str(lib), str(project / "src" / f"{name}.c"),
                    "-lpthread", "-lm"], check=True, capture_output=True, text=True)
    return lib


@pytest.fixture(scope="session")
def scaffold_plugin(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The scaffolded C plugin, loaded once (its CPlugin instance; not registered)."""
    from anychip.devices import cplugin

    _, loader = cplugin.probe(str(build_scaffold(tmp_path_factory.mktemp("scaffold"))))
    return loader()


@pytest.fixture
def scaffold_device(scaffold_plugin: Any):
    """Device 0 of the scaffolded C plugin, registered for the test (backend SCAFFOLD)."""
    anychip.runtime.registry.register_plugin(scaffold_plugin, source="the scaffolded C plugin (tests)")
    try:
        yield anychip.device(f"{SCAFFOLD}:0")
    finally:
        anychip.device(f"{SCAFFOLD}:0").synchronize()
        anychip.runtime.registry.unregister_plugin(SCAFFOLD)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No ANYCHIP_DEVICES from the outside; registry and selection rebuilt after the test."""
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    yield monkeypatch
    anychip.runtime.registry.reset()


# What `pytest -m "not slow"` (the development loop, see CONTRIBUTING.md) leaves out: the
# multi-process jobs, sweeps and whole-suite runs, a few seconds to a minute each, together
# about half of the suite's time. ci/test runs them all. One `file::test function` a line;
# tests/test_markers.py checks that every name here is a test that exists.
SLOW = set("""
test_cli.py::test_info_flags_invalid_variables
test_collectives.py::test_chunked_rounds_with_tiny_slots
test_collectives.py::test_every_op_dtype_and_reduce_op_on_four_ranks
test_collectives.py::test_every_op_dtype_and_reduce_op_on_two_ranks
test_collectives.py::test_grouped_ring_survives_a_peer_that_finished_and_left
test_collectives.py::test_send_recv_ring_groups_and_split
test_conformance.py::test_collectives_that_move_no_data_fail_with_wrong_elements
test_conformance.py::test_pytest_plugin_reports_expected_and_got
test_conformance.py::test_pytest_plugin_runs_the_cases_per_device
test_conformance_mutants.py::test_a_wrong_kernel_fails_the_framework_certification
test_conformance.py::test_quick_pass_on_every_builtin_backend
test_conformance.py::test_tables_json_plot_and_progress
test_conformance_mutants.py::test_a_case_without_an_answer_fails_at_its_deadline
test_conformance_mutants.py::test_each_device_api_defect_of_a_python_plugin_fails
test_conformance_mutants.py::test_each_planted_defect_fails_the_case_of_its_class
test_conformance_mutants.py::test_sigterm_stops_the_whole_run
test_conformance_mutants.py::test_the_plugin_without_a_defect_passes_every_case
test_conformance_mutants.py::test_the_python_plugin_without_a_defect_passes
test_cplugin.py::test_collectives_plugin_refusing_a_group_size_fails_every_rank
test_cplugin.py::test_collectives_route_to_the_plugin
test_cplugin.py::test_a_native_collective_that_never_completes_times_out
test_cplugin.py::test_one_rank_whose_collective_never_completes_ends_the_job
test_cplugin.py::test_conformance_suite_fails_collectives_that_move_no_data
test_cplugin.py::test_plugin_collectives_pass_the_conformance_suite
test_cplugin.py::test_shared_memory_collectives_of_a_plugin_serve_two_ranks
test_cplugin.py::test_without_collectives_the_host_transport_serves
test_cplugin_scaffold.py::test_installed_plugins_are_listed
test_cplugin_scaffold.py::test_installed_plugins_pass_the_conformance_suite
test_env_values.py::test_an_infinite_timeout_on_two_ranks
test_env_values.py::test_anychip_info_accepts_valid_values
test_env_values.py::test_anychip_info_flags_every_invalid_collectives_value
test_faults.py::test_a_forked_child_cannot_act_as_its_parents_rank
test_faults.py::test_a_killed_peer_fails_the_pending_op_even_after_destroy
test_faults.py::test_a_rank_that_cannot_start_stops_the_others
test_faults.py::test_a_stopped_peer_is_a_timeout_naming_it
test_faults.py::test_abort_fails_the_pending_op_and_every_later_call
test_faults.py::test_an_mpi_timeout_ends_the_job_when_a_rank_hangs
test_fork.py::test_fork_while_another_thread_allocates
test_fork.py::test_opencl_child_exit_does_not_wait_for_the_parents_held_host_copy
test_fork.py::test_opencl_child_lists_it_unavailable_and_exits_cleanly
test_fork.py::test_opencl_in_a_forked_child_is_refused_not_hung
test_mpi.py::test_flat_mpi_every_op_dtype_and_redop
test_mpi.py::test_hierarchical_two_hosts_of_two_ranks
test_native_ccl.py::test_a_killed_peer_fails_the_others_within_seconds
test_native_ccl.py::test_a_peer_that_never_arrives_is_a_timeout_on_the_others
test_native_ccl.py::test_an_op_that_never_runs_times_out_on_every_rank
test_native_ccl.py::test_every_op_dtype_and_reduce_op_through_the_native_library
test_prepared.py::test_two_ranks_every_kind_exact
test_prepared.py::test_two_ranks_every_kind_exact_over_mpi
test_opencl_exit.py::test_exit_right_after_releasing_work_an_interrupted_wait_left_behind
test_paddle.py::test_conformance_suite_passes_on_the_plugin
test_paddle.py::test_generic_device_suite_passes_on_the_plugin
test_paddle.py::test_two_ranks_run_every_collective_through_xccl
test_paddle.py::test_xccl_all_reduce_that_moves_nothing_fails_the_suite
test_paddle_provider.py::test_collective_timeout_is_a_paddle_error_naming_the_rank
test_paddle_provider.py::test_info_lists_the_kernels_each_device_type_registers
test_paddle_provider.py::test_kernels_follow_the_plugins_masks
test_paddle_provider.py::test_a_kernel_table_the_bridge_does_not_know_is_not_used
test_paddle_provider.py::test_a_bridge_built_without_a_cxx_compiler_has_no_kernels
test_paddle_provider.py::test_collectives_four_ranks
test_paddle_provider.py::test_collectives_two_ranks
test_paddle_provider.py::test_conformance_framework_paddle
test_paddle_provider.py::test_data_parallel_example_matches_one_device
test_paddle_provider.py::test_kernels_run_on_the_device_without_fallback
test_paddle_provider.py::test_killed_rank_ends_the_job_and_leaves_no_shm
test_paddle_provider.py::test_static_program_runs_on_the_devices_kernels
test_parallel.py::test_every_reshard_matmul_and_gradient_across_ranks
test_parallel.py::test_example_small_matches_one_device
test_parallel.py::test_transformer_ops_and_gradients_across_ranks
test_parallel.py::test_transformer_example_matches_one_device
test_parallel.py::test_transformer_matches_paddle
test_sim_env.py::test_each_bad_setting_warns_once_and_good_ones_are_quiet
test_sim_env.py::test_memory_size_units_and_device_count
test_sim_env.py::test_visibility_variables_renumber_devices
test_sim_robustness.py::test_ctrl_c_interrupts_synchronize_of_work_that_never_completes
test_sim_robustness.py::test_synchronize_does_not_release_host_arrays_of_copies_enqueued_after_it_began
test_sim_robustness.py::test_synchronize_in_another_thread_keeps_host_arrays_of_later_copies
test_spawn.py::test_launched_ranks_beside_a_decoy_use_the_launchers_anychip
test_tensor_collectives.py::test_four_ranks_all_reduce_and_all_gather_tensors
test_torch_c10d.py::test_a_killed_rank_fails_the_survivors_op_naming_it
test_torch_c10d.py::test_a_rank_that_never_joins_is_a_timeout_naming_it
test_torch_c10d.py::test_an_aborted_group_fails_its_pending_op_at_once
test_torch_c10d.py::test_conformance_framework_torch_prints_tables_and_passes
test_torch_c10d.py::test_ddp_losses_equal_one_devices
test_torch_c10d.py::test_every_op_by_value_on_two_ranks
test_torch_c10d.py::test_work_wait_timeout_raises_naming_the_op_and_leaves_it_pending
test_torch_c10d.py::test_every_op_by_value_on_four_ranks
test_torch_c10d.py::test_a_c_plugins_collectives_take_the_cpp_path_where_its_masks_allow
test_torch_c10d.py::test_every_op_by_value_on_the_other_simulated_chips
test_torch_c10d.py::test_views_inside_a_storage_reuse_the_prepared_op_and_keep_no_freed_memory
test_torch_correctness.py::test_a_c_plugins_events_work_on_another_device_than_the_current_one
test_torch_correctness.py::test_c10d_reduces_complex_tensors_in_place
test_torch_correctness.py::test_pending_results_read_right_while_the_current_device_changes
test_torch_module.py::test_parallel_stages_on_four_ranks_equal_one_device
test_torch_module.py::test_spawned_dataloader_workers_use_the_device_without_importing_anychip
test_torch_opinfo.py::test_opinfo_every_float32_op_agrees_with_the_cpu
test_torch_opinfo.py::test_opinfo_subset_on_a_c_plugins_kernel_table
test_torch_provider.py::test_the_other_simulated_chips_serve_the_device
test_twohost.py::test_a_hosts_ranks_killed_end_the_job_naming_the_host
test_twohost.py::test_hierarchical_all_reduce_of_two_by_two_ranks_across_namespaces
test_twohost.py::test_the_link_going_down_mid_collective_is_a_timeout_on_every_rank_of_the_host
""".split())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in SLOW:
            item.add_marker(pytest.mark.slow)


def pytest_report_header(config: pytest.Config) -> str:
    lines = [f"anychip devices under test: {', '.join(DEVICE_NAMES) or 'none'}"]
    for b in anychip.backends():
        if not b.available:
            lines.append(f"  {b.name}: skipped, unavailable ({b.reason})")
    if os.environ.get("ANYCHIP_DEVICES"):
        lines.append(f"  ANYCHIP_DEVICES={os.environ['ANYCHIP_DEVICES']!r}")
    return "\n".join(lines)
