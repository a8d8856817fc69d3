"""`cuco init` on standalone programs (their own main(): MPI or a launcher starts the ranks, main creates the
communicator, allocates, loops over its step): the seed written is the step in the candidate ABI, it passes the
static checks and builds, the workload loads with what a careful human would write, and what cannot be placed is
refused in one line naming the file and line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

from cuco.errors import CucoError
from cuco.fastpath.syntax import blank_macros, function_name, parser, text, walk
from cuco.scaffold import create_workload
from cuco.scaffold.standalone.blockers import Blocked
from cuco.workload.expr import eval_expr
from cuco.workload.spec import load_workload

EXAMPLES = ROOT / "examples" / "standalone"
ENTRY_POINTS = ("cuco_setup", "cuco_run", "cuco_teardown")


@dataclass
class Want:
    """What a careful human writes in workload.toml for the example, and what its step must be in the seed."""

    params: dict[str, int]  # the program's own sizes
    buffers: dict[str, tuple[str, str, list[str], bool]]  # role, dtype, shape, symmetric
    program_buffers: list[str]  # the program's device pointers the runner now gives
    flops: str
    comm_bytes: str
    step: list[str]  # the calls of cuco_run, in order


WANT = {
    # mpirun; a kernel then an all-reduce, in a loop
    "mpi_allreduce": Want(
        {"count": 1 << 22},
        {"grad": ("input", "f32", ["count"], False), "weight": ("input", "f32", ["count"], False),
         "scaled": ("scratch", "f32", ["count"], True), "sum": ("output", "f32", ["count"], True)},
        ["d_grad", "d_weight", "d_scaled", "d_sum"],
        "0", "2 * (world - 1) * count * 4 / world",
        ["scale_by", "cudaGetLastError", "ncclAllReduce"]),
    # RANK / WORLD_SIZE / LOCAL_RANK, the id through a file; a cuBLAS bf16 GEMM then an all-gather
    "env_gemm_allgather": Want(
        {"M": 8192, "K": 4096, "N": 4096},
        {"x": ("input", "bf16", ["M / world", "K"], False), "w": ("parameter", "bf16", ["K", "N"], False),
         "y_local": ("scratch", "bf16", ["M / world", "N"], True), "y": ("output", "bf16", ["M", "N"], True)},
        ["d_x", "d_w", "d_y_local", "d_y"],
        "2 * (M / world) * K * N", "(world - 1) * (M / world) * N * 2",
        ["cublasGemmEx", "ncclAllGather"]),
    # the id over TCP; the step captured into a CUDA graph: a reduce-scatter then a kernel
    "graph_reducescatter": Want(
        {"shard_count": 1 << 24},
        {"grad": ("input", "f32", ["world", "shard_count"], True),
         "shard": ("output", "f32", ["shard_count"], True)},
        ["d_grad", "d_shard"],
        "0", "(world - 1) * shard_count * 4",
        ["ncclReduceScatter", "scale", "cudaGetLastError"]),
}


def _envs(params: list[str]) -> list[dict[str, int]]:
    return [{**{p: 96 * (i + k + 1) for i, p in enumerate(params)}, "world": world} for k, world in ((0, 2), (3, 4))]


def _same(got: str, want: str, envs: list[dict[str, int]]) -> bool:
    return all(eval_expr(got, env) == eval_expr(want, env) for env in envs)


def _functions(source: bytes) -> dict[str, object]:
    root = parser().parse(blank_macros(source)).root_node
    assert not [n for n in walk(root) if n.type == "ERROR" or n.is_missing], "the seed does not parse"
    return {function_name(n): n for n in walk(root) if n.type == "function_definition"}


def _calls(node) -> list[str]:
    out = []
    for n in walk(node):
        fn = n.child_by_field_name("function") if n.type == "call_expression" else None
        if fn is not None:
            out.append(text(fn))
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    parent = tmp_path_factory.mktemp("standalone")
    return {name: create_workload(name, EXAMPLES / f"{name}.cu", parent).root for name in WANT}


@pytest.mark.parametrize("name", sorted(WANT))
def test_seed_has_the_entry_points_and_keeps_the_original(made, name):
    root = made[name]
    assert sorted(p.name for p in root.iterdir()) == ["original.cu", "reference.py", "seed.cu", "workload.toml"]
    assert (root / "original.cu").read_bytes() == (EXAMPLES / f"{name}.cu").read_bytes()
    source = (root / "seed.cu").read_text()
    functions = _functions(source.encode())
    assert set(ENTRY_POINTS) <= set(functions) and "main" not in functions
    for entry in ENTRY_POINTS:
        assert f"CUCO_EXPORT int {entry}(cuco_ctx_t* ctx)" in source
    assert '#include "cuco.h"' in source


@pytest.mark.parametrize("name", sorted(WANT))
def test_seed_leaves_the_runners_part_to_the_runner(made, name):
    """No MPI, no communicator or stream of its own, no allocation of the workload's buffers, no host sync, no
    loop over the iterations, no printing: cuco_run is one step on ctx->stream with ctx->comm."""
    want = WANT[name]
    source = (made[name] / "seed.cu").read_text()
    for gone in ("MPI_", "mpi.h", "ncclCommInitRank", "ncclGetUniqueId", "ncclCommDestroy", "cudaStreamCreate",
                 "cudaSetDevice", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaStreamBeginCapture",
                 "cudaGraphLaunch", "printf", "getenv", "exit(", "iters", "argv"):
        assert gone not in source, gone
    functions = _functions(source.encode())
    run = functions["cuco_run"]
    assert not [n for n in walk(run) if n.type in ("for_statement", "while_statement", "do_statement")]
    calls = _calls(run)
    assert [c for c in calls if c not in ("cuco_param", "cuco_buffer") and not c.startswith("CUCO_")] == want.step
    allocated = [m.group(1) for m in re.finditer(r"(?:cudaMalloc|ncclMemAlloc)\(\s*&?\s*([\w>-]+)", source)]
    assert not set(allocated) & set(want.program_buffers)
    assert all(a.startswith("s->") for a in allocated)  # only cuco_setup's private scratch
    for var, buf in zip(want.program_buffers, want.buffers):
        assert f'cuco_buffer(ctx, "{buf}")->ptr' in source and var in source
        # the program's own pointer is bound to that buffer (not merely named somewhere in the seed)
        assert re.search(rf'\b{var} = (\([\w ]+\*\))?cuco_buffer\(ctx, "{buf}"\)->ptr;', source), (var, buf)
    assert "ctx->comm" in source and "ctx->stream" in source


def test_cublas_handle_and_workspace_move_into_setup_and_teardown(made):
    """The GEMM's handle is cuco_setup's, bound to ctx->stream, with the program's private cuBLAS workspace;
    cuco_teardown frees both."""
    functions = _functions((made["env_gemm_allgather"] / "seed.cu").read_bytes())
    setup, teardown = (text(functions[f]) for f in ("cuco_setup", "cuco_teardown"))
    assert "cublasCreate(&s->handle)" in setup and "cublasSetStream(s->handle, ctx->stream)" in setup
    assert "cudaMalloc(&s->d_workspace, workspace_bytes)" in setup
    assert "cublasSetWorkspace(s->handle, s->d_workspace, workspace_bytes)" in setup
    assert "cudaFree(s->d_workspace)" in teardown and "cublasDestroy(s->handle)" in teardown
    assert "cublasHandle_t handle = s->handle;" in text(functions["cuco_run"])


@pytest.mark.parametrize("name", sorted(WANT))
def test_seed_passes_the_static_checks(made, name):
    from cuco.runner.build.static_checks import check_source

    report = check_source(made[name] / "seed.cu")
    assert report.ok, report.problems


@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(WANT))
def test_seed_builds_through_the_checks(made, name):
    from cuco.runner.build.cuda_checks import check_and_build

    built, problems = check_and_build(made[name] / "seed.cu")
    assert problems == [] and built.ok, built.log[-3000:]


@pytest.mark.parametrize("name", sorted(WANT))
def test_workload_has_what_a_careful_human_writes(made, name):
    want = WANT[name]
    spec = load_workload(made[name])
    assert list(spec.params) == list(want.params)
    assert spec.shapes[0].params == want.params  # the program's own sizes, not placeholders
    envs = _envs(list(want.params))
    assert set(spec.buffers) == set(want.buffers)
    for buf, (role, dtype, shape, symmetric) in want.buffers.items():
        b = spec.buffers[buf]
        assert (b.role, b.dtype, b.symmetric) == (role, dtype, symmetric), buf
        assert len(b.shape) == len(shape) and all(_same(g, w, envs) for g, w in zip(b.shape, shape)), (buf, b.shape)
    assert _same(spec.bounds.flops, want.flops, envs), spec.bounds.flops
    assert _same(spec.bounds.comm_bytes, want.comm_bytes, envs), spec.bounds.comm_bytes
    toml = (made[name] / "workload.toml").read_text()
    assert not [ln for ln in toml.splitlines() if ln.startswith(("role", "dtype", "shape")) and "TODO" in ln]


# ---- refusals --------------------------------------------------------------------------------------------------

PROGRAM = """\
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CUDACHECK(cmd) do { cudaError_t e = cmd; if (e != cudaSuccess) exit(1); } while (0)
#define NCCLCHECK(cmd) do { ncclResult_t r = cmd; if (r != ncclSuccess) exit(1); } while (0)

