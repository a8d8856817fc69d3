"""A program cuco cannot handle is refused, with its reasons, never passed through or ended in a traceback:
`cuco check` refuses a .cu program without the runner's entry points, `cuco transform` follows buffers held in
struct fields (allocated in a helper too) or refuses in one line, and `cuco init` on a standalone program whose
communicator is made in a helper lists every blocker in one run and writes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WORKLOADS

from cuco.fastpath.analyze import analyze
from cuco.fastpath.rewrite import RewriteError, rewrite
from cuco.scaffold import create_workload
from cuco.scaffold.standalone.blockers import Blocked
from cuco.workload.check import check_workload
from cuco.workload.spec import load_workload

# This checkout's cuco, from whatever folder a command runs in.
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _cuco(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuco", *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=300, check=False)


def _line_of(source: str, words: str) -> int:
    return next(i for i, ln in enumerate(source.splitlines(), 1) if words in ln)


# ---- cuco check: the entry points -----------------------------------------------------------------------------

@pytest.fixture
def allreduce(tmp_path: Path) -> Path:
    root = tmp_path / "allreduce_sum"
    shutil.copytree(WORKLOADS / "allreduce_sum", root)
    return root


def _without(seed: str, name: str) -> str:
    """The seed with one entry point renamed, as a program that never defined it."""
    assert f"CUCO_EXPORT int {name}(" in seed
    return seed.replace(f"CUCO_EXPORT int {name}(", f"CUCO_EXPORT int my_{name}(")


def test_check_names_each_missing_entry_point(allreduce, tmp_path):
    seed = (allreduce / "seed.cu").read_text()
    candidate = tmp_path / "mine.cu"
    candidate.write_text(_without(_without(seed, "cuco_run"), "cuco_teardown"))
    assert check_workload(allreduce, candidate) == [
        f"{candidate}: defines no cuco_run(): the runner calls cuco_setup, cuco_run and cuco_teardown (cuco.h); "
        "declare it CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx)",
        f"{candidate}: defines no cuco_teardown(): the runner calls cuco_setup, cuco_run and cuco_teardown (cuco.h); "
        "declare it CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx)"]


def test_check_refuses_an_entry_point_with_cpp_linkage_and_takes_extern_c(allreduce, tmp_path):
    seed = (allreduce / "seed.cu").read_text()
    mangled = tmp_path / "mangled.cu"
    mangled.write_text(seed.replace("CUCO_EXPORT int cuco_setup(", "int cuco_setup("))
    [problem] = check_workload(allreduce, mangled)
    assert problem.startswith(f"{mangled}:{_line_of(seed, 'int cuco_setup(')}: cuco_setup() has C++ linkage")
    block = tmp_path / "block.cu"  # an extern "C" block, and a C declaration before a plain definition
    declared = '}\nextern "C" int cuco_run(cuco_ctx_t*);\nint cuco_run('  # the block ends before cuco_run
    block.write_text(seed.replace("CUCO_EXPORT int cuco_setup(", 'extern "C" {\nint cuco_setup(', 1)
                     .replace("CUCO_EXPORT int cuco_run(", declared, 1))
    assert check_workload(allreduce, block) == []


def test_cli_check_exits_2_on_a_seed_without_cuco_run(allreduce):
    (allreduce / "seed.cu").write_text(_without((allreduce / "seed.cu").read_text(), "cuco_run"))
    proc = _cuco("check", str(allreduce), cwd=allreduce)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "problem: seed.cu: defines no cuco_run()" in proc.stdout
    assert "Traceback" not in proc.stderr


# ---- cuco transform: buffers in struct fields ------------------------------------------------------------------

STATE = """\
#include "cuco.h"

struct Solver {
  float* x_full;
  float* x_sum;
  int64_t n;
};

