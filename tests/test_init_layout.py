"""`cuco init` on programs as people write them: a host .cpp with its kernels in a .cu and a header between them,
macros the grammar cannot read (a braced launch configuration, NVTX ranges without a semicolon, an `#if` that splits
an if/else), helpers that issue the device work or create the communicator. The seed is right, every refusal names
the file and line the user wrote, and what cannot be read is said in one line, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from cuco.errors import CucoError
from cuco.fastpath.analyze import analyze
from cuco.fastpath.rewrite import rewrite
from cuco.fastpath.syntax import blank_macros, function_name, parser, text, walk
from cuco.scaffold import create_workload
from cuco.scaffold.standalone import read_program, sources
from cuco.scaffold.standalone.blockers import Blocked
from cuco.scaffold.standalone.sources import Unit, expand_macros, read_sources
from cuco.workload.check import check_workload
from cuco.workload.expr import eval_expr
from cuco.workload.spec import load_workload

EXAMPLE = ROOT / "examples" / "tp_mlp"
FILES = [EXAMPLE / "host.cpp", EXAMPLE / "kernels.cu", EXAMPLE / "kernels.cuh"]
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
needs_cpp = pytest.mark.skipif(sources.preprocessor() is None, reason="no C preprocessor (cpp) here")


def _line(path: Path, words: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if words in ln)


def _run_calls(seed: str) -> list[str]:
    root = parser().parse(blank_macros(seed.encode())).root_node
    assert not [n for n in walk(root) if n.type == "ERROR" or n.is_missing], "the seed does not parse"
    run = next(n for n in walk(root) if n.type == "function_definition" and function_name(n) == "cuco_run")
    names = [text(n.child_by_field_name("function")) for n in walk(run) if n.type == "call_expression"]
    return [c for c in names if c not in ("cuco_param", "cuco_buffer") and not c.startswith("CUCO_")]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return create_workload("tp_mlp", FILES, tmp_path_factory.mktemp("layout")).root


# ---- the common layout: host.cpp + kernels.cu + kernels.cuh --------------------------------------------------

@needs_cpp
def test_three_files_become_one_seed_with_the_originals_kept(mlp):
    assert sorted(p.name for p in (mlp / "original").iterdir()) == ["host.cpp", "kernels.cu", "kernels.cuh"]
    assert not (mlp / "original.cu").exists()
    seed = (mlp / "seed.cu").read_text()
    # the step as host.cpp's loop issues it, the helpers written out: two GEMMs, the launches of the kernels that
    # bias_gelu() and bias_residual() wrap, the all-reduce; the NVTX ranges (nothing without USE_NVTX) gone
    assert _run_calls(seed) == ["cublasGemmEx", "bias_gelu_kernel", "cudaGetLastError", "cublasGemmEx",
                                "ncclAllReduce", "bias_residual_kernel", "cudaGetLastError"]
    for gone in ("MPI_", "init_comm", "ncclCommInitRank", "RANGE_PUSH", "nvtx", "WARMUP; ++i", "<<<BLOCKS_FOR"):
        assert gone not in seed, gone
    assert "dim3{THREADS, 1, 1}" in seed  # the braced launch configuration, THREADS kept as the program's constant
    assert "#define THREADS 256" in seed and "#include <cuda_bf16.h>" in seed
    assert seed.index("typedef __nv_bfloat16 bf16;") < seed.index("__global__ void bias_gelu_kernel")
    assert "cublasCreate(&s->blas)" in seed  # the handle is cuco_setup's


@needs_cpp
def test_the_workload_is_what_the_three_files_say(mlp):
    spec = load_workload(mlp)
    assert list(spec.params) == ["tokens", "hidden", "ffn"]
    assert spec.shapes[0].params == {"tokens": 2048, "hidden": 4096, "ffn": 16384}
    roles = {n: b.role for n, b in spec.buffers.items()}
    assert roles == {"x": "input", "w1": "parameter", "b1": "input", "h": "scratch", "w2": "parameter",
                     "y": "scratch", "b2": "input", "out": "output"}
    assert [b.dtype for b in spec.buffers.values()] == ["bf16"] * 8
    env = {"tokens": 24, "hidden": 40, "ffn": 96, "world": 2}
    assert eval_expr(spec.bounds.flops, env) == 2 * 2 * 24 * 40 * 48
    toml = (mlp / "workload.toml").read_text()
    # y is all-reduced in place, then read by the residual's kernel: an intermediate, unless the program uses the
    # all-reduce's result after the step
    assert 'role = "scratch"  # TODO: ncclAllReduce (original/host.cpp:' in toml
    # notes cite the file and line each fact comes from, in the copies kept beside the seed
    assert f"cudaMalloc (original/host.cpp:{_line(FILES[0], 'cudaMalloc(&d_w1')})" in toml
    assert f"bias_residual_kernel (original/kernels.cu:{_line(FILES[1], 'bias_residual_kernel<<<')})" in toml


@needs_cpp
def test_a_define_given_keeps_what_it_guards(tmp_path):
    seed = (create_workload("nvtx", FILES, tmp_path, defines=["USE_NVTX"]).root / "seed.cu").read_text()
    assert "#include <nvtx3/nvToolsExt.h>" in seed
    assert "nvtxRangePushA" not in seed  # host work: not the step's
    with pytest.raises(CucoError, match=r"--define: '1X': a define is NAME or NAME=VALUE"):
        create_workload("bad", FILES, tmp_path, defines=["1X"])


@needs_cpp
def test_cli_reads_the_files_and_defines(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cuco", "init", "mlp", *[a for f in FILES for a in ("--from", str(f))],
                           "-D", "USE_NVTX", "--dir", str(tmp_path)], capture_output=True, text=True, env=ENV,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mlp" / "original" / "kernels.cu").is_file()
    # how the program was read, said before the rest
    assert proc.stdout.splitlines()[:3] == [
        "read kernels.cuh, kernels.cu, host.cpp as one program", "read with -D USE_NVTX: the seed is that build of it",
        "written out where main() calls them: init_comm(), gemm_bf16(), bias_gelu(), bias_residual()"], proc.stdout


@pytest.mark.nvcc
@needs_cpp
def test_the_seed_builds_through_the_checks(mlp):
    from cuco.runner.build.cuda_checks import check_and_build

    built, problems = check_and_build(mlp / "seed.cu")
    assert problems == [] and built.ok, built.log[-3000:]


def test_the_settled_example_checks_on_the_cpu(tmp_path):
    """The example's settled workload.toml and reference.py (the tutorial's part 2) pass `cuco check` beside the
    seed init writes."""
    if sources.preprocessor() is None:
        pytest.skip("no C preprocessor (cpp) here")
    root = create_workload("tp_mlp", FILES, tmp_path).root
    for name in ("workload.toml", "reference.py"):
        shutil.copyfile(EXAMPLE / name, root / name)
    proc = subprocess.run([sys.executable, "-m", "cuco", "check", str(root)], capture_output=True, text=True,
                          env=ENV, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- refusals name the file and line the user wrote -----------------------------------------------------------

def _layout(tmp_path: Path, launcher_body: str, step: str | None = None) -> list[Path]:
    """The example's three files, with bias_gelu()'s body and the timed loop's body replaced."""
    out = []
    for f in FILES:
        src = f.read_text()
        if f.name == "kernels.cu":
            start = src.index("{\n", src.index("void bias_gelu(bf16* h")) + 2
            end = src.index("}\n", start)
            src = src[:start] + launcher_body + src[end:]
        if f.name == "host.cpp" and step is not None:
            start = src.index('    RANGE_PUSH("mlp")')
            end = src.index("    RANGE_POP()")
            src = src[:start] + step + src[end:]
        (tmp_path / f.name).write_text(src)
        out.append(tmp_path / f.name)
    return out


