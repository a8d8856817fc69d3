"""The MoE layer's combine in one pass: y[t] = sum over j of weight[t, j] * rows[where[t * k + j]].

The experts' outputs stay where the grouped GEMM wrote them (sorted by expert, or in the order the exchange
returned them): `where` names each token's k rows, so there is no scatter back to token order, and the weighted sum
is formed in fp32 in registers and rounded to y's dtype once. Torch's version of the same (a scatter, the rows
widened to fp32, a product and a sum) moves about nine times the bytes of the rows; this reads them once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuco.kernels.common import interpreted, row_major

BLOCK_H = 1024  # columns per program: 2 KB of a bf16 row, loads of 16 bytes per thread at 4 warps


@triton.jit
def _combine_kernel(rows, where, weight, y, H, K: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):  # in pick order: the same sum, bit for bit, every run
        r = tl.load(where + t * K + j).to(tl.int64)
        v = tl.load(rows + r * H + cols, mask=inside & (cols + r * H >= 0), other=0.0)  # r < 0: no row
        acc += tl.load(weight + t * K + j).to(tl.float32) * v.to(tl.float32)
    tl.store(y + t * H + cols, acc.to(y.dtype.element_ty), mask=inside)


def combine(rows: torch.Tensor, where: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y[t] = sum_j weight[t, j] * rows[where[t, j]] for y [T, H], weight [T, k], where [T, k] (or [T * k]) row
    indices into rows [R, H] (negative: no row, a term of 0)."""
    row_major("combine", rows=rows, y=y)
    tokens, k = weight.shape
    if where.numel() != tokens * k or rows.shape[1] != y.shape[1] or y.shape[0] != tokens:
        raise ValueError(f"combine: shapes do not match: rows {tuple(rows.shape)}, where {tuple(where.shape)}, "
                         f"weight {tuple(weight.shape)}, y {tuple(y.shape)}")
    if tokens == 0:
        return y
    where, weight = where.contiguous().view(-1), weight.contiguous()
    if interpreted() and torch.bfloat16 in (rows.dtype, y.dtype):
        # Triton's interpreter misreads bf16; fp32 copies hold the same values, and y is rounded once at the end.
        out = torch.empty(y.shape, dtype=torch.float32, device=y.device)
        return y.copy_(combine(rows.float(), where, weight, out))
    grid = (tokens, triton.cdiv(y.shape[1], BLOCK_H))
    _combine_kernel[grid](rows, where, weight, y, y.shape[1], K=k, BLOCK=BLOCK_H, num_warps=4)
    return y