__global__ void sum_squares(const float* x, float* out, size_t n) { }
__global__ void scale(float* x, float s, size_t n) { }
static void clip_and_reduce(float* g, size_t n, ncclComm_t comm, cudaStream_t stream) {
  ncclAllReduce(g, g, n, ncclFloat, ncclSum, comm, stream);
}
static bool reduce_early(float* g, size_t n, ncclComm_t comm, cudaStream_t stream) {
  if (n == 0) return true;
  ncclAllReduce(g, g, n, ncclFloat, ncclSum, comm, stream);
  return false;
}

int main(int argc, char* argv[]) {
  int rank, nranks;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream;
  CUDACHECK(cudaStreamCreate(&stream));
  const size_t count = 1 << 20;
  const float max_norm = 1.0f;
  float *d_grad, *d_norm, *d_sum;
  float h_norm = 0.0f;
  CUDACHECK(cudaMalloc(&d_grad, count * sizeof(float)));
  CUDACHECK(cudaMalloc(&d_norm, sizeof(float)));
  CUDACHECK(cudaMalloc(&d_sum, count * sizeof(float)));
  for (int it = 0; it < 100; ++it) {
STEP
  }
  CUDACHECK(cudaStreamSynchronize(stream));
  MPI_Finalize();
  return 0;
}
"""
ALLREDUCE = "    NCCLCHECK(ncclAllReduce(d_grad, d_sum, count, ncclFloat, ncclSum, comm, stream));"
NORM = ("    sum_squares<<<256, 256, 0, stream>>>(d_grad, d_norm, count);\n"
        "    CUDACHECK(cudaMemcpy(&h_norm, d_norm, sizeof(float), cudaMemcpyDeviceToHost));")

# (the step, the statement refused, words of the reason)
REFUSED = {
    "branch_on_device_data": (
        f"{NORM}\n    if (h_norm > max_norm) scale<<<256, 256, 0, stream>>>(d_grad, max_norm / h_norm, count);\n"
        f"{ALLREDUCE}",
        "if (h_norm > max_norm)", "decides on the host, in the middle of the step, from device data (h_norm"),
    "argument_from_device_data": (
        f"{NORM}\n    const float factor = max_norm / h_norm;\n    scale<<<256, 256, 0, stream>>>(d_grad, factor, "
        f"count);\n{ALLREDUCE}",
        "scale<<<256, 256, 0, stream>>>(d_grad, factor, count);", "uses factor, which the host has from device data"),
    "loop_counter": (
        f"    scale<<<256, 256, 0, stream>>>(d_grad, 1.0f / (it + 1), count);\n{ALLREDUCE}",
        "scale<<<256, 256, 0, stream>>>(d_grad, 1.0f / (it + 1), count);",
        "uses it, which changes from one iteration to the next"),
    "work_in_a_helper": (
        "    reduce_early(d_grad, count, comm, stream);",
        "reduce_early(d_grad, count, comm, stream);",
        "calls reduce_early(), a function of the program that issues device work and that cuco cannot write out in "
        "place: it returns before its end"),
    "allocation_in_the_step": (
        f"    float* tmp;\n    CUDACHECK(cudaMalloc(&tmp, count * sizeof(float)));\n{ALLREDUCE}",
        "CUDACHECK(cudaMalloc(&tmp, count * sizeof(float)));", "allocates or frees memory in the step"),
    "launch_through_the_runtime": (
        "    float s = 0.5f;\n    void* args[] = {&d_grad, &s, (void*)&count};\n"
        "    CUDACHECK(cudaLaunchKernel((void*)scale, 256, 256, args, 0, stream));\n" + ALLREDUCE,
        "CUDACHECK(cudaLaunchKernel((void*)scale, 256, 256, args, 0, stream));",
        "launches a kernel through cudaLaunchKernel: cuco reads what a kernel does from a launch written "
        "kernel<<<grid, block, shared, stream>>>(args)"),
}


def _line_of(source: str, statement: str) -> int:
    return next(i for i, ln in enumerate(source.splitlines(), 1) if statement in ln)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_cannot_be_placed_is_one_line_with_file_and_line(tmp_path, case):
    step, statement, words = REFUSED[case]
    source = PROGRAM.replace("STEP", step)
    program = tmp_path / f"{case}.cu"
    program.write_text(source)
    with pytest.raises(CucoError) as err:
        create_workload("w", program, tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{program}:{_line_of(source, statement)}: `{statement}`: "), message
    assert words in message
    assert not (tmp_path / "w").exists()


def test_every_statement_of_the_step_that_cannot_be_kept_is_named_in_one_run(tmp_path):
    """A step with several blockers (device data deciding a branch, work in a helper, an allocation, a counter in an
    argument) is refused with all of them, each file:line and statement with its reason, and nothing written:
    a user mends them together instead of one per run."""
    cases = ("branch_on_device_data", "work_in_a_helper", "allocation_in_the_step", "loop_counter")
    step = "\n".join(REFUSED[c][0].replace(f"\n{ALLREDUCE}", "") for c in cases) + f"\n{ALLREDUCE}"
    source = PROGRAM.replace("STEP", step)
    program = tmp_path / "many.cu"
    program.write_text(source)
    with pytest.raises(Blocked) as err:
        create_workload("w", program, tmp_path)
    assert len(err.value.blockers) == len(cases), err.value.blockers
    for case, line in zip(cases, err.value.blockers):
        _, statement, words = REFUSED[case]
        assert line.startswith(f"{program}:{_line_of(source, statement)}: `{statement}`: ") and words in line, line
    assert f"({len(cases)} blocker(s)" in str(err.value)
    assert not (tmp_path / "w").exists()


def test_cli_refuses_a_step_that_branches_on_device_data(tmp_path):
    step, statement, _ = REFUSED["branch_on_device_data"]
    source = PROGRAM.replace("STEP", step)
    (tmp_path / "clip.cu").write_text(source)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "cuco", "init", "w", "--from", "clip.cu"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"clip.cu:{_line_of(source, statement)}: `if (h_norm > max_norm)`: decides on the host" in lines[0]
    assert not (tmp_path / "w").exists()


def test_two_loops_that_issue_different_steps_are_refused(tmp_path):
    source = PROGRAM.replace("STEP", ALLREDUCE).replace(
        "  CUDACHECK(cudaStreamSynchronize(stream));",
        "  for (int it = 0; it < 5; ++it) NCCLCHECK(ncclBroadcast(d_grad, d_sum, count, ncclFloat, 0, comm, stream));\n"
        "  CUDACHECK(cudaStreamSynchronize(stream));")
    (tmp_path / "two.cu").write_text(source)
    with pytest.raises(CucoError, match=r"two\.cu:\d+: `for \(int it = 0; it < 5; \+\+it\)`: issues other work than "
                                        r"the loop at line \d+"):
        create_workload("w", tmp_path / "two.cu", tmp_path)


def test_a_warmup_loop_and_a_timed_loop_make_one_step(tmp_path):
    source = PROGRAM.replace("STEP", ALLREDUCE).replace(
        "  for (int it = 0; it < 100; ++it) {",
        "  for (int w = 0; w < 5; ++w) {\n" + ALLREDUCE + "\n  }\n  for (int it = 0; it < 100; ++it) {")
    (tmp_path / "warm.cu").write_text(source)
    seed = (create_workload("w", tmp_path / "warm.cu", tmp_path).root / "seed.cu").read_text()
    assert seed.count("ncclAllReduce") == 1


def test_default_stream_unchecked_calls_and_a_size_from_the_environment(tmp_path):
    """Work on the default stream moves onto ctx->stream, unchecked calls are checked, a synchronous memset
    becomes an asynchronous one, and a size read from the environment is a parameter with the program's default."""
    source = PROGRAM.replace(
        "  const size_t count = 1 << 20;",
        '  const char* env_count = getenv("COUNT");\n'
        "  const size_t count = env_count ? strtoull(env_count, nullptr, 10) : (size_t)1 << 20;").replace(
        "STEP", "    scale<<<256, 256>>>(d_grad, 0.5f, count);\n    cudaMemset(d_norm, 0, sizeof(float));\n"
                "    ncclAllReduce(d_grad, d_sum, count, ncclFloat, ncclSum, comm, 0);\n    cudaDeviceSynchronize();")
    (tmp_path / "plain_stream.cu").write_text(source)
    root = create_workload("w", tmp_path / "plain_stream.cu", tmp_path).root
    run = text(_functions((root / "seed.cu").read_bytes())["cuco_run"])
    for line in ("const size_t count = (size_t)cuco_param(ctx, \"count\");",
                 "scale<<<256, 256, 0, ctx->stream>>>(d_grad, 0.5f, count);",
                 "CUCO_CUDA(ctx, cudaGetLastError());",
                 "CUCO_CUDA(ctx, cudaMemsetAsync(d_norm, 0, sizeof(float), ctx->stream));",
                 "CUCO_NCCL(ctx, ncclAllReduce(d_grad, d_sum, count, ncclFloat, ncclSum, comm, ctx->stream));"):
        assert line in run, line
    assert "Synchronize" not in run and "getenv" not in (root / "seed.cu").read_text()
    assert load_workload(root).shapes[0].params == {"count": 1 << 20}