@needs_cpp
def test_a_blocker_inside_a_helper_names_the_helpers_file_and_line(tmp_path):
    files = _layout(tmp_path, "  bf16* tmp;\n  cudaMalloc(&tmp, rows * sizeof(bf16));\n"
                              "  bias_gelu_kernel<<<rows, cols, 0, stream>>>(h, bias, rows, cols);\n")
    with pytest.raises(CucoError) as err:
        create_workload("w", files, tmp_path)
    where = f"{files[1]}:{_line(files[1], 'cudaMalloc(&tmp')}"
    assert str(err.value).startswith(f"{where}: `cudaMalloc(&tmp, rows * sizeof(bf16));`: allocates or frees memory"), \
        str(err.value)
    assert not (tmp_path / "w").exists()


@needs_cpp
def test_every_blocker_of_the_step_in_one_run_across_the_files(tmp_path):
    """A helper that returns early (host.cpp) and one that allocates in the step (kernels.cu): both named at once."""
    step = ("    if (tokens > 0) { gemm_bf16(blas, d_x, d_w1, d_h, tokens, shard, hidden); }\n"
            "    bias_gelu(d_h, d_b1, tokens, shard, stream);\n"
            "    NCCL_CHECK(ncclAllReduce(d_y, d_y, (size_t)tokens * hidden, ncclBfloat16, ncclSum, comm, stream));\n"
            "    skip_if_empty(d_h, tokens, stream);\n")
    files = _layout(tmp_path, "  bf16* tmp;\n  cudaMalloc(&tmp, rows * sizeof(bf16));\n", step)
    host = files[0]
    host.write_text(host.read_text().replace(
        "int main(int argc", "static void skip_if_empty(bf16* h, int rows, cudaStream_t stream) {\n"
        "  if (rows == 0) return;\n  cudaMemsetAsync(h, 0, rows, stream);\n}\n\nint main(int argc"))
    with pytest.raises(Blocked) as err:
        create_workload("w", files, tmp_path)
    lines = err.value.blockers
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{files[1]}:{_line(files[1], 'cudaMalloc(&tmp')}: ")
    assert lines[1].startswith(f"{host}:{_line(host, 'skip_if_empty(d_h')}: `skip_if_empty(d_h, tokens, stream);`: ")
    assert f"it returns before its end (host.cpp:{_line(host, 'if (rows == 0) return;')})" in lines[1]


@needs_cpp
def test_a_launcher_whose_file_is_not_given_is_refused_not_dropped(tmp_path):
    """host.cpp and kernels.cuh without kernels.cu: bias_gelu() is declared, defined nowhere given; a seed without
    its launch would do less than the program, so each call is refused, naming the declaration."""
    with pytest.raises(CucoError) as err:
        create_workload("w", [FILES[0], FILES[2]], tmp_path)
    assert f"calls bias_gelu(), which the program declares (kernels.cuh:{_line(FILES[2], 'void bias_gelu(')}) but " \
           "none of the files given defines" in str(err.value), str(err.value)
    assert not (tmp_path / "w").exists()


def test_a_communicator_made_in_a_file_not_given_is_named(tmp_path):
    src = STRUCT.read_text()
    made = src[src.index("  ncclUniqueId id;\n"):src.index("  cudaStream_t stream;")]
    _variant(tmp_path, (made, "  ncclComm_t comm;\n  init_comm(&comm, rank, world);\n"))
    with pytest.raises(Blocked) as err:
        create_workload("w", tmp_path / "p.cu", tmp_path)
    at = f"{tmp_path / 'p.cu'}:{_line(tmp_path / 'p.cu', 'init_comm(')}"
    assert err.value.blockers == [f"{at}: `init_comm(&comm, rank, world);`: calls init_comm(), given the "
                                  "communicator's address, which none of the files given defines: if it creates the "
                                  "communicator, give its file too (--from)"]


def test_two_files_that_each_define_main_are_refused(tmp_path):
    other = tmp_path / "other.cu"
    other.write_text(STRUCT.read_text())
    with pytest.raises(CucoError, match=r"main\(\) is defined 2 times \(.*struct_sizes\.cu:\d+, .*other\.cu:\d+\): "
                                        r"give the files of one program"):
        create_workload("w", [STRUCT, other], tmp_path)


def test_files_that_cannot_be_one_program_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "k.cu").write_text("__global__ void k() {}\n")
    with pytest.raises(CucoError, match=r"two files named k\.cu"):
        create_workload("w", [tmp_path / "a" / "k.cu", tmp_path / "b" / "k.cu"], tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CucoError, match=r"notes\.txt: cuco init reads CUDA C\+\+ sources"):
        create_workload("w", [tmp_path / "notes.txt"], tmp_path)
    seed = ROOT / "cuco" / "builtin" / "allreduce_sum" / "seed.cu"
    with pytest.raises(CucoError, match=r"several files are read as one standalone program"):
        create_workload("w", [seed, tmp_path / "a" / "k.cu"], tmp_path)


# ---- the preprocessor's part ---------------------------------------------------------------------------------

