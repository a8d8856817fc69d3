"""The MoE layer with its experts in cuco.kernels' grouped GEMM: one launch per projection for all local experts,
the group sizes read by the kernel from device memory.

Dispatch and combine are torch_host's (split sizes on the host, all_to_all_single out and back); at world 1 there
is nothing to exchange and the layer runs with no host synchronisation at all. The received rows are sorted by
local expert on the device (cuco.kernels.grouped_gemm.sort_by_expert), both projections run as grouped launches
(w13 with the SwiGLU epilogue, so the hidden activation is written once, in bf16; w13 reads each sorted row where
it lies, a token's row of x at world 1, a received row otherwise, so no sorted copy is written), and the combine
(cuco.kernels.combine) reads each token's k outputs where they lie: sorted by expert at world 1, in the order the
exchange returns them otherwise, with no scatter back to token order. Runs on GPUs (NCCL) and on CPUs (gloo, the
kernels in Triton's interpreter).
"""

import torch
import torch.distributed as dist

from cuco.kernels.combine import combine
from cuco.kernels.grouped_gemm import moe_experts, sort_by_expert, sorted_place


def _unsorted(layout, rows, w13, w2):
    """The experts' outputs for `rows` (in received order; `layout` sorts them by expert, the sort read in w13's
    loads), in received order: the order the exchange sends them back in."""
    out = torch.empty_like(rows)
    out[layout.order] = moe_experts(rows, layout.offs, w13, w2, rows=layout.order)
    return out


def _exchanged(ctx, x, idx, local):
    """Every pair's expert output through the experts' owners (pairs grouped by owning rank, sent, computed there,
    and sent back), and where each lies: row where[t * k + j] is token t's j-th expert's."""
    k, world = idx.shape[1], ctx.world
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, hence by the rank that owns it
    expert = flat[order]
    send_counts = torch.bincount(expert // local, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ctx.group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    rows = torch.empty(sum(recv), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(rows, x[order // k], recv, send, group=ctx.group)
    row_expert = torch.empty(sum(recv), dtype=expert.dtype, device=x.device)
    dist.all_to_all_single(row_expert, expert, recv, send, group=ctx.group)
    layout = sort_by_expert(row_expert % local, local)
    out = _unsorted(layout, rows, ctx.buffers["w13"], ctx.buffers["w2"])
    back = torch.empty(len(order), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(back, out, send, recv, group=ctx.group)
    return back, sorted_place(order)


def run(ctx):
    p, b = ctx.params, ctx.buffers
    k, local = p["TOPK"], p["E"] // ctx.world
    x, y = b["x"], b["y"]
    vals, idx = b["logits"].topk(k, dim=-1)
    weight = torch.softmax(vals, dim=-1)
    if ctx.world == 1:  # every expert is here: sorted row i is token order[i] // k's
        layout = sort_by_expert(idx, local)
        rows = moe_experts(x, layout.offs, b["w13"], b["w2"], rows=layout.order // k)  # gathered in w13's loads
        where = sorted_place(layout.order)
    else:
        rows, where = _exchanged(ctx, x, idx, local)
    combine(rows, where, weight, y)
