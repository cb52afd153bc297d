"""The simulator's HCCL / BKCL / RCCL are real C libraries with the vendors' API.

Programs in tests/c/ are written against the headers in csrc/include (the public
declarations) and the vendor runtime's C API, built with gcc against a simulator
library and run as 2 and 4 forked ranks; every rank checks its results exactly and
the vendor's result codes for bad arguments.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import CHILD_SECONDS, ccl_segments, leaked_segments

from anychip.runtime._libs import find_library

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = os.path.join(os.path.dirname(HERE), "c")
INCLUDE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc", "include")

PROGRAMS = [("hccl_ranks.c", "libascend_sim", "hccl"), ("bkcl_ranks.c", "libkunlun_sim", "bkcl"),
            ("nccl_ranks.c", "libhygon_sim", "nccl"),
            # rank table init, the v-variants, batch send/recv, the NULL stream (torch_npu's calls)
            ("hccl_v.c", "libascend_sim", "hccl v"),
            # unequal all-to-all with device-memory counts, as Paddle's AllToAllUnequalSplit calls it
            ("bkcl_v.c", "libkunlun_sim", "bkcl v"),
            # ncclCommInitRankConfig and ncclCommSplit (NCCL_SPLIT_NOCOLOR included)
            ("nccl_split.c", "libhygon_sim", "nccl split")]

SYMBOLS = {
    "libascend_sim": """HcclGetRootInfo HcclCommInitRootInfo HcclCommDestroy HcclGetRankSize HcclGetRankId
        HcclGetCommName HcclGetCommAsyncError HcclGetErrorString HcclAllReduce HcclBroadcast HcclReduce
        HcclReduceScatter HcclAllGather HcclAlltoAll HcclSend HcclRecv HcclBarrier HcclGroupStart HcclGroupEnd
        HcclCommInitAll HcclCommInitClusterInfo HcclAlltoAllV HcclAllGatherV HcclReduceScatterV HcclBatchSendRecv""",
    "libkunlun_sim": """bkcl_get_unique_id bkcl_init_rank bkcl_destroy_context bkcl_comm_abort bkcl_comm_count
        bkcl_comm_user_rank bkcl_all_reduce bkcl_broadcast bkcl_reduce bkcl_all_gather bkcl_reduce_scatter
        bkcl_all_to_all bkcl_all_to_all_v bkcl_send bkcl_recv bkcl_group_start bkcl_group_end
        anychip_sim_bkcl_async_error""",
    "libhygon_sim": """ncclGetVersion ncclGetUniqueId ncclCommInitRank ncclCommFinalize ncclCommDestroy
        ncclCommAbort ncclGetErrorString ncclGetLastError ncclCommGetAsyncError ncclCommCount ncclCommCuDevice
        ncclCommUserRank ncclReduce ncclBcast ncclBroadcast ncclAllReduce ncclReduceScatter ncclAllGather
        ncclAllToAll ncclSend ncclRecv ncclGroupStart ncclGroupEnd ncclCommInitAll ncclCommInitRankConfig
        ncclCommSplit""",
}


def _library(name: str) -> str:
    path = find_library(name)
    if path is None:
        pytest.skip(f"{name} is not built (pip install -e .)")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("native_ccl")
    exes = {}
    for source, libname, _ in PROGRAMS:
        lib = _library(libname)
        libdir, libfile = os.path.split(lib)
        exe = out / source[:-2]
        build = subprocess.run(
            [gcc, "-std=c11", "-Wall", "-Werror", "-Werror=implicit-function-declaration", f"-I{INCLUDE}", "-o",
             str(exe), os.path.join(C_SOURCES, source), f"-L{libdir}", f"-l:{libfile}", f"-Wl,-rpath,{libdir}"],
            capture_output=True, text=True)
        assert build.returncode == 0, build.stderr
        exes[source] = str(exe)
    return exes


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("source,libname,tag", PROGRAMS, ids=[p[2] for p in PROGRAMS])
@pytest.mark.slow
def test_c_program_runs_ranks_exactly(built, source, libname, tag, nranks):
    before = ccl_segments()
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith(("ANYCHIP_SIM", "ANYCHIP_CCL"))}
    run = subprocess.run([built[source], str(nranks)], capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.stdout.split("\n")[:-1]) == [f"{tag} ok rank {r}" for r in range(nranks)]
    assert run.stderr == ""
    left = leaked_segments(before)
    assert not left, f"segments left in /dev/shm: {sorted(left)}"


@pytest.mark.parametrize("libname", sorted(SYMBOLS))
def test_collective_symbols_exported_engine_private(libname):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", _library(libname)], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert not [s for s in SYMBOLS[libname].split() if s not in exported]
    # the engine compiled into the library stays private
    assert not sorted(s for s in exported if s.startswith(("ccl_", "sc_")))


# the NCCL user guide's examples ported to HIP + RCCL (fork stands in for MPI), and
# HcclCommInitAll: several devices in one process
SINGLE_PROCESS = [("nccl_guide.c", "libhygon_sim", ["1"], ["guide 1 ok"]),
                  ("nccl_guide.c", "libhygon_sim", ["2", "3"], ["guide 2 ok"] * 3),
                  ("nccl_guide.c", "libhygon_sim", ["3", "2", "2"], ["guide 3 ok"] * 2),
                  ("nccl_guide.c", "libhygon_sim", ["3t", "2", "2"], ["guide 3t ok"] * 2),
                  ("hccl_init_all.c", "libascend_sim", [], ["hccl init all ok"]),
                  ("nccl_split.c", "libhygon_sim", ["g"], ["nccl split group ok"])]


@pytest.mark.parametrize("source,libname,args,expected", SINGLE_PROCESS,
                         ids=["guide1-init-all", "guide2-process-per-device", "guide3-group-init",
                              "guide3-thread-per-device", "hccl-init-all", "nccl-split-in-group"])
def test_several_devices_per_process(tmp_path, source, libname, args, expected):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    lib = _library(libname)
    libdir, libfile = os.path.split(lib)
    exe = tmp_path / source[:-2]
    build = subprocess.run(
        [gcc, "-std=c11", "-Wall", "-Werror", "-Werror=implicit-function-declaration", f"-I{INCLUDE}", "-o",
         str(exe), os.path.join(C_SOURCES, source), f"-L{libdir}", f"-l:{libfile}", f"-Wl,-rpath,{libdir}",
         "-lpthread"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    before = ccl_segments()
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("VISIBLE_DEVICES") and not k.startswith(("ANYCHIP_SIM", "ANYCHIP_CCL"))}
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == expected
    assert run.stderr == ""
    left = leaked_segments(before)
    assert not left, f"segments left in /dev/shm: {sorted(left)}"