@needs_cpp
def test_macros_expand_with_lines_mapped_back(tmp_path):
    """An `#if` that splits an if/else, a launch configuration behind a macro, a header of the program's that was
    not given (its macros used, its include kept) and a check macro and a constant kept as written; every line's
    origin is the user's."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "config.h").write_text("#define LAUNCH(n) ((n) + 127) / 128, 128\n")
    host = tmp_path / "main.cu"
    host.write_text(
        '#include <cstdio>\n#include "config.h"\n#define CHECK(x) do { if ((x) != 0) exit(1); } while (0)\n'
        "#define N (1 << 20)\n"
        "int main() {\n"
        "  for (int i = 0; i < 10; ++i) {\n"
        "#ifdef FAST\n"
        "    if (fast) {\n"
        "#else\n"
        "    if (i >= 0) {\n"
        "#endif\n"
        "      k<<<LAUNCH(N), 0, s>>>(x);\n"
        "      CHECK(cudaGetLastError());\n"
        "    }\n"
        "  }\n"
        "}\n")
    unit = expand_macros(read_sources([host]), [tmp_path / "inc"], [])
    lines = dict(zip([o.line for o in unit.origins], unit.lines))
    assert lines[2] == '#include "config.h"' and lines[4] == "#define N (1 << 20)"
    assert lines[3].startswith("#define CHECK(x)") and lines[13] == "      CHECK(cudaGetLastError());"
    assert lines[8] == "" and lines[10] == "    if (i >= 0) {"
    assert lines[12] == "      k<<<((N) + 127) / 128, 128, 0, s>>>(x);"
    assert all(o.path == host for o in unit.origins)
    fast = expand_macros(read_sources([host]), [tmp_path / "inc"], ["FAST"])
    assert fast.lines[7] == "    if (fast) {" and fast.lines[9] == ""


@needs_cpp
def test_a_preprocessor_error_names_the_users_line(tmp_path):
    host = tmp_path / "main.cu"
    host.write_text("int x;\n#ifndef HAVE_MPI\n#error build with -DHAVE_MPI\n#endif\nint main() { return 0; }\n")
    with pytest.raises(CucoError, match=rf"^{host}:3: the C preprocessor stops here: #error build with -DHAVE_MPI"):
        expand_macros(read_sources([host]), [], [])


def test_without_a_preprocessor_the_macros_stay_and_the_user_is_told(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "preprocessor", lambda: None)
    host = tmp_path / "main.cu"
    host.write_text("#define N 4\nvoid f() { k<<<N, {32, 1, 1}>>>(); }\n")
    unit = expand_macros(read_sources([host]), [], [])
    assert unit.lines == ["#define N 4", "void f() { k<<<N, dim3{32, 1, 1}>>>(); }"]
    assert any("no C preprocessor" in w for w in unit.warnings)


# ---- helpers written out -------------------------------------------------------------------------------------

def test_a_helpers_names_are_kept_apart_from_mains(tmp_path):
    """A helper's local that main() also names is renamed; a parameter the helper changes is declared from the
    argument (renamed where the argument names it); one it only reads is the argument itself."""
    host = tmp_path / "main.cu"
    host.write_text(
        "__global__ void k(float* x, int n) {}\n"
        "static void launch(float* x, int n, int blocks, cudaStream_t s) {\n"
        "  int threads = 256;\n"
        "  n += 1; while (blocks * threads < n) blocks *= 2;\n"
        "  k<<<blocks, threads, 0, s>>>(x, n * 2);\n"
        "}\n"
        "static void twice(float* x, int m, cudaStream_t s) { k<<<1, 1, 0, s>>>(x, m * 2); }\n"
        "int main() {\n"
        "  int threads = 128, n = 1024;\n"
        "  float* d;\n"
        "  cudaStream_t st;\n"
        "  for (int i = 0; i < 3; ++i) launch(d, n + 1, 4, st);\n"
        "  for (int i = 0; i < 3; ++i) { twice(d, n + 1, st); }\n"
        "}\n")
    unit, _ = read_program([host], [], [])
    body = "\n".join(unit.lines)
    assert "int threads_ = 256;" in body and "int blocks = 4;" in body and "int n_ = n + 1;" in body
    assert "k<<<blocks, threads_, 0, st>>>(d, n_ * 2);" in body
    assert "k<<<1, 1, 0, st>>>(d, (n + 1) * 2);" in body  # read only: the argument itself, in parentheses
    written = [o.line for o, ln in zip(unit.origins, unit.lines) if "st>>>" in ln]
    assert written == [5, 7]  # each written-out launch keeps its helper's line
    assert Unit(unit.lines, unit.origins, unit.files).origin(len(unit.lines) + 5).path == host


@needs_cpp
def test_the_bound_times_the_programs_own_gemms(mlp):
    """reference.py's compute_alone is written from the GEMM calls: torch.matmul on the workload's buffers, each
    product the one cuBLAS computes (column-major calls read row-major), the elementwise kernels named as left out."""
    import importlib.util

    import torch

    from cuco.workload.contract import RankView

    spec_ = importlib.util.spec_from_file_location("scaffolded", mlp / "reference.py")
    scaffolded = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(scaffolded)
    source = (mlp / "reference.py").read_text()
    assert "kernels (bias_gelu_kernel, bias_residual_kernel) are left out" in source
    p, world = {"tokens": 6, "hidden": 10, "ffn": 12}, 2
    gen = torch.Generator().manual_seed(0)
    shapes = {"x": (6, 10), "w1": (10, 6), "h": (6, 6), "w2": (6, 10), "y": (6, 10)}
    bufs = {n: torch.randn(s, generator=gen).flatten() for n, s in shapes.items()}
    scaffolded.compute_alone(RankView(p, world, 0, [], bufs))()
    x, w1, w2 = (bufs[n].view(shapes[n]) for n in ("x", "w1", "w2"))
    assert torch.allclose(bufs["h"].view(6, 6), x @ w1) and torch.allclose(bufs["y"].view(6, 10), (x @ w1) @ w2)


# ---- sizes held in a struct ----------------------------------------------------------------------------------

STRUCT = ROOT / "tests" / "init_programs" / "struct_sizes.cu"


def test_sizes_held_in_a_struct_are_parameters(tmp_path):
    """`Config cfg;` with `int count = 1 << 20;` (argv may override it): cfg.count is the parameter `count`, with
    the program's default; the seed declares the struct and sets the field from cuco_param; a field that is not a
    size keeps its default."""
    made = create_workload("w", STRUCT, tmp_path)
    root = made.root
    assert made.reading == []  # one file, no helper: nothing to say
    spec = load_workload(root)
    assert list(spec.params) == ["count"] and spec.shapes[0].params == {"count": 1 << 20}
    assert [list(b.shape) for b in spec.buffers.values()] == [["count"], ["count"]]
    seed = (root / "seed.cu").read_text()
    assert "  Config cfg;\n  cfg.count = (int)cuco_param(ctx, \"count\");\n" in seed
    assert "cfg.iters" not in seed and "struct Config {" in seed and "};\n" in seed
    assert _run_calls(seed) == ["scale", "cudaGetLastError", "ncclAllReduce"]


def test_a_field_that_clashes_with_a_local_is_named_by_its_struct(tmp_path):
    src = STRUCT.read_text().replace("  Config cfg;\n", "  Config cfg;\n  const int count = 7;\n")
    (tmp_path / "p.cu").write_text(src)
    spec = load_workload(create_workload("w", tmp_path / "p.cu", tmp_path).root)
    assert list(spec.params) == ["cfg_count"]


def test_a_struct_written_where_cuco_cannot_see_is_refused(tmp_path):
    src = STRUCT.read_text().replace("  if (argc > 1) cfg.count = atoi(argv[1]);\n",
                                     "  parse_args(argc, argv, &cfg);\n")
    (tmp_path / "p.cu").write_text(src)
    with pytest.raises(CucoError, match=r"p\.cu:\d+: `[^`]*cfg\.count[^`]*`: uses cfg\.count, set by parse_args \(line "
                                        r"\d+\): cuco cannot carry it"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """struct_sizes.cu with each (old, new) edit made, every one of them found (an edit that misses would leave the
    program as it was, and a test of it could pass for the wrong reason): tmp_path/p.cu."""
    src = STRUCT.read_text()
    for old, new in edits:
        assert old in src, f"the edit's text is not in the program: {old!r}"
        src = src.replace(old, new)
    (tmp_path / "p.cu").write_text(src)
    return tmp_path / "p.cu"


def test_a_struct_filled_through_its_address_is_read_and_its_name_kept_apart(tmp_path):
    """A context struct filled by a helper given its address (`init(&ctx)`): `MPI_Comm_rank(..., &c->rank)` sets the
    field, `cudaSetDevice(c->rank)` only reads it; the step's use of ctx.rank is the runner's rank. main()'s `ctx`
    would hide cuco_run's own context: it is renamed in the seed."""
    _variant(tmp_path, ("struct Config {", "struct Ctx { int rank; };\nstatic void init(Ctx* c) {\n"
                                           "  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);\n  cudaSetDevice(c->rank);\n}\n"
                                           "struct Config {"),
             ("  MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n", "  Ctx ctx;\n  init(&ctx);\n  rank = ctx.rank;\n"),
             ("(d_x, 2.0f, cfg.count)", "(d_x, 2.0f * ctx.rank, cfg.count)"))  # the step reads the field
    run = (create_workload("w", tmp_path / "p.cu", tmp_path).root / "seed.cu").read_text().split("int cuco_run(")[1]
    assert "Ctx ctx_;\n  ctx_.rank = (int)ctx->rank;" in run and "(d_x, 2.0f * ctx_.rank, cfg.count)" in run, run