static int allocate(cuco_ctx_t* ctx, Solver* s) {
  CUCO_CUDA(ctx, cudaMalloc(&s->x_full, s->n * sizeof(float)));
  CUCO_CUDA(ctx, cudaMalloc(&s->x_sum, s->n * sizeof(float)));
  return 0;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  Solver* s = new Solver;
  s->n = cuco_param(ctx, "N");
  ctx->state = s;
  return allocate(ctx, s);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  Solver* s = (Solver*)ctx->state;
  CUCO_NCCL(ctx, ncclAllReduce(s->x_full, s->x_sum, s->n, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Solver* s = (Solver*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->x_full));
  CUCO_CUDA(ctx, cudaFree(s->x_sum));
  delete s;
  return 0;
}
"""

STANDALONE = """\
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>

struct State {
  float* x_full;
  float* x_sum;
  size_t n;
};

static void allocate(State* s) {
  cudaMalloc(&s->x_full, s->n * sizeof(float));
  cudaMalloc(&s->x_sum, s->n * sizeof(float));
}

int main(int argc, char* argv[]) {
  int rank = atoi(getenv("RANK")), nranks = atoi(getenv("WORLD_SIZE"));
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t comm;
  ncclCommInitRank(&comm, nranks, id, rank);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  State st;
  State* s = &st;
  s->n = 1 << 20;
  allocate(s);
  for (int it = 0; it < 10; ++it) ncclAllReduce(s->x_full, st.x_sum, s->n, ncclFloat, ncclSum, comm, stream);
  cudaStreamSynchronize(stream);
  float h = 0;
  cudaMemcpy(&h, st.x_sum, sizeof(float), cudaMemcpyDeviceToHost);
  ncclCommDestroy(comm);
  return h == 0;
}
"""


def test_struct_fields_allocated_in_a_helper_move_to_windows(tmp_path):
    """`cudaMalloc(&s->x_full)` in a helper given `Solver* s` allocates the field, not s: the rewrite finds the
    allocation of each field the collective uses and moves it to ncclMemAlloc and a window."""
    program = tmp_path / "state.cu"
    program.write_text(STATE)
    rw = rewrite(analyze(program), load_workload(WORKLOADS / "allreduce_sum"))
    assert "cuco::allReduce<float>(ctx, cucoWin_s_x_full, 0, cucoWin_s_x_sum, 0, s->n, ctx->stream)" in rw.code
    assert "cuco::symmetricAlloc(ctx, (void**)&s->x_full, s->n * sizeof(float), &cucoWin_s_x_full)" in rw.code
    assert "cuco::symmetricFree(ctx, s->x_sum, cucoWin_s_x_sum)" in rw.code


def test_a_standalone_program_with_struct_fields_is_refused_in_one_line(tmp_path):
    program = tmp_path / "solver.cu"
    program.write_text(STANDALONE)
    line = _line_of(STANDALONE, "ncclAllReduce(")
    with pytest.raises(RewriteError, match=rf"^line {line}: ncclAllReduce's receive buffer `st.x_sum` is neither"):
        rewrite(analyze(program), load_workload(WORKLOADS / "allreduce_sum"))
    proc = _cuco("transform", "allreduce_sum", "--source", str(program), "--device", "cpu", "--out",
                 str(tmp_path / "out.cu"), cwd=ROOT)
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert errors[0].startswith(f"error: {program}: ") and "Traceback" not in proc.stderr


# ---- cuco init: every blocker at once --------------------------------------------------------------------------

HELPER_COMM = """\
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>

__global__ void count_wrong(const float* y, size_t n, float want, int* bad) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n && y[i] != want) atomicAdd(bad, 1);
}

static ncclComm_t make_comm(int rank, int nranks) {
  ncclUniqueId id;
  FILE* f = fopen(getenv("NCCL_ID_FILE"), rank == 0 ? "wb" : "rb");
  if (rank == 0) { ncclGetUniqueId(&id); fwrite(&id, sizeof(id), 1, f); } else { fread(&id, sizeof(id), 1, f); }
  fclose(f);
  ncclComm_t comm;
  ncclCommInitRank(&comm, nranks, id, rank);
  return comm;
}

static void reduce(float* x, float* y, size_t n, ncclComm_t comm, cudaStream_t stream) {
  ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, stream);
}

