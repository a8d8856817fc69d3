"""`check_workload`: a workload's own half of the contract, on the CPU. Every shipped workload passes; a program
naming a buffer or parameter workload.toml lacks, a reference.py that raises, and a make_inputs or reference that
returns other shapes or dtypes than declared are each one line naming the file and line, and nothing raises."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import WORKLOADS

from cuco.workload.check import check_workload

BUILT_IN = sorted(p.parent.name for p in WORKLOADS.glob("*/workload.toml"))

TOML = """\
name = "tiny"
world_size = 2
params = ["N"]

[[shapes]]
name = "full"
N = 1024

[[small_shapes]]
name = "s"
N = 6

[[small_shapes]]
name = "s_odd"
N = 10

[buffers.x]
role = "input"
dtype = "bf16"
shape = ["N"]

[buffers.y]
role = "output"
dtype = "bf16"
shape = ["N / world"]
symmetric = true

[candidates]
seed = "seed.cu"
"""

SEED = """\
#include "cuco.h"
// cuco_buffer(ctx, "in_a_comment") names nothing
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N") / ctx->nRanks;
  CUCO_NCCL(ctx, ncclReduceScatter(x->ptr, y->ptr, n, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  return 0;
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
"""

REFERENCE = """\
import torch


def make_inputs(p, world, rank, gen, device):
    return {"x": torch.randn(p["N"], generator=gen, device=device).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    total = sum(i["x"].double() for i in inputs)
    n = p["N"] // world
    return {"y": total[rank * n:(rank + 1) * n]}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    root = tmp_path / "tiny"
    root.mkdir()
    (root / "workload.toml").write_text(TOML)
    (root / "seed.cu").write_text(SEED)
    (root / "reference.py").write_text(REFERENCE)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_shipped_workload_passes(name):
    assert check_workload(WORKLOADS / name) == []


def test_a_correct_workload_passes(tiny):
    assert check_workload(tiny) == []


def test_a_renamed_buffer_names_the_seed_and_line(tmp_path):
    root = tmp_path / "gemm_allgather"
    shutil.copytree(WORKLOADS / "gemm_allgather", root)
    _edit(root / "seed.cu", 'cuco_buffer(ctx, "a")', 'cuco_buffer(ctx, "a2")')
    line = next(i for i, t in enumerate((root / "seed.cu").read_text().splitlines(), 1) if '"a2"' in t)
    problems = check_workload(root)
    assert len(problems) == 1
    assert problems[0].startswith(f"seed.cu:{line}: cuco_buffer(ctx, 'a2'): workload.toml declares no buffer 'a2'")
    assert "a, a_gathered, b, c" in problems[0]


def test_a_parameter_workload_toml_lacks(tiny):
    _edit(tiny / "seed.cu", 'cuco_param(ctx, "N")', 'cuco_param(ctx, "K")')
    assert check_workload(tiny) == ["seed.cu:5: cuco_param(ctx, 'K'): workload.toml declares no parameter (params) "
                                    "'K' (it has: N)"]


def test_a_candidate_is_checked_instead_of_the_seed(tiny, tmp_path):
    candidate = tmp_path / "mine.cu"
    candidate.write_text(SEED.replace('"y"', '"out"'))
    problems = check_workload(tiny, candidate)
    assert len(problems) == 1 and problems[0].startswith(f"{candidate}:4: cuco_buffer(ctx, 'out')")
    assert check_workload(tiny) == []


def test_a_reference_that_raises_on_import_is_one_line(tiny):
    _edit(tiny / "reference.py", "import torch\n", "import torch\nraise RuntimeError('no such table')\n")
    assert check_workload(tiny) == ["reference.py:2: importing it raised RuntimeError: no such table"]


def test_a_reference_that_does_not_parse_names_its_line(tiny):
    _edit(tiny / "reference.py", "    n = p", "    n = = p")
    [problem] = check_workload(tiny)
    assert problem == f"{tiny / 'reference.py'}:10: invalid Python: invalid syntax"


def test_make_inputs_that_raises_names_its_line(tiny):
    _edit(tiny / "reference.py", '    return {"x"', '    raise KeyError("M")\n    return {"x"')
    assert check_workload(tiny) == ["reference.py:5: make_inputs at small shape 's', rank 0 raised KeyError: 'M'"]


def test_a_reference_that_exits_is_one_line(tiny):
    _edit(tiny / "reference.py", "    total = ", "    raise SystemExit(3)\n    total = ")
    assert check_workload(tiny) == ["reference.py:9: reference at small shape 's', rank 0 raised SystemExit: 3"]


def test_missing_functions(tiny):
    _edit(tiny / "reference.py", "def reference(", "def reference_of(")
    assert check_workload(tiny) == [f"{tiny / 'reference.py'}: defines no reference(p, world, rank, inputs) (the "
                                    f"outputs every candidate is checked against)"]


@pytest.mark.parametrize("old,new,words", [
    ("return {\"y\": total[rank * n:(rank + 1) * n]}", "return {\"y\": total}",
     "reference at small shape 's', rank 0: 'y' has shape (6,); workload.toml declares ['N / world'] = (3,)"),
    ("return {\"y\": total[rank * n:(rank + 1) * n]}", "return {\"y\": total[rank * n:(rank + 1) * n].long()}",
     "'y' is torch.int64; workload.toml declares bf16: a floating-point reference is needed"),
    ("return {\"y\": total[rank * n:(rank + 1) * n]}",
     "return {\"y\": total[rank * n:(rank + 1) * n].to(torch.float8_e4m3fn)}",
     "'y' is torch.float8_e4m3fn, less precise than the bf16 output"),
    ("return {\"y\": total[rank * n:(rank + 1) * n]}", "return {\"z\": total}",
     "reference at small shape 's', rank 0 returned no 'y' (it returned: z)"),
    ("return {\"y\": total[rank * n:(rank + 1) * n]}", "return total",
     "reference at small shape 's', rank 0 returned a Tensor, not a dict of tensors by buffer name"),
    (".to(torch.bfloat16)}", "}", "make_inputs at small shape 's', rank 0: 'x' is torch.float32; "
                                  "workload.toml declares bf16 (torch.bfloat16)"),
    ('torch.randn(p["N"]', 'torch.randn(p["N"] + 1', "'x' has shape (7,); workload.toml declares ['N'] = (6,)"),
])
def test_outputs_and_inputs_of_the_wrong_shape_or_dtype(tiny, old, new, words):
    _edit(tiny / "reference.py", old, new)
    [problem] = check_workload(tiny)
    assert problem.startswith("reference.py: ") and words in problem


def test_only_the_shape_that_fails_is_reported(tiny):
    """At N = 10 the reference slices differently: the odd small shape fails, the even one passes."""
    _edit(tiny / "reference.py", "    n = p[\"N\"] // world", "    n = p[\"N\"] // world if p[\"N\"] != 10 else 4")
    [problem] = check_workload(tiny)
    assert "small shape 's_odd'" in problem and "(4,)" in problem


def test_it_never_raises(tmp_path, tiny):
    assert check_workload(tmp_path / "nowhere")[0].endswith("workload directory does not exist")
    (tiny / "workload.toml").write_text("name = ")
    [problem] = check_workload(tiny)
    assert "workload.toml" in problem and "not valid TOML" in problem