@pytest.mark.parametrize("defined", ["inside", "outside"])
def test_a_method_that_issues_device_work_is_named_with_its_class(tmp_path, defined):
    """The loop's all-reduce moved into a method of the program's class (defined in the class, or as
    `Exchanger::step`): refused as a method cuco does not write out, not as a program with no device work."""
    head, body = "void step(float* x, float* y, int n, ncclComm_t c, cudaStream_t s)", \
        "{ ncclAllReduce(x, y, n, ncclFloat, ncclSum, c, s); }"
    cls = f"class Exchanger {{\n public:\n  {head} {body}\n}};\n" if defined == "inside" else \
        f"class Exchanger {{\n public:\n  {head};\n}};\nvoid Exchanger::{head[5:]} {body}\n"
    _variant(tmp_path, ("struct Config {", cls + "struct Config {"),
             ("    ncclAllReduce(d_x, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);\n",
              "    ex.step(d_x, d_y, cfg.count, comm, stream);\n"),
             ("  for (int it = 0;", "  Exchanger ex;\n  for (int it = 0;"))
    with pytest.raises(CucoError, match=r"p\.cu:\d+: `ex\.step\([^`]*\);`: calls ex\.step\(\), a method of Exchanger "
                                        r"that issues device work: cuco writes out the program's own functions"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


def test_a_loop_that_allocates_before_the_step_is_set_up(tmp_path):
    """`for (b...) { cudaMalloc(&bufs[b], ...); cudaMemset(bufs[b], ...); }` before the timed loop is set-up, not the
    step: the refusal is about the step's own statements (here its buffers, held in an array)."""
    alloc = "  float *d_x, *d_y;\n  cudaMalloc(&d_x, cfg.count * sizeof(float));\n" \
            "  cudaMalloc(&d_y, cfg.count * sizeof(float));\n"
    loop = "  float* bufs[2];\n  for (int b = 0; b < 2; ++b) {\n" \
           "    cudaMalloc(&bufs[b], cfg.count * sizeof(float));\n" \
           "    cudaMemset(bufs[b], 0, cfg.count * sizeof(float));\n  }\n"
    _variant(tmp_path, (alloc, loop), ("d_x", "bufs[0]"), ("d_y", "bufs[1]"))
    with pytest.raises(CucoError) as err:
        create_workload("w", tmp_path / "p.cu", tmp_path)
    step = {_line(tmp_path / "p.cu", "scale<<<"), _line(tmp_path / "p.cu", "ncclAllReduce(")}
    assert any(f"p.cu:{n}:" in str(err.value) for n in step) and "in the step" not in str(err.value), str(err.value)


def test_a_lambda_that_issues_device_work_is_refused_not_dropped(tmp_path):
    """The loop's launch moved into a lambda of main(): refused by name (a seed without it would do less than the
    program, and the checks would pass it)."""
    lambda_ = "  auto launch = [&](float* y) { scale<<<256, 256, 0, stream>>>(y, 2.0f, cfg.count); };\n"
    _variant(tmp_path, ("  for (int it = 0;", lambda_ + "  for (int it = 0;"),
             ("    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n", "    launch(d_x);\n"))
    with pytest.raises(CucoError, match=r"`launch\(d_x\);`: calls launch\(\), a lambda of main\(\) that issues device "
                                        r"work"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


def test_a_loop_of_memsets_before_the_step_is_set_up(tmp_path):
    program = _variant(tmp_path, ("  for (int it = 0;", "  float* both[2] = {d_x, d_y};\n  for (int b = 0; b < 2; ++b) "
                                                      "cudaMemset(both[b], 0, cfg.count * sizeof(float));\n"
                                                      "  for (int it = 0;"))
    seed = (create_workload("w", program, tmp_path).root / "seed.cu").read_text()
    assert _run_calls(seed) == ["scale", "cudaGetLastError", "ncclAllReduce"]


def test_buffers_updated_in_place_are_inout(tmp_path):
    """Gradients all-reduced in place (x), or scaled and then all-reduced in place (y, the kernel loading and storing
    each element): what the step reads first is given fresh for every run and what it leaves there is verified, not
    a poisoned output whose NaN the step would read, nor an input the run is said to change."""
    _variant(tmp_path, ("__global__ void scale(float* x, float s, int n) { }",
                        "__global__ void scale(float* x, float s, int n) {\n"
                        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] *= s;\n}"),
             ("    ncclAllReduce(d_x, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);\n",
              "    scale<<<256, 256, 0, stream>>>(d_y, 2.0f, cfg.count);\n"
              "    ncclAllReduce(d_x, d_x, cfg.count, ncclFloat, ncclSum, comm, stream);\n"
              "    ncclAllReduce(d_y, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);\n"),
             ("    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n", ""))
    made = create_workload("w", tmp_path / "p.cu", tmp_path)
    spec = load_workload(made.root)
    assert {n: b.role for n, b in spec.buffers.items()} == {"x": "inout", "y": "inout"}
    toml = (made.root / "workload.toml").read_text()
    assert "# y: read by scale (" in toml and "TODO" not in toml.split("[buffers.y]")[1].split("\n")[1]
    reference = (made.root / "reference.py").read_text()  # both are among what reference returns, so described
    assert reference.count("updated in place: what the run leaves in it, from the value make_inputs gives it") == 2


def test_a_buffer_zeroed_before_the_loop_and_written_first_by_the_step_is_an_output(tmp_path):
    """cudaMemset(d_y) in the set-up, then the all-reduce writes d_y before anything reads it: the step's result,
    not an input, whatever the set-up put there."""
    _variant(tmp_path, ("  for (int it = 0;", "  cudaMemset(d_y, 0, cfg.count * sizeof(float));\n  for (int it = 0;"))
    spec = load_workload(create_workload("w", tmp_path / "p.cu", tmp_path).root)
    assert spec.buffers["y"].role == "output"


ARRAY = ROOT / "tests" / "init_programs" / "buffer_array.cu"


def test_buffers_in_an_array_and_a_size_at_file_scope_are_all_named_in_one_run(tmp_path):
    """Three blockers of different kinds (a buffer chosen by the iteration, buffers held in an array, no size of
    main()'s): one refusal lists them all, each at its line, so that one pass of edits can fix them."""
    with pytest.raises(Blocked) as err:
        create_workload("w", ARRAY, tmp_path)
    lines = err.value.blockers  # in the order of the program's lines
    assert len(lines) == 3, lines
    assert f"buffer_array.cu:{_line(ARRAY, 'for (int it')}: " in lines[0]
    assert "no size of the step is a variable of main()" in lines[0]
    assert f"buffer_array.cu:{_line(ARRAY, 'scale<<<')}: " in lines[1] and "uses it, which changes" in lines[1]
    assert f"buffer_array.cu:{_line(ARRAY, 'ncclAllReduce(')}: " in lines[2]
    assert "an array of pointers (`float* bufs[2]`)" in lines[2] and "declare one per buffer" in lines[2]


def test_a_vector_of_device_pointers_is_named_as_one(tmp_path):
    src = ARRAY.read_text().replace("  float* bufs[2];\n", "  std::vector<float*> bufs(2);\n")
    (tmp_path / "p.cu").write_text(src.replace("bufs[it % 2]", "bufs[0]"))
    with pytest.raises(Blocked) as err:
        create_workload("w", tmp_path / "p.cu", tmp_path)
    assert any("a host container of device pointers (`std::vector<float*>`)" in b for b in err.value.blockers), \
        err.value.blockers


CONTEXT = ROOT / "tests" / "init_programs" / "context_struct.cu"


def test_a_context_struct_filled_by_a_helper_is_bound_field_by_field(tmp_path):
    """`Context c; setup(c, argc, argv); ... step(c);`: the communicator, the stream, the rank, the size and the
    buffers live in c's fields. cuco_run declares c and gives each field what the runner gives for it; the buffers
    are the fields' names, x updated in place (scaled, then all-reduced) and y the all-reduce's result."""
    made = create_workload("w", CONTEXT, tmp_path)
    seed = (made.root / "seed.cu").read_text()
    run = seed[seed.index("int cuco_run("):]
    for bound in ("Context c;", "c.rank = (int)ctx->rank;", "c.comm = ctx->comm;", "c.stream = ctx->stream;",
                  'c.x = (float*)cuco_buffer(ctx, "x")->ptr;', 'c.y = (float*)cuco_buffer(ctx, "y")->ptr;',
                  'c.n = (size_t)cuco_param(ctx, "n");'):
        assert bound in run, bound
    assert _run_calls(seed) == ["scale", "cudaGetLastError", "ncclAllReduce"]
    spec = load_workload(made.root)
    assert {n: (b.role, b.shape) for n, b in spec.buffers.items()} == {"x": ("inout", ("n",)), "y": ("output", ("n",))}
    assert spec.shapes[0].params == {"n": 1 << 20}
    toml = (made.root / "workload.toml").read_text()  # every line cited says which file: the seed's, or the original's
    launch = _line(made.root / "seed.cu", "scale<<<")
    assert "(line " not in toml and f'flops = "0"  # TODO: scale (seed.cu:{launch})' in toml
    (made.root / "reference.py").write_text(CONTEXT_REFERENCE)  # make_inputs gives x, reference returns x and y
    assert check_workload(made.root) == []
    # cuco transform follows the fields to the buffers they were given: the all-reduce runs on their windows
    analysis = analyze(made.root / "seed.cu")
    [reduce] = [op for op in analysis.ops if op.kind == "collective"]
    assert (reduce.reads, reduce.writes) == (["x"], ["y"])  # what the knobs' overlap and fusion analyses read
    code = rewrite(analysis, spec).code
    assert ('cuco::allReduce<float>(ctx, cuco_buffer(ctx, "x")->window, 0, cuco_buffer(ctx, "y")->window, 0, c.n, '
            "c.stream)") in code


CONTEXT_REFERENCE = """\
import torch


def make_inputs(p, world, rank, gen, device):
    return {"x": torch.randn(p["n"], generator=gen, device=device)}


def reference(p, world, rank, inputs):
    scaled = [2.0 * inp["x"].double() for inp in inputs]
    return {"x": scaled[rank], "y": sum(scaled)}


def comm_alone(view):
    import torch.distributed as dist

    y = view.bufs["y"]
    return lambda: dist.all_reduce(y, group=view.group)
"""


@pytest.mark.gpu(1)
@pytest.mark.nvcc
def test_the_context_struct_seed_passes_the_judge_on_a_gpu(tmp_path):
    """The converted seed, its reference written, evaluated at world 1 through L4: its fields bound to the runner's
    communicator, stream, buffers and size, x (scaled in place) delivered and verified as inout."""
    from cuco.runner.cascade import EvalOptions, evaluate

    root = create_workload("ctx", CONTEXT, tmp_path).root
    toml = (root / "workload.toml").read_text()
    (root / "workload.toml").write_text(toml.replace("world_size = 2", "world_size = 1").replace("n = 64", "n = 37"))
    (root / "reference.py").write_text(CONTEXT_REFERENCE)
    rec = evaluate(load_workload(root), root / "seed.cu", EvalOptions(device="cuda", gpus=[0], timeout_s=120,
                                                                       work_dir=tmp_path / "w"))
    assert rec.ok and rec.level_reached == "L4", rec.error


def test_a_context_struct_filled_through_a_pointer_with_a_size_from_main(tmp_path):
    """`setup(&c, n, ...)` whose body writes `c->comm`, `c->x`, `c->n = n` (n read from argv by main()): the pointer
    to main()'s struct is the struct itself, and c.n is given n, the workload's parameter, in cuco_run."""
    src = CONTEXT.read_text()
    setup = src[src.index("void setup("):src.index("void step(")]
    through = setup.replace("void setup(Context& c, int argc, char** argv)", "void setup(Context* c, size_t n)") \
        .replace("  MPI_Init(&argc, &argv);\n", "").replace("c.", "c->").replace("c->n = 1 << 20;", "c->n = n;")
    src = src.replace(setup, through).replace(
        "  Context c;\n  setup(c, argc, argv);\n",
        "  MPI_Init(&argc, &argv);\n  const size_t n = argc > 1 ? atol(argv[1]) : 4096;\n  Context c;\n"
        "  setup(&c, n);\n")
    assert "c->n = n;" in src and "setup(&c, n);" in src
    (tmp_path / "p.cu").write_text(src)
    made = create_workload("w", tmp_path / "p.cu", tmp_path)
    run = (made.root / "seed.cu").read_text().split("int cuco_run(")[1]
    for bound in ('const size_t n = (size_t)cuco_param(ctx, "n");', "c.comm = ctx->comm;", "c.n = n;",
                  'c.x = (float*)cuco_buffer(ctx, "x")->ptr;'):
        assert bound in run, (bound, run)
    assert run.index('cuco_param(ctx, "n")') < run.index("c.n = n;")
    assert load_workload(made.root).shapes[0].params == {"n": 4096}


def test_a_struct_field_cuco_setup_would_hold_is_refused_by_name(tmp_path):
    """A cuBLAS handle the step uses would live in cuco_setup's state: held in a field of the context, it is refused
    with its name, not left unset in cuco_run."""
    src = CONTEXT.read_text() \
        .replace("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n#include <cublas_v2.h>\n") \
        .replace("  size_t n;\n", "  size_t n;\n  cublasHandle_t blas;\n") \
        .replace("  cudaStreamCreate(&c.stream);\n", "  cudaStreamCreate(&c.stream);\n  cublasCreate(&c.blas);\n") \
        .replace("  scale<<<(c.n + 255) / 256, 256, 0, c.stream>>>(c.x, 2.0f, c.n);\n",
                 "  const float two = 2.0f;\n  cublasSscal(c.blas, c.n, &two, c.x, 1);\n")
    (tmp_path / "p.cu").write_text(src)
    with pytest.raises(CucoError, match=r"keeps c\.blas, which cuco_setup would make and hold, in a field of a struct"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


def test_buffers_swapped_at_the_end_of_each_iteration_are_refused(tmp_path):
    """`std::swap(d_x, d_y);` closing the loop: each iteration works on other buffers, which one cuco_run cannot
    issue; refused as the same swap written by hand is, not dropped."""
    _variant(tmp_path, ("  }\n  cudaStreamSynchronize", "    std::swap(d_x, d_y);\n  }\n  cudaStreamSynchronize"))
    with pytest.raises(CucoError, match=r"uses d_\w, which changes from one iteration to the next \(line \d+\)"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


def test_a_buffer_copied_from_the_host_in_the_step_is_a_delivered_input_of_its_own_size(tmp_path):
    """The step's cudaMemcpyAsync from the host is what the judge's delivery of the inputs stands for: left out,
    and said so; the buffer's size, which cuco_run never reads, stays the program's (1024), not a placeholder."""
    _variant(tmp_path,
             ("__global__ void scale(", "__global__ void add(const float* b, float* y, int n) {\n"
                                        "  int i = threadIdx.x;\n  if (i < n) y[i] += b[i % 1024];\n}\n"
                                        "__global__ void scale("),
             ("  float *d_x, *d_y;\n", "  const int batch = 1024;\n  float *d_b, *h_b;\n"
                                      "  cudaMallocHost(&h_b, batch * sizeof(float));\n"
                                      "  cudaMalloc(&d_b, batch * sizeof(float));\n  float *d_x, *d_y;\n"),
             ("    scale<<<", "    cudaMemcpyAsync(d_b, h_b, batch * sizeof(float), cudaMemcpyHostToDevice, stream);\n"
                            "    add<<<1, 256, 0, stream>>>(d_b, d_x, cfg.count);\n    scale<<<"))
    made = create_workload("w", tmp_path / "p.cu", tmp_path)
    spec = load_workload(made.root)
    assert (spec.buffers["b"].role, spec.buffers["b"].shape) == ("input", ("1024",))
    assert "batch" not in spec.params
    assert "cudaMemcpyAsync" not in (made.root / "seed.cu").read_text().split("int cuco_run(")[1]
    assert "copied from the host in the step (original.cu:" in (made.root / "workload.toml").read_text()


def test_a_split_communicator_is_refused_as_one(tmp_path):
    split = "  ncclComm_t sub;\n  ncclCommSplit(comm, rank % 2, rank, &sub, NULL);\n"
    _variant(tmp_path, ("  cudaStream_t stream;\n", split + "  cudaStream_t stream;\n"),
             ("ncclSum, comm, stream)", "ncclSum, sub, stream)"))
    with pytest.raises(CucoError, match=r"uses sub \(line \d+\), a communicator split from another \(ncclCommSplit, "
                                        r"line \d+\): cuco runs the step on the runner's one communicator"):
        create_workload("w", tmp_path / "p.cu", tmp_path)


@pytest.mark.parametrize("clamp", ["if (blocks > 65535) blocks = 65535;", "blocks = std::min(blocks, 65535);"])
def test_a_launch_configuration_the_step_clamps_is_kept(tmp_path, clamp):
    """The step's own local, computed and clamped the same way on every iteration, is no value that changes from one
    iteration to the next: the clamp stays in cuco_run, before the launch it sizes."""
    _variant(tmp_path, ("    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n",
                        f"    int blocks = (cfg.count + 255) / 256;\n    {clamp}\n"
                        "    scale<<<blocks, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n"))
    seed = (create_workload("w", tmp_path / "p.cu", tmp_path).root / "seed.cu").read_text()
    run = seed[seed.index("int cuco_run("):]
    assert run.index("int blocks =") < run.index(clamp) < run.index("scale<<<blocks"), run


def test_a_size_divided_as_c_integers_divide_rounds_down(tmp_path):
    """`(cfg.count + world - 1) / world` floats: C's integer division, which need not divide exactly: the shape
    rounds down as the program does (`//`), not a placeholder."""
    part = "  cudaMalloc(&d_part, (cfg.count + world - 1) / world * sizeof(float));\n"
    _variant(tmp_path, ("  float *d_x, *d_y;\n", "  float *d_x, *d_y, *d_part;\n" + part),
             ("    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n",
              "    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n"
              "    add_part<<<256, 256, 0, stream>>>(d_part, d_x, cfg.count);\n"),
             ("__global__ void scale(", "__global__ void add_part(const float* p, float* x, int n) { x[0] += p[0]; }\n"
                                        "__global__ void scale("))
    spec = load_workload(create_workload("w", tmp_path / "p.cu", tmp_path).root)
    assert spec.buffers["part"].shape == ("(count + world - 1) // world",)


@needs_cpp
def test_a_size_from_a_header_not_given_is_read_from_it(tmp_path):
    """`#include "sizes.h"` beside the program, not given with --from: its integer #defines are the sizes the program
    starts from (the header stays an include of the seed, with the warning to paste it)."""
    (tmp_path / "sizes.h").write_text("#pragma once\n#define DEFAULT_COUNT (1 << 16)\n")
    _variant(tmp_path, ("#include <cuda_runtime.h>\n", '#include <cuda_runtime.h>\n#include "sizes.h"\n'),
             ("  int count = 1 << 20;\n", "  int count = DEFAULT_COUNT;\n"))
    made = create_workload("w", tmp_path / "p.cu", tmp_path)
    assert load_workload(made.root).shapes[0].params == {"count": 1 << 16}
    assert any('keeps #include "sizes.h"' in w for w in made.warnings)


def test_what_the_step_leaves_to_the_runner_is_listed(tmp_path):
    """A host sync and a progress print inside the loop are the runner's part, left out of cuco_run: said so, with
    their lines, not dropped without a word."""
    program = _variant(tmp_path, ("    ncclAllReduce(d_x, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);\n",
                                  "    ncclAllReduce(d_x, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);\n"
                                  "    cudaStreamSynchronize(stream);\n"
                                  '    if (it % 10 == 0) printf("step %d\\n", it);\n'))
    made = create_workload("w", program, tmp_path)
    sync, prints = _line(program, "    cudaStreamSynchronize"), _line(program, "if (it % 10")
    assert f"left out of cuco_run, the runner's part: cudaStreamSynchronize (line {sync}), `if (it % 10 == 0)` and " \
           f"its host work (line {prints})" in made.reading, made.reading


def test_cublaslt_descriptors_and_layouts_are_cuco_setups_state(tmp_path):
    """A cuBLASLt handle, a matmul descriptor set through an attribute and a matrix layout, made before the loop:
    cuco_setup makes them (the attribute's value with them), cuco_run uses them, cuco_teardown destroys them."""
    setup = ("  cublasLtHandle_t lt;\n  cublasLtCreate(&lt);\n  cublasLtMatmulDesc_t desc;\n"
             "  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);\n"
             "  cublasOperation_t opT = CUBLAS_OP_T;\n"
             "  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opT, sizeof(opT));\n"
             "  cublasLtMatrixLayout_t lay;\n  cublasLtMatrixLayoutCreate(&lay, CUDA_R_32F, 64, 64, 64);\n"
             "  const float one = 1.0f, zero = 0.0f;\n")
    _variant(tmp_path, ("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n#include <cublasLt.h>\n"),
             ("  for (int it = 0;", setup + "  for (int it = 0;"),
             ("    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);\n",
              "    cublasLtMatmul(lt, desc, &one, d_x, lay, d_x, lay, &zero, d_y, lay, d_y, lay, nullptr, nullptr, 0, "
              "stream);\n"))
    seed = (create_workload("w", tmp_path / "p.cu", tmp_path).root / "seed.cu").read_text()
    setup_fn, rest = seed.split("int cuco_setup(")[1].split("int cuco_run(")
    run, teardown = rest.split("int cuco_teardown(")
    for made in ("cublasLtCreate(&s->lt)", "cublasLtMatmulDescCreate(&s->desc,", "cublasOperation_t opT = CUBLAS_OP_T;",
                 "cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opT, sizeof(opT))",
                 "cublasLtMatrixLayoutCreate(&s->lay,"):
        assert made in setup_fn, (made, setup_fn)
    assert "cublasLtMatmul(lt, desc, &one, d_x, lay" in run and "cublasLtMatmulDesc_t desc = s->desc;" in run
    for gone in ("cublasLtMatrixLayoutDestroy(s->lay)", "cublasLtMatmulDescDestroy(s->desc)", "cublasLtDestroy(s->lt)"):
        assert gone in teardown, (gone, teardown)


MAKE_COMM = "ncclComm_t make_comm(int rank, int world) {\n  ncclUniqueId id;\n" \
            "  if (rank == 0) ncclGetUniqueId(&id);\n" \
            "  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);\n  ncclComm_t comm;\n" \
            "  ncclCommInitRank(&comm, world, id, rank);\n  return comm;\n}\n"


@pytest.mark.parametrize("returned", ["comm", "auto", "c[0]"])
def test_a_communicator_returned_by_a_helper_is_mains(tmp_path, returned):
    """`ncclComm_t comm = make_comm(rank, world);`: the helper is written out, its returned local becoming main()'s
    comm, so the runner's communicator takes its place; a helper that returns anything but a local of its own stays
    a call, and the refusal says why."""
    helper = MAKE_COMM if returned != "c[0]" else MAKE_COMM.replace("  ncclComm_t comm;\n", "  ncclComm_t c[1];\n") \
        .replace("&comm,", "&c[0],").replace("return comm;", "return c[0];")
    src = STRUCT.read_text()
    made = src[src.index("  ncclUniqueId id;\n"):src.index("  cudaStream_t stream;")]  # main()'s
    declared = "auto" if returned == "auto" else "ncclComm_t"
    _variant(tmp_path, (made, f"  {declared} comm = make_comm(rank, world);\n"), ("int main(", helper + "int main("))
    if returned != "c[0]":
        made = create_workload("w", tmp_path / "p.cu", tmp_path)
        assert _run_calls((made.root / "seed.cu").read_text()) == ["scale", "cudaGetLastError", "ncclAllReduce"]
        assert any("make_comm()" in line for line in made.reading)
        unit, _ = read_program([tmp_path / "p.cu"], [], [])  # main() declares the helper's local with its type
        lines = [ln.strip() for ln in unit.lines]
        assert "auto comm;" not in lines and lines.count("ncclComm_t comm;") == 2  # the helper's own, and main()'s
    else:
        with pytest.raises(CucoError, match=r"inside make_comm\(\), which cuco cannot write out in place \(it is "
                                            r"called for its value, which is not a local it declares and returns\)"):
            create_workload("w", tmp_path / "p.cu", tmp_path)


@pytest.mark.parametrize("through", ["local", "pointer"])
def test_a_communicator_a_helper_stores_through_a_pointer_is_mains(tmp_path, through):
    """`init_comm(&comm, rank, world);` whose helper ends `*out = c;` (or hands `out` to ncclCommInitRank): written
    out, c becoming main()'s comm, so the runner's communicator takes its place."""
    helper = MAKE_COMM.replace("ncclComm_t make_comm(int rank, int world)",
                               "void init_comm(ncclComm_t* out, int rank, int world)")
    helper = helper.replace("  return comm;\n", "  *out = comm;\n") if through == "local" else \
        helper.replace("  ncclComm_t comm;\n", "").replace("&comm,", "out,").replace("  return comm;\n", "")
    src = STRUCT.read_text()
    made = src[src.index("  ncclUniqueId id;\n"):src.index("  cudaStream_t stream;")]
    _variant(tmp_path, (made, "  ncclComm_t comm;\n  init_comm(&comm, rank, world);\n"),
             ("int main(", helper + "int main("))
    made = create_workload("w", tmp_path / "p.cu", tmp_path)
    assert _run_calls((made.root / "seed.cu").read_text()) == ["scale", "cudaGetLastError", "ncclAllReduce"]
    assert any("init_comm()" in line for line in made.reading)


@pytest.mark.nvcc
def test_the_struct_seed_builds(tmp_path):
    """struct_sizes.cu with its stream named s and a context struct named ctx, the two names cuco_setup's state and
    cuco_run's context take in the seed: renamed there, and the seed builds."""
    from cuco.runner.build.cuda_checks import check_and_build

    program = _variant(tmp_path, ("cudaStream_t stream;", "cudaStream_t s;"), ("cudaStreamCreate(&stream)",
                                                                                "cudaStreamCreate(&s)"),
                       ("0, stream>>>", "0, s>>>"), ("comm, stream)", "comm, s)"), ("Synchronize(stream)",
                                                                                    "Synchronize(s)"),
                       ("struct Config {", "struct Ctx { int rank; };\nstruct Config {"),
                       ("  MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n",
                        "  Ctx ctx;\n  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);\n  rank = ctx.rank;\n"),
                       ("(d_x, 2.0f, cfg.count)", "(d_x, 2.0f * ctx.rank, cfg.count)"))
    seed = create_workload("w", program, tmp_path).root / "seed.cu"
    assert "__global__ void scale(float* x, float s, int n)" in seed.read_text()  # a kernel keeps its own names
    built, problems = check_and_build(seed)
    assert problems == [] and built.ok, built.log[-3000:]


def test_helpers_are_written_out_three_levels_deep_and_no_deeper(tmp_path):
    """main() -> a step function -> a launcher -> what it calls: each written out in place (the common layout's
    step() in host.cpp calling kernels.cu's launchers); a fourth level (or a template whose arguments the call does
    not spell out) stays a call, and the refusal says which."""
    host = tmp_path / "main.cu"
    host.write_text(
        "static void reduce(float* x, int n, ncclComm_t c, cudaStream_t s) {\n"
        "  ncclAllReduce(x, x, n, ncclFloat, ncclSum, c, s);\n}\n"
        "static void l3(float* x, int n, ncclComm_t c, cudaStream_t s) { reduce(x, n, c, s); }\n"
        "static void l2(float* x, int n, ncclComm_t c, cudaStream_t s) { l3(x, n, c, s); }\n"
        "static void step(float* x, int n, ncclComm_t c, cudaStream_t s) { l2(x, n, c, s); }\n"
        "static void shallow(float* x, int n, ncclComm_t c, cudaStream_t s) { reduce(x, n, c, s); }\n"
        "template <typename T> void twice(T* x, int n, ncclComm_t c, cudaStream_t s) { reduce(x, n, c, s); }\n"
        "int main() {\n  float* d; ncclComm_t comm; cudaStream_t st;\n"
        "  for (int i = 0; i < 3; ++i) { step(d, 8, comm, st); shallow(d, 4, comm, st); twice(d, 8, comm, st); }\n}\n")
    unit, _ = read_program([host], [], [])
    assert unit.written_out == ["step", "shallow", "l2", "reduce", "l3"]  # reduce: shallow's, two levels down
    assert unit.unwritten == {"twice": "is a template called without its arguments spelled out (twice<...>(...)): "
                                       "cuco cannot tell T",
                              "reduce": "is called inside l3(), itself written out in place "
                                                                  "3 levels below main(): cuco writes out 3 levels of "
                                                                  "the program's helpers"}
    main = "".join(unit.lines[unit.lines.index("int main() {"):])
    assert "ncclAllReduce(d, d, 4," in main.replace("(d)", "d") and "reduce(d, 8, comm, st);" in main


@needs_cpp
def test_a_header_each_file_includes_is_included_once(tmp_path):
    """host.cpp and kernels.cu both include <cstdio> and <cuda_runtime.h>, as files written to build alone do."""
    for f in FILES:
        src = f.read_text()
        first = src.index("#include")
        (tmp_path / f.name).write_text(src[:first] + "#include <cstdio>\n#include <cuda_runtime.h>\n" + src[first:])
    seed = (create_workload("w", [tmp_path / f.name for f in FILES], tmp_path).root / "seed.cu").read_text()
    includes = [ln for ln in seed.splitlines() if ln.startswith("#include")]
    assert len(includes) == len(set(includes)) and {"#include <cstdio>", "#include <cuda_runtime.h>"} <= set(includes)


def _edited(tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> list[Path]:
    """The example's three files with each file's (old, new) edits made, every one of them found."""
    out = []
    for f in FILES:
        src = f.read_text()
        for old, new in edits.get(f.name, []):
            assert old in src, f"the edit's text is not in {f.name}: {old!r}"
            src = src.replace(old, new)
        (tmp_path / f.name).write_text(src)
        out.append(tmp_path / f.name)
    return out


LOOP = "  for (int it = 0; it < iters; ++it) {\n"


@needs_cpp
@pytest.mark.nvcc
def test_a_block_scope_a_type_of_main_s_own_and_a_declared_template_convert_and_build(tmp_path):
    """The timed loop inside a bare block (`{ ... }` scoping objects before MPI_Finalize), the buffers declared with
    a type main() names itself (`using T = bf16;`), and a kernel calling a device template declared before its
    specialisations: converted, and the seed builds."""
    files = _edited(tmp_path, {
        "host.cpp": [("  for (int i = 0; i < WARMUP", "  {\n  for (int i = 0; i < WARMUP"),
                     ("    RANGE_POP()\n  }\n", "    RANGE_POP()\n  }\n  }\n"),
                     ("  bf16 *d_x, *d_w1", "  using T = bf16;\n  T *d_x, *d_w1")],
        "kernels.cu": [("__global__ void bias_gelu_kernel", "template <typename V> __device__ float to_f(V v);\n"
                        "template <> __device__ float to_f<bf16>(bf16 v) { return __bfloat162float(v); }\n\n"
                        "__global__ void bias_gelu_kernel"),
                       ("float v = __bfloat162float(h[i])", "float v = to_f(h[i])")]})
    made = create_workload("w", files, tmp_path)
    seed = (made.root / "seed.cu").read_text()
    timed = next(i for i, ln in enumerate(files[0].read_text().splitlines(), 1) if ln == LOOP.rstrip("\n"))
    assert f"cuco_run is one iteration of the loop at host.cpp:{timed} of main()" in " ".join(
        ln.removeprefix("// ") for ln in seed.splitlines()[:5])
    assert "using T = bf16;  // main()'s own, host.cpp:" in seed
    assert "template <typename V> __device__ float to_f(V v);" in seed
    assert load_workload(made.root).buffers["x"].dtype == "bf16"  # T, then bf16, is __nv_bfloat16
    from cuco.runner.build.cuda_checks import check_and_build

    built, problems = check_and_build(made.root / "seed.cu")
    assert built.ok and not problems, (problems, built.log[-2000:])


@needs_cpp
def test_a_captured_region_is_cited_by_its_own_file_s_lines(tmp_path):
    """The step captured into a CUDA graph once and replayed in the loop: the seed names the region by host.cpp's
    lines (the files are joined with the headers first, so the lines as read are others)."""
    host = FILES[0].read_text()
    warmup = host.index("  for (int i = 0; i < WARMUP; ++i) {")
    timed, end = host.index(LOOP), host.index("    RANGE_POP()\n  }\n") + len("    RANGE_POP()\n  }\n")
    step = host[host.index("    gemm_bf16", timed):host.index("    RANGE_POP()")]
    graph = ("  cudaGraph_t graph;\n  cudaGraphExec_t exec;\n"
             "  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));\n" + step +
             "  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));\n"
             "  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));\n" +
             LOOP + "    CUDA_CHECK(cudaGraphLaunch(exec, stream));\n  }\n")
    (tmp_path / "host.cpp").write_text(host[:warmup] + host[host.index("  cudaEvent_t start", warmup):timed] + graph +
                                       host[end:])
    for f in FILES[1:]:
        shutil.copy(f, tmp_path / f.name)
    files = [tmp_path / f.name for f in FILES]
    seed = (create_workload("w", files, tmp_path).root / "seed.cu").read_text()
    lines = files[0].read_text().splitlines()
    first = next(i for i, ln in enumerate(lines, 1) if "cudaStreamBeginCapture" in ln)
    last = next(i for i, ln in enumerate(lines, 1) if "cudaStreamEndCapture" in ln)
    head = " ".join(ln.removeprefix("// ") for ln in seed.splitlines()[:5])
    assert f"captured into a CUDA graph at host.cpp:{first}-{last} of main()" in head, head


def test_a_template_launcher_called_with_its_arguments_is_written_out(tmp_path):
    """`launch<__nv_bfloat16>(...)`, a launcher templated on its element type: written out with T as the call's
    type, its kernel launch among them, and the seed keeps no copy of the template it no longer calls."""
    host = tmp_path / "main.cu"
    host.write_text(
        "#include <cuda_bf16.h>\n#include <nccl.h>\n"
        "template <typename T> __global__ void scale(T* x, int n) { }\n"
        "template <typename T> void launch(T* x, int n, cudaStream_t s) { scale<T><<<n / 256, 256, 0, s>>>(x, n); }\n"
        "template void launch<__nv_bfloat16>(__nv_bfloat16*, int, cudaStream_t);\n"
        "int main(int argc, char** argv) {\n  const int n = argc > 1 ? atoi(argv[1]) : 4096;\n"
        "  ncclUniqueId id; ncclGetUniqueId(&id);\n  ncclComm_t comm; ncclCommInitRank(&comm, 1, id, 0);\n"
        "  cudaStream_t st; cudaStreamCreate(&st);\n  __nv_bfloat16* d; cudaMalloc(&d, n * sizeof(__nv_bfloat16));\n"
        "  for (int i = 0; i < 3; ++i) {\n    launch<__nv_bfloat16>(d, n, st);\n"
        "    ncclAllReduce(d, d, n, ncclBfloat16, ncclSum, comm, st);\n  }\n}\n")
    seed = (create_workload("w", host, tmp_path).root / "seed.cu").read_text()
    assert "scale<__nv_bfloat16><<<n / 256, 256, 0, st>>>(d, n);" in seed.replace("stream", "st")
    assert "void launch(" not in seed and "template void launch" not in seed


@needs_cpp
def test_the_defines_a_program_is_read_with_are_said_and_a_missing_include_folder_refused(tmp_path):
    made = create_workload("mlp", FILES, tmp_path, defines=["USE_NVTX"])
    assert "read with -D USE_NVTX" in " ".join(made.reading)
    assert "read with -D USE_NVTX, so this is that build of it" in " ".join(
        ln.removeprefix("// ") for ln in (made.root / "seed.cu").read_text().splitlines()[:5])
    with pytest.raises(CucoError, match=r"^--include-dir: .*nowhere: no such folder"):
        create_workload("w", FILES, tmp_path, include_dirs=[tmp_path / "nowhere"])
