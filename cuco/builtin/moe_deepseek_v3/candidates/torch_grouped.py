"""The MoE layer as PyTorch's own training stacks write it today (torchtitan's expert parallelism): the per-expert
token counts exchanged with all_to_all_single and brought to the host for the split sizes, the tokens exchanged
with all_to_all_single, regrouped by local expert, both projections as one torch._grouped_mm each over all local
experts, and the outputs sent back the same way. The baseline a PyTorch user compares with: no loop over experts,
one host synchronisation per layer. Runs on GPUs (NCCL) and CPUs (gloo)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _experts(rows: torch.Tensor, expert: torch.Tensor, local: int, w13: torch.Tensor, w2: torch.Tensor):
    """SwiGLU of each row through its local expert, in the rows' order: sorted by expert for the grouped GEMMs,
    the group ends as offsets (int32, as torch._grouped_mm takes them)."""
    perm = torch.argsort(expert, stable=True)
    offs = torch.cumsum(torch.bincount(expert, minlength=local), 0).to(torch.int32)
    g, u = torch._grouped_mm(rows[perm], w13, offs=offs).chunk(2, dim=-1)
    out = torch.empty_like(rows)
    out[perm] = torch._grouped_mm(F.silu(g) * u, w2, offs=offs)
    return out


def run(ctx):
    p, b, world = ctx.params, ctx.buffers, ctx.world
    k, local = p["TOPK"], p["E"] // world
    x, y = b["x"], b["y"]
    vals, idx = b["logits"].topk(k, dim=-1)
    weight = torch.softmax(vals, dim=-1)
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, hence by the rank that owns it
    # Tokens per expert, exchanged: row s of `got` is what source s sends to each of this rank's experts.
    per_expert = torch.bincount(flat, minlength=p["E"]).to(torch.int64)
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert, group=ctx.group)
    got = got.view(world, local)
    send = per_expert.view(world, local).sum(1).tolist()  # the one host synchronisation
    recv = got.sum(1).tolist()
    rows = torch.empty(sum(recv), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(rows, x[order // k], recv, send, group=ctx.group)
    # Each source's rows arrive sorted by expert: their local experts follow from the counts alone.
    expert = torch.arange(local, device=x.device).repeat(world).repeat_interleave(got.flatten())
    out = _experts(rows, expert, local, b["w13"], b["w2"])
    back = torch.empty(len(order), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(back, out, send, recv, group=ctx.group)
    pairs = torch.empty_like(back)
    pairs[order] = back  # token-major again: row t * k + j is token t's j-th expert
    y.copy_((pairs.view(-1, k, x.shape[1]).float() * weight[..., None]).sum(dim=1))
