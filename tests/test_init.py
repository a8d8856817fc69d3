"""`cuco init NAME --from PROGRAM.cu`: a workload scaffolded around a host-driven program loads as it is, finds
what the hand-written workloads of the shipped seeds say, and stubs reference.py; bad input is one line."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ROOT, WORKLOADS

from cuco.errors import CucoError
from cuco.scaffold import create_workload
from cuco.workload.check import check_workload
from cuco.workload.contract import RankView
from cuco.workload.expr import ExprError, eval_expr
from cuco.workload.spec import WorkloadSpec, load_workload

PROGRAMS = Path(__file__).parent / "init_programs"
SEEDS = sorted(p.parent.name for p in WORKLOADS.glob("*/seed.cu"))

# A program outside the candidate ABI: host buffers copied in, a kernel, an all-reduce, the result copied out.
PLAIN = """\
#include <cuda_runtime.h>
#include <nccl.h>
#include <vector>

__global__ void scale(float* x, const float* w, size_t n) {
  size_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= w[i];
}

int step() {
  const size_t count = 1 << 20;
  float *d_x, *d_w, *d_y;
  cudaMalloc(&d_x, count * sizeof(float));
  cudaMalloc(&d_w, count * sizeof(float));
  cudaMalloc(&d_y, count * sizeof(float));
  std::vector<float> h(count, 1.0f);
  cudaMemcpy(d_x, h.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(d_w, h.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  ncclComm_t comm;
  cudaStream_t stream;
  scale<<<(count + 255) / 256, 256, 0, stream>>>(d_x, d_w, count);
  ncclAllReduce(d_x, d_y, count, ncclFloat, ncclSum, comm, stream);
  cudaMemcpy(h.data(), d_y, count * sizeof(float), cudaMemcpyDeviceToHost);
  return 0;
}
"""

MALFORMED = """\
#include "cuco.h"
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const int64_t n = cuco_param(ctx, "N") +;
  CUCO_NCCL(ctx, ncclAllReduce(x, y, n, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
"""


def _cuco(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "cuco", *args], check=False, capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def _reference(root: Path):
    spec = importlib.util.spec_from_file_location(f"scaffolded_{root.name}", root / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("seed", ["allreduce_sum", "gemm_allgather"])
def test_scaffold_of_a_shipped_seed_finds_its_workloads_buffers(tmp_path, seed):
    made = create_workload(seed, WORKLOADS / seed / "seed.cu", tmp_path)
    got, want = load_workload(made.root), load_workload(WORKLOADS / seed)
    assert (made.root / "seed.cu").read_bytes() == (WORKLOADS / seed / "seed.cu").read_bytes()
    assert got.params == want.params and got.name == seed and got.baselines == ["seed"]
    assert {n: (b.role, b.dtype, tuple(b.shape)) for n, b in got.buffers.items()} == \
           {n: (b.role, b.dtype, tuple(b.shape)) for n, b in want.buffers.items()}
    # symmetric wherever a collective touches the buffer: every one the shipped workload has symmetric among them
    assert {n for n, b in want.buffers.items() if b.symmetric} <= {n for n, b in got.buffers.items() if b.symmetric}
    assert got.bounds.flops == want.bounds.flops
    env = {**want.shapes[0].params, "world": 2}
    assert eval_expr(got.bounds.comm_bytes, env) == eval_expr(want.bounds.comm_bytes, env)
    assert made.warnings == []


def test_gemm_allgather_scaffold_sizes_bounds_and_tolerance(tmp_path):
    made = create_workload("ag", WORKLOADS / "gemm_allgather" / "seed.cu", tmp_path)
    spec = load_workload(made.root)
    env = {"M": 4096, "K": 4096, "N": 4096, "world": 2}
    from cuco.workload.expr import eval_expr

    assert eval_expr(spec.bounds.comm_bytes, env) == 4096 // 2 * 4096 * 2  # the other rank's shard of A, in bf16
    assert spec.tolerance.rtol == 0.02 and spec.tolerance.determinism == "bitwise"
    assert spec.timing.trials == 2 and spec.small_shapes[0].params == {"M": 64, "K": 64, "N": 64}
    text = (made.root / "workload.toml").read_text()
    assert "description = \"TODO" in text and "world_size = 2  # TODO" in text
    assert all("# TODO" in line for line in text.splitlines() if line.startswith(("M = ", "K = ", "N = ")))
    # written out, not left to the loader's defaults (which equal them): the user sees what to change
    assert "[tolerance]\n" in text and "rtol = 0.02\n" in text and "[timing]\n" in text and "\ntrials = 2" in text


def test_reference_stubs_say_what_to_write_and_raise_until_written(tmp_path):
    made = create_workload("ag", WORKLOADS / "gemm_allgather" / "seed.cu", tmp_path)
    ref = _reference(made.root)
    for fn, args in (("make_inputs", ({}, 2, 0, None, "cpu")), ("reference", ({}, 2, 0, [])),
                     ("comm_alone", (RankView({}, 2, 0, []),))):
        with pytest.raises(NotImplementedError, match=fn):
            getattr(ref, fn)(*args)
    # the bound's compute half is the program's GEMM, written from its call: c = a_gathered @ b
    p = {"M": 4, "K": 6, "N": 10}
    bufs = {"a_gathered": torch.randn(4, 6), "b": torch.randn(6, 5), "c": torch.zeros(4, 5)}
    ref.compute_alone(RankView(p, 2, 0, [], bufs))()
    assert torch.allclose(bufs["c"], bufs["a_gathered"] @ bufs["b"])
    assert '"a": shape (p["M"] // world, p["K"]), torch.bfloat16' in ref.make_inputs.__doc__
    assert ('"c": shape (p["M"], p["N"] // world), torch.float64 or torch.float32 (the program writes '
            'torch.bfloat16)') in ref.reference.__doc__
    assert "ncclAllGather (a -> a_gathered)" in ref.reference.__doc__
    assert "dist.all_gather_into_tensor(out, view.bufs['a'], group=view.group)" in ref.comm_alone.__doc__


def test_communication_only_program_has_no_compute_stub(tmp_path):
    made = create_workload("ar", WORKLOADS / "allreduce_sum" / "seed.cu", tmp_path)
    ref = _reference(made.root)
    assert not hasattr(ref, "compute_alone") and "dist.all_reduce(out, op=dist.ReduceOp.SUM" in ref.comm_alone.__doc__


def test_plain_program_roles_from_host_copies(tmp_path):
    program = tmp_path / "prog.cu"
    program.write_text(PLAIN)
    made = create_workload("plain", program, tmp_path)
    spec = load_workload(made.root)
    roles = {n: (b.role, b.dtype, tuple(b.shape), b.symmetric) for n, b in spec.buffers.items()}
    assert roles == {"d_x": ("inout", "f32", ("count",), True), "d_w": ("input", "f32", ("count",), False),
                     "d_y": ("output", "f32", ("count",), True)}  # d_x scaled in place, then all-reduced
    assert spec.shapes[0].params == {"count": 1 << 20}  # the program's own size
    assert spec.tolerance.rtol == 1e-4
    assert any("no cuco_run()" in w for w in made.warnings)
    assert "then written by scale (line 21): updated in place" in (made.root / "workload.toml").read_text()


def test_cli_creates_the_directory_and_refuses_to_overwrite_it(tmp_path):
    seed = str(WORKLOADS / "allreduce_sum" / "seed.cu")
    (tmp_path / "broken.cu").write_text(MALFORMED)
    assert _cuco("init", "w", "--from", "broken.cu", "--dir", "new/ws", cwd=tmp_path).returncode == 2
    assert not (tmp_path / "new").exists()  # a refused program leaves nothing behind, --dir's parents included
    made = _cuco("init", "mine", "--from", seed, "--dir", "new/ws", cwd=tmp_path)  # --dir made with its parents
    assert made.returncode == 0 and (tmp_path / "new" / "ws" / "mine" / "seed.cu").is_file(), made.stderr
    first = _cuco("init", "mine", "--from", seed, "--dir", str(tmp_path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["reference.py", "seed.cu", "workload.toml"]
    before = (tmp_path / "mine" / "workload.toml").read_text()
    line = _one_error_line(_cuco("init", "mine", "--from", seed, "--dir", str(tmp_path), cwd=tmp_path))
    assert "already exists" in line and "mine" in line
    assert (tmp_path / "mine" / "workload.toml").read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_cli_malformed_program_names_file_and_line(tmp_path):
    (tmp_path / "broken.cu").write_text(MALFORMED)
    line = _one_error_line(_cuco("init", "w", "--from", "broken.cu", cwd=tmp_path))
    assert "broken.cu:3: cannot parse as CUDA C++" in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("text,words", [
    ("__global__ void k(float* x) { x[0] = 1.0f; }\n", "p.cu: no NCCL call, no main() and no cuco_run(): cuco init "
                                                       "takes a program whose ranks communicate with NCCL from the "
                                                       "host, its own main() with every file it needs"),
    (None, "no such file"),
])
def test_cli_program_it_cannot_wrap_is_one_line(tmp_path, text, words):
    if text is not None:
        (tmp_path / "p.cu").write_text(text)
    line = _one_error_line(_cuco("init", "w", "--from", "p.cu", cwd=tmp_path))
    assert words in line and "transform" not in line, line
    assert not (tmp_path / "w").exists()


def test_cli_says_a_scaffold_without_cuco_run_needs_it_first(tmp_path):
    """A step function without main() or cuco_run() is scaffolded from its analysis; the next step named is to
    write the entry points, which cuco check refuses the seed without."""
    (tmp_path / "prog.cu").write_text(PLAIN)
    proc = _cuco("init", "w", "--from", "prog.cu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    nxt = " ".join(proc.stdout.split()).split("next: ")[1]
    assert nxt.startswith("write seed.cu's cuco_setup, cuco_run and cuco_teardown around the program's work"), nxt
    narrow = subprocess.run([sys.executable, "-m", "cuco", "init", "v", "--from", "prog.cu"], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "60", "NO_COLOR": "1"}, timeout=120)
    line = next(ln for ln in narrow.stdout.splitlines() if ln.startswith("next: "))
    assert line.endswith(f"cuco eval {tmp_path / 'v'} seed"), narrow.stdout  # one line, to paste on a narrow terminal


def test_bad_names_are_refused(tmp_path):
    for name in ("a/b", "..", ""):
        with pytest.raises(CucoError, match="workload name"):
            create_workload(name, WORKLOADS / "allreduce_sum" / "seed.cu", tmp_path)


def test_without_the_fastpath_extra_init_names_it(tmp_path):
    code = ("import sys\nsys.modules['tree_sitter'] = None\nfrom cuco.cli import main\n"
            "sys.argv = ['cuco'] + sys.argv[1:]\nmain()\n")
    seed = str(WORKLOADS / "allreduce_sum" / "seed.cu")
    proc = subprocess.run([sys.executable, "-c", code, "init", "w", "--from", seed], check=False, capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert 'tree-sitter is not installed: pip install "cuco-codesign[fastpath]"' in _one_error_line(proc)
    assert not (tmp_path / "w").exists()


# ---- what init reads from user programs and the shipped seeds --------------------------------------------------

@dataclass
class Want:
    """What a careful human writes in workload.toml for a program, and the keys init leaves marked TODO by design
    (what the code does not show): exactly those, so that a misread fixed stays fixed."""

    params: list[str]
    buffers: dict[str, tuple[str, str, list[str], bool]]  # role, dtype, shape, symmetric
    flops: str
    comm_bytes: str
    todo: set[str]


WANT = {
    # cublasGemmEx on bf16 operands (casts, static_cast, CUDA_R_16BF) into fp32, then an in-place fp32 all-reduce
    "tp_row_linear": Want(
        ["M", "K", "N"],
        {"x": ("input", "bf16", ["M", "K / world"], False), "w": ("parameter", "bf16", ["K / world", "N"], False),
         "y": ("output", "f32", ["M", "N"], True)},
        "2 * M * (K / world) * N", "2 * (world - 1) * M * N * 4 / world",
        {"buffers.x.role", "buffers.w.role"}),  # both only read by the GEMM: either could be the weights
    # an all-gather, then an RMSNorm kernel: gamma's f32 from the kernel's `const float*`, y written by the kernel
    "sp_allgather_rmsnorm": Want(
        ["T", "H"],
        {"x": ("input", "bf16", ["T / world", "H"], True), "x_full": ("scratch", "bf16", ["T", "H"], True),
         "gamma": ("input", "f32", ["H"], False), "y": ("output", "bf16", ["T", "H"], False)},
        "4 * T * H", "(world - 1) * (T / world) * H * 2",
        {"params", "buffers.gamma.shape", "buffers.y.shape", "bounds.flops"}),
    # a reduce-scatter into the program's own staging, then a kernel that writes two outputs
    "zero_sgd_reducescatter": Want(
        ["N"],
        {"grad": ("input", "f32", ["N"], True), "param": ("input", "f32", ["N / world"], False),
         "momentum": ("input", "f32", ["N / world"], False), "new_param": ("output", "f32", ["N / world"], False),
         "new_momentum": ("output", "f32", ["N / world"], False)},
        "4 * (N / world)", "(world - 1) * (N / world) * 4",
        {"params", "buffers.param.shape", "buffers.momentum.shape", "buffers.new_param.shape",
         "buffers.new_momentum.shape", "bounds.flops"}),
    # C names (n, hq, dh, tokens, mine) other than the parameters they hold (SEQ, HEADS, HEAD_DIM), through the
    # fields of the program's state; a pack kernel, an all-to-all, a strided batched GEMM per head
    "ulysses_head_projection": Want(
        ["SEQ", "HEADS", "HEAD_DIM"],
        {"q": ("input", "bf16", ["SEQ / world", "HEADS", "HEAD_DIM"], False),
         "q_packed": ("scratch", "bf16", ["SEQ", "HEADS / world", "HEAD_DIM"], True),
         "q_heads": ("scratch", "bf16", ["SEQ", "HEADS / world", "HEAD_DIM"], True),
         "w": ("parameter", "bf16", ["HEADS / world", "HEAD_DIM", "HEAD_DIM"], False),
         "out": ("output", "bf16", ["SEQ", "HEADS / world", "HEAD_DIM"], False)},
        "2 * SEQ * (HEADS / world) * HEAD_DIM * HEAD_DIM",
        "(world - 1) * (SEQ / world) * (HEADS / world) * HEAD_DIM * 2",
        {"params", "buffers.q.shape", "buffers.out.shape", "buffers.w.role", "bounds.flops"}),
    # cublasLtMatmul with its matrix layouts made in setup
    "lt_allgather_gemm": Want(
        ["M", "K", "N"],
        {"a": ("input", "bf16", ["M / world", "K"], True), "a_full": ("scratch", "bf16", ["M", "K"], True),
         "b": ("parameter", "bf16", ["K", "N / world"], False), "c": ("output", "bf16", ["M", "N / world"], False)},
        "2 * M * K * (N / world)", "(world - 1) * (M / world) * K * 2", {"buffers.b.role"}),
}


def _todo_keys(text: str) -> set[str]:
    """`table.key` of every line of workload.toml marked TODO (`params`, `buffers.x.shape`, `bounds.flops`)."""
    table, keys = "", set()
    for line in text.splitlines():
        header = re.fullmatch(r"\[+([^\]]+)\]+\s*(#.*)?", line.strip())
        if header:
            table = header.group(1).replace('"', "")
        elif "=" in line and not line.lstrip().startswith("#") and "# TODO" in line and "shapes" not in table:
            key = line.split("=", 1)[0].strip()
            keys.add(f"{table}.{key}" if table else key)
    return keys


def _envs(params: list[str], world: int) -> list[dict[str, int]]:
    sizes = (96, 160, 224, 288, 352, 416, 480)
    return [{**{p: sizes[(i + k) % len(sizes)] for i, p in enumerate(params)}, "world": world} for k in (0, 3)]


def _agree(got: list[str] | str, want: list[str] | str, envs: list[dict[str, int]]) -> bool:
    got, want = ([got], [want]) if isinstance(got, str) else (list(got), list(want))
    if len(got) != len(want):
        return False
    try:
        return all(eval_expr(g, env) == eval_expr(w, env) for env in envs for g, w in zip(got, want))
    except ExprError:
        return False


def _read_params(program: Path) -> set[str]:
    return set(re.findall(r'cuco_param\(\s*ctx\s*,\s*"(\w+)"\s*\)', program.read_text()))


def _misreads(root: Path, want: Want, envs: list[dict[str, int]], program: Path, exact_symmetric: bool) -> list[str]:
    """The values init wrote that differ from a careful human's and are not marked TODO."""
    got, todo = load_workload(root), _todo_keys((root / "workload.toml").read_text())
    read = _read_params(program)
    wrong = [f"params {sorted(read - set(got.params))} read by the program but missing"] if read - set(got.params) \
        else []
    if set(got.params) - set(want.params) and "params" not in todo:
        wrong.append(f"params {sorted(set(got.params) - set(want.params))} unmarked")
    for name, b in got.buffers.items():
        if name not in want.buffers:
            wrong.append(f"buffer {name!r} is no buffer of the program")
            continue
        role, dtype, shape, symmetric = want.buffers[name]
        for key, ok in (("role", b.role == role), ("dtype", b.dtype == dtype), ("shape", _agree(b.shape, shape, envs))):
            if not ok and f"buffers.{name}.{key}" not in todo:
                wrong.append(f"buffers.{name}.{key} = {getattr(b, key)!r}, not {locals()[key]!r}")
        if symmetric != b.symmetric and (exact_symmetric or symmetric) and f"buffers.{name}.symmetric" not in todo:
            wrong.append(f"buffers.{name}.symmetric = {b.symmetric}")
    for key in ("flops", "comm_bytes"):
        if not _agree(getattr(got.bounds, key), getattr(want, key), envs) and f"bounds.{key}" not in todo:
            wrong.append(f"bounds.{key} = {getattr(got.bounds, key)!r}, not {getattr(want, key)!r}")
    return wrong


@pytest.mark.parametrize("program", sorted(WANT))
def test_user_programs_read_as_a_careful_human_writes_them(tmp_path, program):
    want, source = WANT[program], PROGRAMS / f"{program}.cu"
    made = create_workload(program, source, tmp_path)
    got = load_workload(made.root)
    assert _misreads(made.root, want, _envs(want.params, got.world_size), source, exact_symmetric=True) == []
    assert set(got.buffers) == set(want.buffers)
    not_shared = {f"buffers.{n}.symmetric" for n, b in want.buffers.items() if not b[3]}
    todo = _todo_keys((made.root / "workload.toml").read_text())
    assert todo - {"description", "world_size", "bounds.hbm_bytes"} - not_shared == want.todo
    # hbm_bytes is the inputs' and outputs' declared bytes: a guess exactly where one of theirs is
    guessed = any(f"buffers.{n}.{k}" in todo for n, b in want.buffers.items()
                  if b[0] in ("input", "parameter", "output") for k in ("role", "dtype", "shape"))
    assert ("bounds.hbm_bytes" in todo) == guessed
    assert made.warnings == []


def _hand_written(spec: WorkloadSpec) -> Want:
    buffers = {n: (b.role, b.dtype, [str(d) for d in b.shape], b.symmetric) for n, b in spec.buffers.items()}
    return Want(list(spec.params), buffers, spec.bounds.flops, spec.bounds.comm_bytes, set())


@pytest.mark.parametrize("seed", SEEDS)
def test_every_value_init_writes_for_a_shipped_seed_is_its_workloads_or_marked(tmp_path, seed):
    """Against the hand-written workload.toml, at its own shapes: a collective's buffers are symmetric in the
    scaffold whether or not the hand-written file needs them to be."""
    made = create_workload(seed, WORKLOADS / seed / "seed.cu", tmp_path)
    hand = load_workload(WORKLOADS / seed)
    envs = [s.env(hand.world_size) for s in hand.shapes + hand.small_shapes]
    assert _misreads(made.root, _hand_written(hand), envs, WORKLOADS / seed / "seed.cu", exact_symmetric=False) == []


def test_parameters_are_the_strings_the_program_reads_not_its_c_names(tmp_path):
    """`n{...}`, `size_t(n)`, `n = ...` later, a field of the program's state set in setup, a global set in setup: the
    workload parameter is the cuco_param string; a name the rules cannot follow is a placeholder, marked."""
    program = tmp_path / "names.cu"
    program.write_text('''#include "cuco.h"
struct S { int64_t count; };
static int64_t g_cols;
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  S* s = new S();
  ctx->state = s;
  const int64_t n = cuco_param(ctx, "N");
  s->count = n;
  g_cols = cuco_param(ctx, "C");
  return 0;
}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  S* s = (S*)ctx->state;
  float* a = (float*)cuco_buffer(ctx, "a")->ptr;
  float* b = (float*)cuco_buffer(ctx, "b")->ptr;
  float* c = (float*)cuco_buffer(ctx, "c")->ptr;
  float* d = (float*)cuco_buffer(ctx, "d")->ptr;
  const int64_t rows{cuco_param(ctx, "R")};
  int64_t later;
  later = cuco_param(ctx, "L");
  const int64_t picked = cuco_param(ctx, "P") > 0 ? cuco_param(ctx, "P") : 1;
  CUCO_NCCL(ctx, ncclAllReduce(a, a, size_t(s->count), ncclFloat, ncclSum, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclAllReduce(b, b, rows * g_cols, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclAllReduce(c, c, later, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclAllReduce(d, d, picked, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
''')
    made = create_workload("names", program, tmp_path)
    spec, todo = load_workload(made.root), _todo_keys((made.root / "workload.toml").read_text())
    assert {n: list(b.shape) for n, b in spec.buffers.items() if n != "d"} == \
           {"a": ["N"], "b": ["R", "C"], "c": ["L"]}
    assert set(spec.params) == {"N", "C", "R", "L", "P", "picked"} and "params" in todo
    assert spec.buffers["d"].shape == ("picked",) and "buffers.d.shape" in todo
    assert "bounds.comm_bytes" in todo  # the last all-reduce's count is not a size the program is given


def test_comm_alone_names_only_workload_buffers(tmp_path):
    """The reduce-scatter writes the program's own staging: the stub sizes a receive tensor from the send buffer."""
    for source in [PROGRAMS / f"{p}.cu" for p in WANT] + [WORKLOADS / s / "seed.cu" for s in SEEDS]:
        made = create_workload(f"{source.parent.name}_{source.stem}", source, tmp_path)
        doc = _reference(made.root).comm_alone.__doc__
        assert set(re.findall(r"view\.bufs\['([^']+)'\]", doc)) <= set(load_workload(made.root).buffers), source
    doc = _reference(tmp_path / "init_programs_zero_sgd_reducescatter").comm_alone.__doc__
    assert "out = torch.empty(view.bufs['grad'].numel() // view.world, dtype=view.bufs['grad'].dtype" in doc
    assert "dist.reduce_scatter_tensor(out, view.bufs['grad'], op=dist.ReduceOp.SUM, group=view.group)" in doc


def test_kernel_outputs_are_read_from_the_kernel_body(tmp_path):
    """A store through a non-const pointer parameter writes; a load, or a const parameter, reads; a pointer handed
    to a call the rules do not follow is assumed both, and the role resting on it is marked."""
    program = tmp_path / "k.cu"
    program.write_text('''#include "cuco.h"
__device__ void helper(float* p, int64_t i);
__global__ void k(const float* in, float* out, float* acc, float* odd, float* through, int64_t n) {
  int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float* row = out + i;
  row[0] = in[i];
  atomicAdd(&acc[0], in[i]);
  reinterpret_cast<float2*>(odd)[i].x = 1.0f;
  helper(through, i);
}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const int64_t n = cuco_param(ctx, "N");
  float* in = (float*)cuco_buffer(ctx, "in")->ptr;
  float* out = (float*)cuco_buffer(ctx, "out")->ptr;
  float* acc = (float*)cuco_buffer(ctx, "acc")->ptr;
  float* odd = (float*)cuco_buffer(ctx, "odd")->ptr;
  float* through = (float*)cuco_buffer(ctx, "through")->ptr;
  CUCO_NCCL(ctx, ncclAllReduce(in, in, n, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  k<<<1, 1, 0, ctx->stream>>>(in, out, acc, odd, through, n);
  return 0;
}
''')
    made = create_workload("k", program, tmp_path)
    spec, todo = load_workload(made.root), _todo_keys((made.root / "workload.toml").read_text())
    # in: all-reduced in place, then read; acc: accumulated into (atomics read and write): both updated in place
    assert {n: b.role for n, b in spec.buffers.items()} == {"in": "inout", "out": "output", "acc": "inout",
                                                            "odd": "output", "through": "input"}
    assert "buffers.out.role" not in todo and "buffers.odd.role" not in todo and "buffers.acc.role" not in todo
    assert "buffers.through.role" in todo  # passed on to helper(): read and written are assumed
    assert "tolerance.determinism" in todo  # atomicAdd: the order of the sums varies run to run


def test_integer_atomics_are_exact_in_any_order(tmp_path):
    """A histogram counted with atomicAdd into an int*: the same bits whatever the order of the updates, so no
    determinism TODO, where atomics into a float* get one."""
    program = tmp_path / "h.cu"
    program.write_text('''#include "cuco.h"
__global__ void count(const float* x, int* hist, int64_t n) {
  int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&hist[x[i] > 0.0f], 1);
}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const int64_t n = cuco_param(ctx, "N");
  float* x = (float*)cuco_buffer(ctx, "x")->ptr;
  int* hist = (int*)cuco_buffer(ctx, "hist")->ptr;
  CUCO_CUDA(ctx, cudaMemsetAsync(hist, 0, 2 * sizeof(int), ctx->stream));
  count<<<1, 256, 0, ctx->stream>>>(x, hist, n);
  CUCO_NCCL(ctx, ncclAllReduce(hist, hist, 2, ncclInt32, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
''')
    made = create_workload("h", program, tmp_path)
    assert "tolerance.determinism" not in _todo_keys((made.root / "workload.toml").read_text())
    assert "cudaMemsetAsync (fills hist)" in (made.root / "reference.py").read_text()  # the step, as listed


def test_a_pointer_cast_to_const_under_parentheses_is_only_read(tmp_path):
    """`((const float*)x)` passed to a function defined elsewhere: the call only reads x, as `(const float*)x`
    does; y, passed as it is, is assumed read and written, and its role is marked."""
    program = tmp_path / "ext.cu"
    program.write_text('''#include "cuco.h"
void external(const float* in, float* out, int64_t n);
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const int64_t n = cuco_param(ctx, "N");
  float* x = (float*)cuco_buffer(ctx, "x")->ptr;
  float* y = (float*)cuco_buffer(ctx, "y")->ptr;
  external(((const float*)x), y, n);
  CUCO_NCCL(ctx, ncclAllReduce(y, y, n, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
''')
    made = create_workload("ext", program, tmp_path)
    spec, todo = load_workload(made.root), _todo_keys((made.root / "workload.toml").read_text())
    assert spec.buffers["x"].role == "input" and "buffers.x.role" not in todo
    assert "buffers.y.role" in todo


def test_a_scaffold_is_checked_without_a_gpu_and_its_stubs_say_so(tmp_path):
    made = create_workload("tp", PROGRAMS / "tp_row_linear.cu", tmp_path)
    problems = check_workload(made.root)
    assert len(problems) == 1 and "make_inputs" in problems[0] and "NotImplementedError" in problems[0]
    assert problems[0].startswith("reference.py:")


def test_pointers_and_sizes_kept_in_the_programs_state(tmp_path):
    """setup keeps the buffers' pointers and the sizes in a struct; run uses the fields."""
    program = tmp_path / "state.cu"
    program.write_text('''#include <cuda_bf16.h>
#include "cuco.h"
struct St { __nv_bfloat16 *src, *dst; cuco_buffer_t* out; int64_t rows, cols; };
__global__ void copyRows(const __nv_bfloat16* src, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  St* s = (St*)ctx->state;
  copyRows<<<1, 256, 0, ctx->stream>>>(s->src, s->dst, s->rows * s->cols);
  CUCO_NCCL(ctx, ncclAllGather(s->dst, s->out->ptr, s->rows * s->cols, ncclBfloat16, ctx->comm, ctx->stream));
  return 0;
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  St* s = new St();
  ctx->state = s;
  s->src = (__nv_bfloat16*)cuco_buffer(ctx, "src")->ptr;
  s->dst = (__nv_bfloat16*)cuco_buffer(ctx, "dst")->ptr;
  s->out = cuco_buffer(ctx, "gathered");
  s->rows = cuco_param(ctx, "R") / ctx->nRanks;
  s->cols = cuco_param(ctx, "C");
  return 0;
}
''')
    made = create_workload("state", program, tmp_path)
    spec = load_workload(made.root)
    assert {n: (b.role, b.dtype, list(b.shape)) for n, b in spec.buffers.items()} == {
        "src": ("input", "bf16", ["src_len"]), "dst": ("scratch", "bf16", ["R / world", "C"]),
        "gathered": ("output", "bf16", ["R", "C"])}
    assert "buffers.src.shape" in _todo_keys((made.root / "workload.toml").read_text())  # no call shows it


def test_element_types_from_casts_kernel_parameters_and_gemm_types(tmp_path):
    """No sizeof and no NCCL type for a, b, c: their dtypes come from the pointer the program casts to, the kernel
    parameter they are passed to and the GEMM's cudaDataType_t; where two disagree, the line says so."""
    program = tmp_path / "types.cu"
    program.write_text('''#include <cuda_bf16.h>
#include <cublas_v2.h>
#include "cuco.h"
__global__ void scale(const __nv_bfloat16* b, float* out, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = 2.0f * __bfloat162float(b[i]);
}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cublasHandle_t h = (cublasHandle_t)ctx->state;
  const int64_t n = cuco_param(ctx, "N");
  auto* a = (__nv_bfloat16*)cuco_buffer(ctx, "a")->ptr;
  cuco_buffer_t *b = cuco_buffer(ctx, "b"), *c = cuco_buffer(ctx, "c"), *out = cuco_buffer(ctx, "out");
  float* d = static_cast<float*>(cuco_buffer(ctx, "d")->ptr);
  const float alpha = 1.0f, beta = 0.0f;
  scale<<<1, 256, 0, ctx->stream>>>((const __nv_bfloat16*)b->ptr, (float*)out->ptr, n);
  cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &alpha, c->ptr, CUDA_R_16F, (int)n, a,
               CUDA_R_16F, (int)n, &beta, c->ptr, CUDA_R_16F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  CUCO_NCCL(ctx, ncclAllReduce(d, d, n, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
''')
    made = create_workload("types", program, tmp_path)
    spec, text = load_workload(made.root), (made.root / "workload.toml").read_text()
    assert {n: b.dtype for n, b in spec.buffers.items()} == {"a": "f16", "b": "bf16", "c": "f16", "out": "f32",
                                                             "d": "bf16"}
    todo = _todo_keys(text)
    assert {"buffers.a.dtype", "buffers.d.dtype"} <= todo  # a: cast to bf16, f16 to cuBLAS; d: float*, ncclBfloat16
    assert not {"buffers.b.dtype", "buffers.c.dtype", "buffers.out.dtype"} & todo
    assert spec.bounds.flops == "2 * N * N * N"


def test_the_reference_stub_asks_for_the_precision_the_judge_compares_in(tmp_path):
    """reference() returns float64 or float32 whatever the program writes (cuco check holds it to that), and its
    stub says so, the program's own dtype beside it; it never asks for bf16 and a higher precision at once."""
    made = create_workload("scaled_sum", WORKLOADS.parents[1] / "examples" / "tutorial" / "scaled_sum.cu", tmp_path)
    doc = (made.root / "reference.py").read_text().split("def reference(", 1)[1].split('"""')[1]
    assert '"out": shape (p["T"], p["H"]), torch.float64 or torch.float32 (the program writes torch.bfloat16)' in doc
    assert "higher precision" not in doc and ", torch.bfloat16\n" not in doc


ALLREDUCE_SEED = WORKLOADS / "allreduce_sum" / "seed.cu"


def _program_with(tmp_path: Path, old: str, new: str, name: str = "p.cu", encoding: str = "utf-8") -> Path:
    src = ALLREDUCE_SEED.read_text()
    assert old in src, old
    (tmp_path / name).write_bytes(src.replace(old, new).encode(encoding))
    return tmp_path / name


def test_hostile_inputs_get_one_line_each_never_a_traceback(tmp_path):
    """What a fuzzing of init and transform found: an expression thousands of terms long, --dir below a file, a name
    longer than a folder's, --out naming a folder, a file that is not UTF-8."""
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "folder").mkdir()
    deep = _program_with(tmp_path, "CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {",
                         "CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {\n  const int t = 1" + " + 1" * 3000 + ";",
                         "deep.cu")
    latin = _program_with(tmp_path, "CUCO_EXPORT int cuco_run", "// d\u00e9j\u00e0\nCUCO_EXPORT int cuco_run",
                          "latin.cu", "latin-1")
    accented = ALLREDUCE_SEED.read_text().split("CUCO_EXPORT int cuco_run")[0].count("\n") + 1
    cases = [(("init", "w", "--from", str(deep)), f"{deep}:"),
             (("init", "w", "--from", str(ALLREDUCE_SEED), "--dir", "plain.txt/sub"), "cannot make the folder (--dir)"),
             (("init", "n" * 300, "--from", str(ALLREDUCE_SEED)), "a workload name is at most 100"),
             (("transform", str(WORKLOADS / "allreduce_sum"), "--device", "cpu", "--out", "folder"),
              "a folder: --out names the file"),
             (("transform", str(WORKLOADS / "allreduce_sum"), "--explain", "--source", str(latin)),
              f"{latin}:{accented}: not UTF-8 (byte 0xe9)")]
    standalone = tmp_path / "standalone.cu"  # a program with its own main(), read by the conversion
    standalone.write_bytes(b"// d\xe9j\xe0\n" + (ROOT / "examples/standalone/env_gemm_allgather.cu").read_bytes())
    cases += [(("init", "w", "--from", str(standalone)), f"{standalone}:1: not UTF-8 (byte 0xe9)"),
              (("init", "a\nb", "--from", str(ALLREDUCE_SEED)), "error: 'a\\nb': a workload name")]
    for args, words in cases:
        line = _one_error_line(_cuco(*args, cwd=tmp_path))
        assert words in line, (args, line)
    assert "nests more than 200 levels deep" in _one_error_line(_cuco("init", "w", "--from", str(deep), cwd=tmp_path))


def test_a_step_of_many_alike_collectives_sums_them_once(tmp_path):
    """Three hundred alike all-reduces in the step: the bound is their number times one, not a sum of three hundred
    terms (which no reader, nor Python's parser of it, could take)."""
    call = "  CUCO_NCCL(ctx, ncclAllReduce("
    src = ALLREDUCE_SEED.read_text()
    line = src[src.index(call):src.index("\n", src.index(call)) + 1]
    spec = load_workload(create_workload("w", _program_with(tmp_path, line, line * 300), tmp_path).root)
    assert spec.bounds.comm_bytes.startswith("300 * (")
