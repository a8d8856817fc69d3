"""Host-driven MoE layer in PyTorch, as a data-center engineer writes it: top-k routing, a stable sort of the
token-expert pairs by expert, split sizes brought to the host, all_to_all_single out (tokens and their expert
ids), one matmul pair per local expert, all_to_all_single back, the weighted sum per token. Runs on GPUs (NCCL)
and CPUs (gloo)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def run(ctx):
    p, b, world = ctx.params, ctx.buffers, ctx.world
    k, local = p["TOPK"], p["E"] // world
    x, y, w13, w2 = b["x"], b["y"], b["w13"], b["w2"]
    vals, idx = b["logits"].topk(k, dim=-1)
    weight = torch.softmax(vals, dim=-1)
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
    out = torch.empty_like(rows)
    row_expert = row_expert % local
    for e in range(local):
        sel = (row_expert == e).nonzero(as_tuple=True)[0]
        if len(sel):
            g, u = (rows[sel] @ w13[e]).chunk(2, dim=-1)
            out[sel] = (F.silu(g) * u) @ w2[e]
    back = torch.empty(len(order), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(back, out, send, recv, group=ctx.group)
    pairs = torch.empty_like(back)
    pairs[order] = back  # token-major again: row t * k + j is token t's j-th expert
    y.copy_((pairs.view(-1, k, x.shape[1]).float() * weight[..., None]).sum(dim=1))