def test_a_size_fixed_at_file_scope_stays_a_constant(tmp_path):
    """The seed keeps the program's #define, so the workload holds its value, never a parameter it could vary; a
    step with no size of main() at all is refused."""
    source = PROGRAM.replace("#define CUDACHECK", "#define HALO (1 << 10)\n#define CUDACHECK").replace(
        "cudaMalloc(&d_norm, sizeof(float))", "cudaMalloc(&d_norm, HALO * sizeof(float))").replace(
        "STEP", ALLREDUCE + "\n    NCCLCHECK(ncclAllReduce(d_norm, d_norm, HALO, ncclFloat, ncclSum, comm, stream));")
    (tmp_path / "halo.cu").write_text(source)
    spec = load_workload(create_workload("w", tmp_path / "halo.cu", tmp_path).root)
    assert spec.params == ("count",) and spec.buffers["norm"].shape == ("1024",)
    assert _same(spec.bounds.comm_bytes, "2 * (world - 1) * (count + 1024) * 4 / world", _envs(["count"]))
    fixed = PROGRAM.replace("  const size_t count = 1 << 20;\n", "").replace(
        "#define CUDACHECK", "#define COUNT (1 << 20)\n#define CUDACHECK").replace("count", "COUNT").replace(
        "STEP", ALLREDUCE.replace("count", "COUNT"))
    (tmp_path / "fixed.cu").write_text(fixed)
    with pytest.raises(CucoError, match=r"fixed\.cu:\d+: `for \(int it = 0; it < 100; \+\+it\)`: no size of the step "
                                        r"is a variable of main\(\)"):
        create_workload("v", tmp_path / "fixed.cu", tmp_path)


# ---- the examples as programs ----------------------------------------------------------------------------------