int main(int argc, char* argv[]) {
  int rank = atoi(getenv("RANK")), nranks = atoi(getenv("WORLD_SIZE"));
  size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1 << 20;
  cudaSetDevice(rank);
  ncclComm_t comm = make_comm(rank, nranks);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float *x, *y;
  int* bad;
  cudaMalloc(&x, n * sizeof(float));
  cudaMalloc(&y, n * sizeof(float));
  cudaMalloc(&bad, sizeof(int));
  for (int it = 0; it < 10; ++it) reduce(x, y, n, comm, stream);
  count_wrong<<<(n + 255) / 256, 256, 0, stream>>>(y, n, 0.0f, bad);
  int h_bad = 0;
  cudaMemcpy(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost);
  printf("%s\\n", h_bad ? "WRONG" : "OK");
  ncclCommDestroy(comm);
  return 0;
}
"""


# make_comm() returning early: it stays a call, so the communicator is made where the runner cannot take it over.
HELPER_COMM_EARLY = HELPER_COMM.replace("  ncclUniqueId id;\n  FILE*", "  if (nranks < 1) return nullptr;\n"
                                                                  "  ncclUniqueId id;\n  FILE*")


def test_a_communicator_returned_by_a_helper_is_converted(tmp_path):
    """make_comm() written out, its returned local main()'s comm (the runner's in the seed), reduce() too."""
    program = tmp_path / "helper_comm.cu"
    program.write_text(HELPER_COMM)
    made = create_workload("w", program, tmp_path)
    assert made.reading == ["written out where main() calls them: make_comm(), reduce()"]
    run = (made.root / "seed.cu").read_text().split("int cuco_run(")[1]
    assert "ncclComm_t comm = ctx->comm;" in run and "ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, stream)" in run


def test_init_lists_every_blocker_of_a_communicator_made_in_a_helper(tmp_path):
    program = tmp_path / "helper_comm.cu"
    program.write_text(HELPER_COMM_EARLY)
    with pytest.raises(Blocked) as err:
        create_workload("w", program, tmp_path)
    assert err.value.blockers == [
        f"{program}:{_line_of(HELPER_COMM_EARLY, 'ncclCommInitRank')}: `ncclCommInitRank(&comm, nranks, id, rank);`: "
        "creates the communicator inside make_comm(), which cuco cannot write out in place (it returns before its "
        f"end (helper_comm.cu:{_line_of(HELPER_COMM_EARLY, 'return nullptr')})): cuco takes over the communicator "
        "main() creates (it becomes ctx->comm); create it in main(), or in a helper main() calls that returns it or "
        "takes its address",
        f"{program}:{_line_of(HELPER_COMM_EARLY, 'ncclAllReduce')}: `ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, "
        "stream)`: in reduce(), its send buffer `x` and receive buffer `y`: a parameter of reduce(): the conversion "
        "follows only buffers main() allocates and hands to NCCL itself"]
    assert not (tmp_path / "w").exists()


def test_init_names_a_main_that_creates_no_communicator(tmp_path):
    program = tmp_path / "no_comm.cu"
    program.write_text(HELPER_COMM.replace("ncclCommInitRank(&comm, nranks, id, rank);", "comm = nullptr;"))
    with pytest.raises(Blocked) as err:
        create_workload("w", program, tmp_path)
    first = err.value.blockers[0]
    assert first.startswith(f"{program}:{_line_of(HELPER_COMM, 'int main(')}: `int main(...)`: creates no communicator")
    assert len(err.value.blockers) == 2 and "in reduce()" in err.value.blockers[1]


def test_cli_init_exits_2_with_every_blocker_and_writes_nothing(tmp_path):
    (tmp_path / "helper_comm.cu").write_text(HELPER_COMM_EARLY)
    proc = _cuco("init", "w", "--from", "helper_comm.cu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "2 blocker(s)" in proc.stderr and "inside make_comm()" in proc.stderr and "in reduce()" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["helper_comm.cu"]
