"""`cuco init NAME --from PROGRAM.cu`: a workload scaffolded around a host-driven program loads as it is, finds
what the hand-written workloads of the shipped seeds say, and stubs reference.py; bad input is one line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WORKLOADS

from cuco.errors import CucoError
from cuco.workload.scaffold import create_workload
from cuco.workload.expr import eval_expr
from cuco.workload.spec import load_workload

# A program outside the candidate ABI: host buffers copied in, a kernel, an all-reduce, the result copied out.
PLAIN = """\
#include <cuda_runtime.h>
#include <nccl.h>
#include <vector>

__global__ void scale(float* x, const float* w, size_t n) {
  size_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= w[i];
}

int main() {
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
                     ("compute_alone", ({}, 2, 0, [], {}, None)), ("comm_alone", ({}, 2, 0, [], {}, None))):
        with pytest.raises(NotImplementedError, match=fn):
            getattr(ref, fn)(*args)
    assert '"a": shape (p["M"] // world, p["K"]), torch.bfloat16' in ref.make_inputs.__doc__
    assert '"c": shape (p["M"], p["N"] // world), torch.bfloat16' in ref.reference.__doc__
    assert "ncclAllGather (a -> a_gathered)" in ref.reference.__doc__
    assert "dist.all_gather_into_tensor(out, bufs['a'], group=group)" in ref.comm_alone.__doc__


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
    assert roles == {"d_x": ("input", "f32", ("count",), True), "d_w": ("input", "f32", ("count",), False),
                     "d_y": ("output", "f32", ("count",), True)}
    assert spec.shapes[0].params == {"count": 1 << 20}  # the program's own size
    assert spec.tolerance.rtol == 1e-4
    assert any("no cuco_run()" in w for w in made.warnings)
    assert "scale (line 21) also writes it" in (made.root / "workload.toml").read_text()


def test_cli_creates_the_directory_and_refuses_to_overwrite_it(tmp_path):
    seed = str(WORKLOADS / "allreduce_sum" / "seed.cu")
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
    ("__global__ void k(float* x) { x[0] = 1.0f; }\n", "no NCCL call found"),
    (None, "no such file"),
])
def test_cli_program_it_cannot_wrap_is_one_line(tmp_path, text, words):
    if text is not None:
        (tmp_path / "p.cu").write_text(text)
    assert words in _one_error_line(_cuco("init", "w", "--from", "p.cu", cwd=tmp_path))
    assert not (tmp_path / "w").exists()


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