def _mpi_flags() -> list[str] | None:
    """The MPI compiler wrapper's include and link flags, or None without an MPI."""
    for wrapper in ("mpicxx", "mpic++", "mpicc"):
        if shutil.which(wrapper):
            flags = []
            for what in ("compile", "link"):
                proc = subprocess.run([wrapper, f"--showme:{what}"], capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    return None
                flags += proc.stdout.split()
            return flags
    return None


@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(WANT))
def test_the_examples_build_as_they_are(tmp_path, name):
    from cuco.runner.build.toolchain import find_toolchain

    tc = find_toolchain()
    extra: list[str] = []
    if name == "mpi_allreduce":
        flags = _mpi_flags()
        if flags is None:
            pytest.skip("no MPI here (mpicxx --showme): mpi_allreduce.cu needs mpi.h; install libopenmpi-dev")
        extra = flags
    libs = []
    for lib_dir, prefix in ((tc.nccl_lib, "libnccl.so"), (tc.cublas_lib, "libcublas.so")):
        found = sorted(Path(lib_dir).glob(prefix + "*"), key=lambda p: len(p.name)) if lib_dir else []
        libs += [f"-L{found[0].parent}", f"-l:{found[0].name}"] if found else [f"-l{prefix[3:-3]}"]
    includes = [f"-I{d}" for d in (tc.nccl_include, tc.cublas_include) if d]
    cmd = [str(tc.nvcc), "-std=c++17", "-O1", "-Wno-deprecated-gpu-targets", str(EXAMPLES / f"{name}.cu"), "-o",
           str(tmp_path / name), *includes, *libs, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("beta,role", [("0.0f", "output"), ("1.0f", "inout")])
def test_a_gemm_output_is_read_only_where_beta_is_not_zero(tmp_path, beta, role):
    """cuBLASLt's D = alpha A B + beta C with C = D, then an in-place all-reduce: with beta zero the step writes the
    gradient before anything reads it (an output); with beta one it accumulates into it (updated in place)."""
    src = (ROOT / "tests" / "init_programs" / "lt_data_parallel.cu").read_text()
    assert "beta = 0.0f" in src
    (tmp_path / "p.cu").write_text(src.replace("beta = 0.0f", f"beta = {beta}"))
    spec = load_workload(create_workload("w", tmp_path / "p.cu", tmp_path).root)
    assert spec.buffers["grad"].role == role and spec.buffers["a"].role == "input"


@pytest.mark.nvcc
def test_init_says_when_the_seed_it_wrote_does_not_build(tmp_path):
    """A converted seed is built before `cuco init` reports it created: one cuco cannot build is cuco's failure
    (exit 3, the compiler's first error), unless it keeps a header of the program's that was not given: then the
    user's to give (exit 2, naming the header)."""
    from cuco.cli import _converted_seed_builds
    from cuco.errors import CucoFailure
    from cuco.scaffold.create import Created

    made = create_workload("w", EXAMPLES / "env_gemm_allgather.cu", tmp_path)
    seed = made.root / "seed.cu"
    seed.write_text(seed.read_text().replace("CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {",
                                             "CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {\n  T* lost = nullptr;"))
    with pytest.raises(CucoFailure, match=r"cuco wrote a seed that does not build: .*identifier \"T\" is undefined"):
        _converted_seed_builds(made)
    warned = Created(made.root, made.scaffold, 0, ['p.cu:3: seed.cu keeps #include "t.h": paste what it needs'], [],
                     True)
    with pytest.raises(CucoError, match=r'seed.cu does not build: .*; give the program\'s header "t.h" too \(--from\)'):
        _converted_seed_builds(warned)


def test_a_step_without_sizes_is_named_with_the_other_blockers(tmp_path):
    """Sizes fixed by #define and a method that issues device work: both blockers in the same run, the missing size
    too (it would otherwise appear only once the method is fixed)."""
    (tmp_path / "p.cu").write_text("""#include <mpi.h>
#include <nccl.h>
#define N (1 << 20)
struct Scaler {
  void run(float* x, cudaStream_t s) { cudaMemsetAsync(x, 0, N * sizeof(float), s); }
};
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  ncclCommInitRank(&comm, world, id, rank);
  cudaStream_t s;
  cudaStreamCreate(&s);
  const size_t m = argc > 1 ? atol(argv[1]) : 4096;  // a size the step does not use
  float *x, *y;
  cudaMalloc(&x, N * sizeof(float));
  cudaMalloc(&y, m * sizeof(float));
  cudaMemset(y, 0, m * sizeof(float));
  Scaler sc;
  for (int it = 0; it < 20; ++it) {
    sc.run(x, s);
    ncclAllReduce(x, x, N, ncclFloat, ncclSum, comm, s);
  }
  MPI_Finalize();
  return 0;
}
""")
    with pytest.raises(Blocked) as err:
        create_workload("w", tmp_path / "p.cu", tmp_path)
    reasons = "\n".join(err.value.blockers)
    assert len(err.value.blockers) == 2 and "no size of the step is a variable of main()" in reasons
    assert "a method of Scaler that issues device work" in reasons


CONFIG = ROOT / "tests" / "init_programs" / "config_parser.cu"
DEFAULTS = """static void default_config(Config* cfg) {
  cfg->batch = 8;
  cfg->seq = 1024;
}
"""


@pytest.mark.parametrize("helper,values", [
    (None, {"batch": 4, "seq": 2048, "hidden": 4096}),  # parse_args(argc, argv, &cfg): each field's default
    ("defaults", {"batch": 8, "seq": 1024, "hidden": 4096})])  # default_config(&cfg): the constants it assigns
def test_a_config_struct_a_helper_fills_gives_the_step_its_sizes(tmp_path, helper, values):
    """A helper of the program's that only fills the Config it is given (from argv, or with constants): the fields
    the step reads are parameters with the program's values; the iteration count it also parses is none."""
    src = CONFIG.read_text()
    if helper == "defaults":
        start, end = src.index("static void parse_args"), src.index("__global__ void scale_channels")
        src = src[:start] + DEFAULTS + "\n" + src[end:]
        src = src.replace("parse_args(argc, argv, &cfg);", "default_config(&cfg);")
    (tmp_path / "p.cu").write_text(src)
    spec = load_workload(create_workload("w", tmp_path / "p.cu", tmp_path).root)
    assert spec.shapes[0].params == values
    seed = (tmp_path / "w" / "seed.cu").read_text()
    run = seed[seed.index("CUCO_EXPORT int cuco_run"):seed.index("CUCO_EXPORT int cuco_teardown")]
    assert 'cfg.batch = (int)cuco_param(ctx, "batch");' in run and "iters" not in run
    assert "parse_args(" not in seed[seed.index("CUCO_EXPORT int cuco_setup"):]


def test_a_size_rounded_up_to_a_multiple_of_the_world_keeps_its_rounding(tmp_path):
    """`numel = (numel_arg + world - 1) / world * world` pads to a multiple of the ranks: the buffers and the bound
    keep C's rounding (at the small shape and two ranks, (64 + 1) // 2 * 2 = 64 elements), never cancelled to
    numel_arg + world - 1 (65)."""
    spec = load_workload(create_workload("w", ROOT / "tests" / "init_programs" / "zero_padded.cu", tmp_path).root)
    assert list(spec.buffers["grad"].shape) == ["(numel_arg + world - 1) // world * world"]
    assert list(spec.buffers["grad_shard"].shape) == ["(numel_arg + world - 1) // world * world // world"]
    env = spec.small_shapes[0].env(2)
    assert spec.buffers["grad"].dims(env) == (64,) and eval_expr(spec.bounds.comm_bytes, env) == 32 * 4 + 32 * 2


def test_cublaslt_s_chosen_algorithm_is_set_up_once_and_kept(tmp_path):
    """cublasLtMatmulAlgoGetHeuristic before the loop: its result is cuco_setup's state beside the handle, the
    descriptors and the preference (nothing to destroy), and the step's GEMM runs with it."""
    root = create_workload("w", ROOT / "tests" / "init_programs" / "lt_heuristic_bias.cu", tmp_path).root
    seed = (root / "seed.cu").read_text()
    setup = seed[seed.index("CUCO_EXPORT int cuco_setup"):seed.index("CUCO_EXPORT int cuco_run")]
    run = seed[seed.index("CUCO_EXPORT int cuco_run"):seed.index("CUCO_EXPORT int cuco_teardown")]
    assert "  cublasLtMatmulHeuristicResult_t heur;\n" in seed and "&s->heur, &found)" in setup
    assert "int found = 0;" in setup and "heur = s->heur;" in run and "&heur.algo" in run
    assert "heur)" not in seed[seed.index("CUCO_EXPORT int cuco_teardown"):]


def test_a_pipeline_stage_s_buffers_are_read_as_every_rank_uses_them(tmp_path):
    """`if (!first) ncclRecv(act_in, ...)`, the GEMM, `if (!last) ncclSend(act_out, ...)`: on the first rank the step
    reads act_in as it was (delivered, then verified: inout), and on the last rank act_out is the result (output)."""
    spec = load_workload(create_workload("w", ROOT / "tests" / "init_programs" / "pipeline_stage.cu", tmp_path).root)
    roles = {n: b.role for n, b in spec.buffers.items()}
    assert roles == {"act_in": "inout", "act_out": "output", "weight": "parameter"}


def test_a_bias_attached_to_the_gemm_s_descriptor_is_a_workload_buffer(tmp_path):
    """`cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, ...)` before the loop: the step's
    GEMM reads bias, so it is the workload's (a parameter: only cuBLAS reads it), bound in cuco_setup where the
    descriptor takes it, never allocated or zeroed there."""
    root = create_workload("w", ROOT / "tests" / "init_programs" / "lt_heuristic_bias.cu", tmp_path).root
    spec, seed = load_workload(root), (root / "seed.cu").read_text()
    assert spec.buffers["bias"].role == "parameter" and list(spec.buffers["bias"].shape) == ["out_features"]
    setup = seed[seed.index("CUCO_EXPORT int cuco_setup"):seed.index("CUCO_EXPORT int cuco_run")]
    assert 'bias = (__nv_bfloat16*)cuco_buffer(ctx, "bias")->ptr;' in setup and "&bias, sizeof(bias)" in setup
    assert "cudaMalloc(&s->bias" not in seed and "s->bias" not in seed


def test_a_kernel_only_the_set_up_launches_is_left_out_of_the_seed(tmp_path):
    """A kernel that fills the program's buffers before the loop is the runner's part now (make_inputs): the seed
    keeps the kernels its entry points launch, not it."""
    src = (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text()
    fill = "__global__ void fill(__nv_bfloat16* x, size_t n) {\n  size_t i = blockIdx.x * (size_t)blockDim.x + " \
           "threadIdx.x;\n  if (i < n) x[i] = __float2bfloat16(1.0f);\n}\n\n"
    for old, new in (("__global__ void scale", fill + "__global__ void scale"),
                     ("  for (int it = 0;", "  fill<<<1024, 256, 0, stream>>>(send, tokens * hidden);\n"
                                             "  for (int it = 0;")):
        assert old in src
        src = src.replace(old, new)
    (tmp_path / "p.cu").write_text(src)
    seed = (create_workload("w", tmp_path / "p.cu", tmp_path).root / "seed.cu").read_text()
    assert "__global__ void scale" in seed and "fill" not in seed


def test_an_output_only_the_root_receives_is_said_to_be_nan_elsewhere(tmp_path):
    """ncclReduce to rank 0 writes its output there only: workload.toml and reference.py's stub both say the other
    ranks keep the judge's poison, so a reference that returns the sum everywhere is not written by mistake."""
    root = create_workload("w", ROOT / "tests" / "init_programs" / "bcast_reduce.cu", tmp_path).root
    toml, reference = (root / "workload.toml").read_text(), (root / "reference.py").read_text()
    assert "writes it on rank 0 only: on the other ranks it keeps the judge's poison" in toml
    assert '"totals": shape' in reference and "on rank 0 only, NaN on the others" in reference


def test_a_call_in_a_loop_of_a_known_trip_count_counts_that_many_times(tmp_path):
    """A ring all-reduce by hand: two loops of world - 1 steps, each receiving a chunk. The bound counts what every
    step receives, twice world - 1 chunks, where a loop it cannot count is left marked."""
    spec = load_workload(create_workload("w", ROOT / "tests" / "init_programs" / "ring_allreduce.cu", tmp_path).root)
    env = spec.shapes[0].env(4)
    chunk_bytes = spec.shapes[0].params["count"] // 4 * 4
    assert eval_expr(spec.bounds.comm_bytes, env) == 2 * 3 * chunk_bytes


def _ep_variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The expert-parallel program with each (old, new) edit made once."""
    src = (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text()
    for old, new in edits:
        assert old in src
        src = src.replace(old, new, 1)
    (tmp_path / "p.cu").write_text(src)
    return tmp_path / "p.cu"


@pytest.mark.parametrize("edits", [
    (("int main(", 'extern "C" int main('),),
    (("int main(", 'extern "C" {\nint main('), ("  return 0;\n}", "  return 0;\n}\n}")),
], ids=["extern_c", "extern_c_block"])
def test_a_main_with_c_linkage_is_read_as_main(tmp_path, edits):
    """`extern "C" int main` (or main in an `extern "C" { }` block) is the program's main(): its step becomes
    cuco_run, and the seed has no main() of its own."""
    seed = (create_workload("w", _ep_variant(tmp_path, *edits), tmp_path).root / "seed.cu").read_text()
    assert "CUCO_EXPORT int cuco_run" in seed and "int main(" not in seed and "MPI_Init" not in seed
    assert 'extern "C"' not in seed and "ncclSend(send + peer * chunk" in seed


@pytest.mark.parametrize("where", ["__global__ void scale", "  ncclComm_t comm;"])
def test_line_directives_do_not_move_what_cuco_reads(tmp_path, where):
    """A `#line` (a generated file's, at file scope or in main()) changes the lines the preprocessor reports, not
    the program: it converts as it would without one."""
    path = _ep_variant(tmp_path, (where, f'#line 500 "generated.cu"\n{where}'))
    created = create_workload("w", path, tmp_path)
    seed = (created.root / "seed.cu").read_text()
    assert "CUCO_EXPORT int cuco_run" in seed and "#line" not in seed
    assert set(load_workload(created.root).buffers) == {"send", "recv"}


def test_buffers_declared_at_file_scope_are_refused_at_their_first_use(tmp_path):
    """`static __nv_bfloat16 *send, *recv;` above main(): the runner's buffers cannot reach a global the seed keeps
    as written, so each is named once, where the step first uses it, with the line it is declared at."""
    path = _ep_variant(tmp_path, ("  __nv_bfloat16 *send, *recv;\n", ""),
                       ("int main(", "static __nv_bfloat16 *send, *recv;\n\nint main("))
    with pytest.raises(Blocked) as info:
        create_workload("w", path, tmp_path)
    message = str(info.value)
    assert "2 blocker(s)" in message and not (tmp_path / "w").exists()
    lines = path.read_text().splitlines()
    declared = next(i for i, ln in enumerate(lines, 1) if ln.startswith("static __nv_bfloat16"))
    for name, call in (("send", "ncclSend"), ("recv", "ncclRecv")):
        used = next(i for i, ln in enumerate(lines, 1) if f"CHECK_NCCL({call}(" in ln)
        assert f"p.cu:{used}: " in message
        assert f"uses {name}, a variable at file scope (line {declared})" in message


def test_a_kernel_launched_many_times_is_read_once(tmp_path, monkeypatch):
    """A step of 300 launches of one kernel: what the kernel does through its pointers is worked out once, not once
    per launch (a step of thousands of launches stays seconds)."""
    from cuco.scaffold import kernel_access

    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    path = _ep_variant(tmp_path, (launch, launch * 300))
    reads = []
    real = kernel_access._pointer_use
    monkeypatch.setattr(kernel_access, "_ACCESS", {})
    monkeypatch.setattr(kernel_access, "_pointer_use", lambda fn, name: reads.append(name) or real(fn, name))
    seed = (create_workload("w", path, tmp_path).root / "seed.cu").read_text()
    assert seed.count("scale<<<") == 300 and reads == ["y"]


def test_a_function_object_that_issues_the_exchange_is_named(tmp_path):
    """`Exchange exchange{comm, stream, chunk, nranks}; ... exchange(send, recv);` where operator() holds the
    sends and receives: refused naming the call and the class, not read as a step without NCCL."""
    functor = ("struct Exchange {\n  ncclComm_t comm;\n  cudaStream_t stream;\n  size_t chunk;\n  int nranks;\n"
               "  void operator()(__nv_bfloat16* send, __nv_bfloat16* recv) const {\n"
               "    for (int peer = 0; peer < nranks; ++peer)\n"
               "      CHECK_NCCL(ncclSend(send + peer * chunk, chunk, ncclBfloat16, peer, comm, stream));\n  }\n};\n\n")
    loop = "  for (int it = 0; it < 20; ++it) {\n"
    made = "  Exchange exchange{comm, stream, chunk, nranks};\n"
    path = _ep_variant(tmp_path, ("int main(", functor + "int main("),
                       (loop, made + loop + "    exchange(send, recv);\n"))
    with pytest.raises(CucoError, match=r"p\.cu:\d+: .*`exchange\(send, recv\);`: calls exchange\(\), a function "
                                        r"object \(Exchange::operator\(\)\) that issues device work"):
        create_workload("w", path, tmp_path)


@pytest.mark.parametrize("scope,call,why", [
    ("namespace ops {", "ops::scale", "in namespace ops: cuco writes out the program's helpers that main() calls by "
                                      "their own name (`using namespace ops;`, then `scale(...)`)"),
    ("struct Ops {\n static", "Ops::scale", "is a static method of class Ops"),
])
def test_a_helper_called_by_its_qualified_name_is_refused_not_dropped(tmp_path, scope, call, why):
    """A launcher in a namespace (or a class's static method) called as `ops::scale(...)` issues the step's kernel:
    refused with the call's line and how to write it, never left out of cuco_run as the runner's part."""
    helper = (f"{scope} void scale(__nv_bfloat16* y, float s, size_t n, cudaStream_t st) {{\n"
              "  scale_k<<<256, 256, 0, st>>>(y, s, n);\n}\n}" + (";" if "struct" in scope else "") + "\n\n")
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    called = f"    {call}(recv, 0.5f, tokens * hidden, stream);\n"
    path = _ep_variant(tmp_path, ("__global__ void scale(", "__global__ void scale_k("),
                       ("int main(", helper + "int main("), (launch, called))
    with pytest.raises(CucoError) as info:
        create_workload("w", path, tmp_path)
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if f"{call}(recv" in ln)
    assert f"p.cu:{line}: `{call}(recv, 0.5f, tokens * hidden, stream);`: calls {call}()" in str(info.value)
    assert why in str(info.value)


def test_an_accumulating_gemm_reads_its_output_and_a_strided_batch_reads_its_operands(tmp_path):
    """`cublasSgemm(..., &one, dw, ...)` (dW += X^T dY) reads dw before it writes it: inout, never scratch. A strided
    batched GEMM reads its A and B and writes C only, and its flops count the batch."""
    head = ("#include <cublas_v2.h>\n#include <mpi.h>\n#include <nccl.h>\nint main(int argc, char** argv) {\n"
            "  MPI_Init(&argc, &argv);\n  int rank, world;\n  MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n"
            "  MPI_Comm_size(MPI_COMM_WORLD, &world);\n"
            "  const int m = 512, k = 256, n = 128, heads = 4;\n"
            "  ncclUniqueId id;\n  if (rank == 0) ncclGetUniqueId(&id);\n"
            "  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);\n  ncclComm_t comm;\n"
            "  ncclCommInitRank(&comm, world, id, rank);\n  cudaStream_t s;\n  cudaStreamCreate(&s);\n"
            "  cublasHandle_t h;\n  cublasCreate(&h);\n  cublasSetStream(h, s);\n"
            "  const float one = 1.f, zero = 0.f;\n")
    tail = "  }\n  cudaStreamSynchronize(s);\n  MPI_Finalize();\n}\n"
    (tmp_path / "acc.cu").write_text(
        head + "  float *x, *dy, *dw, *sum;\n  cudaMalloc(&x, sizeof(float) * m * k);\n"
        "  cudaMalloc(&dy, sizeof(float) * m * n);\n  cudaMalloc(&dw, sizeof(float) * k * n);\n"
        "  cudaMalloc(&sum, sizeof(float) * k * n);\n  for (int it = 0; it < 10; ++it) {\n"
        "    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, &one, dy, n, x, k, &one, dw, n);\n"
        "    ncclAllReduce(dw, sum, (size_t)k * n, ncclFloat, ncclSum, comm, s);\n" + tail)
    spec = load_workload(create_workload("acc", tmp_path / "acc.cu", tmp_path).root)
    assert spec.buffers["dw"].role == "inout" and spec.buffers["sum"].role == "output"
    (tmp_path / "batched.cu").write_text(
        head + "  float *x, *x_full, *w, *out;\n  cudaMalloc(&x, sizeof(float) * heads * k * n / world);\n"
        "  cudaMalloc(&x_full, sizeof(float) * heads * k * n);\n  cudaMalloc(&w, sizeof(float) * heads * m * k);\n"
        "  cudaMalloc(&out, sizeof(float) * heads * m * n);\n  for (int it = 0; it < 10; ++it) {\n"
        "    ncclAllGather(x, x_full, (size_t)heads * k * n / world, ncclFloat, comm, s);\n"
        "    cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, w, m, (long long)m * k, x_full, k,\n"
        "                              (long long)k * n, &zero, out, m, (long long)m * n, heads);\n" + tail)
    spec = load_workload(create_workload("batched", tmp_path / "batched.cu", tmp_path).root)
    roles = {name: b.role for name, b in spec.buffers.items()}
    assert roles["out"] == "output" and roles["w"] != "output" and roles["x_full"] != "output", roles
    env = spec.shapes[0].env(2)
    assert eval_expr(spec.bounds.flops, env) == 2 * 512 * 256 * 128 * 4


def test_an_epochs_by_steps_nest_makes_one_step(tmp_path):
    """`for (epoch ...) { for (step ...) { scale; all-reduce } if (rank == 0) printf(...); }`: cuco_run is one step,
    the inner body, not an epoch of steps; the bound counts one all-reduce."""
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    path = _ep_variant(tmp_path, ("  for (int it = 0; it < 20; ++it) {\n",
                                  "  const int steps = 100;\n  for (int epoch = 0; epoch < 3; ++epoch) {\n"
                                  "  for (int it = 0; it < steps; ++it) {\n"),
                       (launch, launch + "  }\n    if (rank == 0) printf(\"epoch %d\\n\", epoch);\n"))
    root = create_workload("w", path, tmp_path).root
    seed = (root / "seed.cu").read_text()
    run = seed[seed.index("CUCO_EXPORT int cuco_run"):seed.index("CUCO_EXPORT int cuco_teardown")]
    assert "for (int it" not in run and "epoch" not in run and run.count("scale<<<") == 1
    spec = load_workload(root)
    assert "steps" not in spec.params and "steps" not in spec.bounds.comm_bytes


def test_buffers_handed_to_a_kernel_inside_a_struct_are_refused(tmp_path):
    """`Args args{send, recv, n}; copy2<<<...>>>(args);`: what the kernel does to the buffers is not read from a
    struct's fields, so the step is refused naming them, never converted with the input left as private state."""
    kernel = ("struct Args {\n  const __nv_bfloat16* in;\n  __nv_bfloat16* out;\n  size_t n;\n};\n"
              "__global__ void copy2(Args p) {\n  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;\n"
              "  if (i < p.n) p.out[i] = p.in[i];\n}\n\nint main(")
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    path = _ep_variant(tmp_path, ("int main(", kernel),
                       (launch, "    Args args{recv, send, tokens * hidden};\n"
                                "    copy2<<<256, 256, 0, stream>>>(args);\n"))
    with pytest.raises(CucoError, match=r"p\.cu:\d+: `copy2<<<256, 256, 0, stream>>>\(args\);`: gives copy2 the "
                                        r"buffers recv, send inside `args`, which is not a pointer"):
        create_workload("w", path, tmp_path)


@pytest.mark.parametrize("early", [False, True], ids=["written_out", "returns_early"])
def test_buffers_a_helper_allocates_and_returns(tmp_path, early):
    """`__nv_bfloat16* send = alloc_bf16(n);` with `T* p = nullptr; cudaMalloc(&p, ...); return p;`: written out in
    place, so send and recv are the workload's buffers. A helper that may return before its end stays a call: the
    step's uses of what it returns are refused with the helper's reason (never a workload without buffers)."""
    guard = "  if (n == 0) return nullptr;\n" if early else ""
    helper = ("static __nv_bfloat16* alloc_bf16(size_t n) {\n  __nv_bfloat16* p = nullptr;\n" + guard +
              "  CHECK_CUDA(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));\n  return p;\n}\n\nint main(")
    path = _ep_variant(tmp_path, ("int main(", helper), ("  __nv_bfloat16 *send, *recv;\n", ""),
                       ("  CHECK_CUDA(cudaMalloc(&send, tokens * hidden * sizeof(__nv_bfloat16)));\n",
                        "  __nv_bfloat16* send = alloc_bf16(tokens * hidden);\n"),
                       ("  CHECK_CUDA(cudaMalloc(&recv, tokens * hidden * sizeof(__nv_bfloat16)));\n",
                        "  __nv_bfloat16* recv = alloc_bf16(tokens * hidden);\n"))
    if not early:
        spec = load_workload(create_workload("w", path, tmp_path).root)
        assert {n: b.role for n, b in spec.buffers.items()} == {"send": "input", "recv": "output"}
        assert list(spec.buffers["send"].shape) == ["tokens", "hidden"]
        return
    with pytest.raises(CucoError, match=r"uses (send|recv) \(line \d+\), a pointer alloc_bf16\(\) returns, which cuco "
                                        r"did not write out in place \(it returns before its end \(p\.cu:\d+\)\)"):
        create_workload("w", path, tmp_path)


def test_a_header_of_the_program_that_is_not_there_is_refused(tmp_path):
    """`#include "my_utils.cuh"` found neither beside the program nor in an include folder: refused with its line
    (the seed could not build), while a library header written with quotes ("nccl.h") is not asked for."""
    path = _ep_variant(tmp_path, ("#include <nccl.h>\n", '#include "nccl.h"\n#include "my_utils.cuh"\n'))
    line = path.read_text().splitlines().index('#include "my_utils.cuh"') + 1
    with pytest.raises(CucoError, match=rf'p\.cu:{line}: includes "my_utils\.cuh", which is neither beside it nor '
                                        r"in an include folder: give it too \(--from\), or its folder \(-I\)"):
        create_workload("w", path, tmp_path)
    (tmp_path / "my_utils.cuh").write_text("#pragma once\n")
    assert (create_workload("w", path, tmp_path).root / "seed.cu").is_file()


@pytest.mark.parametrize("using", [False, True], ids=["qualified", "using_namespace"])
def test_a_check_helper_in_a_namespace_is_left_out_with_its_checks(tmp_path, using):
    """`namespace util { inline void check(cudaError_t e, ...) { ... exit(1); } }` behind CHECK_CUDA: cuco's own check
    replaces the macro, so the namespace (and a `using namespace util;` of it) leaves the seed, exit() with it."""
    helper = ('namespace util {\ninline void check(cudaError_t e, const char* file, int line) {\n'
              '  if (e != cudaSuccess) { printf("%s:%d %s\\n", file, line, cudaGetErrorString(e)); exit(1); }\n}\n'
              '}  // namespace util\n' + ("using namespace util;\n" if using else ""))
    old = next(ln for ln in (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text().splitlines()
               if ln.startswith("#define CHECK_CUDA"))
    call = "check" if using else "util::check"
    path = _ep_variant(tmp_path, (old, helper + f"#define CHECK_CUDA(x) {call}((x), __FILE__, __LINE__)"))
    seed = (create_workload("w", path, tmp_path).root / "seed.cu").read_text()
    assert "namespace util" not in seed and "exit(" not in seed and "CUCO_CUDA(ctx, " in seed


def test_a_check_macro_named_in_lower_case_is_a_check_macro(tmp_path):
    """`#define gpuErrchk(ans) { gpuAssert((ans), __FILE__, __LINE__); }` around every call (the form CUDA's forums
    spread): read as the program's check macro, made cuco's once, its assert function left out."""
    assert_fn = ('inline void gpuAssert(int code, const char* file, int line) {\n'
                 '  if (code != 0) { printf("error %d %s:%d\\n", code, file, line); exit(code); }\n}\n'
                 '#define gpuErrchk(ans) { gpuAssert((int)(ans), __FILE__, __LINE__); }\n')
    src = (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text()
    defines = [ln for ln in src.splitlines() if ln.startswith(("#define CHECK_CUDA", "#define CHECK_NCCL"))]
    path = _ep_variant(tmp_path, (defines[0] + "\n" + defines[1] + "\n", assert_fn))
    path.write_text(path.read_text().replace("CHECK_CUDA(", "gpuErrchk(").replace("CHECK_NCCL(", "gpuErrchk("))
    seed = (create_workload("w", path, tmp_path).root / "seed.cu").read_text()
    assert "CUCO_NCCL(ctx, ncclSend(" in seed and "CUCO_NCCL(ctx, CUCO_NCCL" not in seed
    assert "gpuAssert" not in seed and "gpuErrchk" not in seed


def test_a_step_sized_by_a_helper_s_struct_says_where_its_sizes_come_from(tmp_path):
    """`const Dims d = get_dims(); const size_t tokens = d.rows;`: the refusal names get_dims as where the sizes
    come from, not only that main() has none."""
    dims = "struct Dims {\n  size_t rows, cols;\n};\nstatic Dims get_dims() { return Dims{4096, 7168}; }\n\nint main("
    path = _ep_variant(tmp_path, ("int main(", dims),
                       ("  const size_t tokens = argc > 1 ? atol(argv[1]) : 4096, hidden = 7168;\n",
                        "  const Dims d = get_dims();\n  const size_t tokens = d.rows, hidden = d.cols;\n"))
    with pytest.raises(CucoError, match=r"no size of the step is a variable of main\(\) \(its sizes come from "
                                        r"get_dims, which cuco cannot follow"):
        create_workload("w", path, tmp_path)


def test_a_size_getopt_sets_is_a_parameter_with_its_default(tmp_path):
    """`size_t tokens = 4096; while ((c = getopt(...)) != -1) if (c == 't') tokens = atol(optarg);`: a size the
    program reads from its options, a parameter whose value is the default."""
    path = _ep_variant(tmp_path, ("#include <mpi.h>\n", "#include <mpi.h>\n#include <unistd.h>\n"),
                       ("  const size_t tokens = argc > 1 ? atol(argv[1]) : 4096, hidden = 7168;\n",
                        "  size_t tokens = 4096;\n  const size_t hidden = 7168;\n  int c;\n"
                        "  while ((c = getopt(argc, argv, \"t:\")) != -1)\n    if (c == 't') tokens = atol(optarg);\n"))
    spec = load_workload(create_workload("w", path, tmp_path).root)
    assert spec.shapes[0].params["tokens"] == 4096 and "tokens" in spec.params


def test_an_output_a_collective_writes_from_an_offset_is_said_to_keep_the_poison_elsewhere(tmp_path):
    """`ncclAllGather(send, recv + offset, ...)`, the only write of recv: workload.toml says the rest of recv keeps
    the judge's poison (reference returns NaN there), rather than taking the whole buffer as written."""
    src = (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text()
    start = src.index("    CHECK_NCCL(ncclGroupStart());")
    end = src.index("    scale<<<")
    path = tmp_path / "p.cu"
    gather = "    CHECK_NCCL(ncclAllGather(send, recv + chunk, chunk, ncclBfloat16, comm, stream));\n"
    path.write_text(src[:start] + gather + src[src.index("  }\n", end):])
    toml = (create_workload("w", path, tmp_path).root / "workload.toml").read_text()
    assert "ncclAllGather (original.cu:" in toml and "writes `recv + chunk` only: the rest keeps the judge's " \
        "poison, so reference returns NaN there" in toml


def test_a_step_s_own_loop_over_layers_stays_in_the_step(tmp_path):
    """`for (it ...) { for (l < layers) { scale(recv + l * block); } }` under an epoch-free loop: the inner loop reads
    its counter, so it is the step's own loop (one iteration is every layer), not a nest of identical steps; an
    epoch's invariant declaration (`const size_t half = ...;`) does not keep an epochs nest from its one step."""
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    layers = ("    for (int l = 0; l < 4; ++l)\n"
              "      scale<<<256, 256, 0, stream>>>(recv + l * (chunk / 4), 0.5f, chunk / 4);\n")
    root = create_workload("w", _ep_variant(tmp_path, (launch, layers)), tmp_path).root
    run = (root / "seed.cu").read_text().split("CUCO_EXPORT int cuco_run", 1)[1]
    assert "for (int l = 0; l < 4; ++l)" in run and "ncclSend" in run
    nest = tmp_path / "nest"
    nest.mkdir()
    path = _ep_variant(nest, ("  for (int it = 0; it < 20; ++it) {\n",
                              "  for (int epoch = 0; epoch < 3; ++epoch) {\n    const size_t quarter = chunk / 4;\n"
                              "  for (int it = 0; it < 100; ++it) {\n"),
                       (launch, launch.replace("tokens * hidden", "quarter") + "  }\n"))
    run = (create_workload("w", path, nest).root / "seed.cu").read_text().split("CUCO_EXPORT int cuco_run", 1)[1]
    assert "for (int it" not in run and "epoch" not in run
    assert "scale<<<256, 256, 0, stream>>>(recv, 0.5f, quarter)" in run


@pytest.mark.parametrize("call,refused", [
    ("::rescale(recv, tokens * hidden, stream);", None),
    ("(rescale)(recv, tokens * hidden, stream);", "gives recv to (rescale)(), which cuco does not see into"),
    ("auto fn = rescale;\n    fn(recv, tokens * hidden, stream);", "gives recv to fn(), which cuco does not see into"),
    ("MPI_Allreduce(MPI_IN_PLACE, recv, (int)(tokens * hidden), MPI_SHORT, MPI_SUM, MPI_COMM_WORLD);",
     "gives recv to MPI_Allreduce(), which cuco does not see into"),
])
def test_work_on_a_buffer_through_a_call_cuco_cannot_see_into_is_never_left_out(tmp_path, call, refused):
    """A launcher called as `::rescale(...)` is written out like `rescale(...)`; the same work through parentheses,
    a function pointer, or a CUDA-aware MPI call on a device buffer is refused with its line, never dropped from
    cuco_run as the runner's part."""
    helper = ("static void rescale(__nv_bfloat16* y, size_t n, cudaStream_t s) {\n"
              "  scale<<<256, 256, 0, s>>>(y, 0.5f, n);\n}\n\nint main(")
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    path = _ep_variant(tmp_path, ("int main(", helper), (launch, f"    {call}\n"))
    if refused is None:
        run = (create_workload("w", path, tmp_path).root / "seed.cu").read_text().split("cuco_run", 1)[1]
        assert "scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);" in run, run
        return
    with pytest.raises(CucoError, match=rf"p\.cu:\d+: .*{re.escape(refused)}"):
        create_workload("w", path, tmp_path)


@pytest.mark.parametrize("after", ["  comm = sub;\n", "  std::swap(comm, sub);\n"], ids=["assigned", "swapped"])
def test_a_communicator_replaced_by_a_split_one_is_refused(tmp_path, after):
    """`ncclCommSplit(comm, ..., &sub, ...); comm = sub;` (or a swap): the step's collectives run over a group of the
    ranks, which the runner's communicator is not; refused where the step uses it, never converted to ctx->comm."""
    split = "  ncclComm_t sub;\n  CHECK_NCCL(ncclCommSplit(comm, rank % 2, rank, &sub, nullptr));\n" + after
    path = _ep_variant(tmp_path, ("#include <cstdlib>\n", "#include <cstdlib>\n#include <utility>\n"),
                       ("  cudaStream_t stream;\n", split + "  cudaStream_t stream;\n"))
    with pytest.raises(CucoError, match=r"uses comm \(line \d+\), a communicator (assigned again|swapped) at line "
                                        r"\d+: cuco runs the step on the runner's communicator of every rank"):
        create_workload("w", path, tmp_path)


def test_a_namespace_declared_in_a_header_and_defined_in_a_file_keeps_its_using_directive(tmp_path):
    """ops's launcher declared in ops.cuh, defined with its kernel in ops.cu, called after `using namespace ops;` in
    the host file: the kept namespace keeps the directive (the header's declaration of it left out alone)."""
    (tmp_path / "ops.cuh").write_text("#pragma once\n#include <cuda_bf16.h>\n#include <cuda_runtime.h>\n"
                                       "namespace ops {\nvoid rescale(__nv_bfloat16* y, size_t n, cudaStream_t s);\n"
                                       "}\n")
    (tmp_path / "ops.cu").write_text('#include "ops.cuh"\nnamespace ops {\n'
                                     "__global__ void half_k(__nv_bfloat16* y, size_t n) {\n"
                                     "  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;\n"
                                     "  if (i < n) y[i] = __float2bfloat16(__bfloat162float(y[i]) * 0.5f);\n}\n"
                                     "void rescale(__nv_bfloat16* y, size_t n, cudaStream_t s) {\n"
                                     "  half_k<<<256, 256, 0, s>>>(y, n);\n}\n}  // namespace ops\n")
    launch = "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n"
    using = '#include <nccl.h>\n#include "ops.cuh"\nusing namespace ops;\n'
    call = "    rescale(recv, tokens * hidden, stream);\n"
    host = _ep_variant(tmp_path, ("#include <nccl.h>\n", using), (launch, call))
    root = create_workload("w", [tmp_path / "ops.cuh", tmp_path / "ops.cu", host], tmp_path).root
    seed = (root / "seed.cu").read_text()
    assert "using namespace ops;" in seed and "half_k<<<256, 256, 0, stream>>>(recv" in seed


def test_nccl_called_through_the_global_scope_is_nccl(tmp_path):
    """`::ncclSend(...)`, `::ncclRecv(...)` (NCCL's own, named from the global scope): the step's exchange, checked
    by cuco's macro, never a traceback or "no NCCL call"."""
    path = _ep_variant(tmp_path)
    path.write_text(path.read_text().replace("CHECK_NCCL(ncclSend(", "CHECK_NCCL(::ncclSend(")
                    .replace("CHECK_NCCL(ncclRecv(", "CHECK_NCCL(::ncclRecv("))
    seed = (create_workload("w", path, tmp_path).root / "seed.cu").read_text()
    assert "CUCO_NCCL(ctx, ::ncclSend(" in seed and "CUCO_NCCL(ctx, ::ncclRecv(" in seed
