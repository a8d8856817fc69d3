"""cuco.kernels.combine: the MoE layer's weighted sum of each token's expert outputs, read where they lie.

Without a GPU the kernel runs in Triton's interpreter (fp16 rows, and bf16 through the library's fp32 copies); on a
GPU the same tests run compiled, in bf16.
"""

from __future__ import annotations

import os

import pytest
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated, i.e. at the import below
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from cuco.kernels.combine import BLOCK_H, combine  # noqa: E402

DEVICE = torch.device("cuda" if gpu_count() else "cpu")


def _case(tokens: int, k: int, h: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(tokens * k + 3, h, generator=gen).to(dtype).to(DEVICE)  # rows no pair names, too
    where = torch.randperm(tokens * k + 3, generator=gen)[: tokens * k].to(DEVICE)
    weight = torch.softmax(torch.randn(tokens, k, generator=gen), dim=-1).to(DEVICE)
    return rows, where, weight


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens, k, h", [(5, 8, 96), (1, 1, 8), (3, 3, BLOCK_H + 40)])
def test_combine_is_the_weighted_sum_of_each_tokens_rows(tokens, k, h, dtype):
    rows, where, weight = _case(tokens, k, h, dtype)
    y = torch.full((tokens, h), float("nan"), dtype=dtype, device=DEVICE)
    combine(rows, where, weight, y)
    want = (rows.float()[where].view(tokens, k, h) * weight[..., None]).sum(dim=1)
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2)  # y rounded once, to fp16 or bf16
    again = torch.empty_like(y)
    assert torch.equal(combine(rows, where, weight, again), y)  # bitwise the same every run


@pytest.mark.parametrize("bad", ["where too short", "y too narrow", "rows transposed"])
def test_malformed_operands_are_refused(bad):
    rows, where, weight = _case(4, 2, 16, torch.float16)
    y = torch.empty(4, 16, dtype=torch.float16, device=DEVICE)
    if bad == "where too short":
        where = where[:-1]
    elif bad == "y too narrow":
        y = y[:, :8].contiguous()
    else:
        rows = rows.t()
    with pytest.raises(ValueError, match="combine"):
        combine(rows, where, weight, y)
