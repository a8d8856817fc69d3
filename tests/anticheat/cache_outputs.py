"""Cheat: computes once, then hands back the first result for every later run (no communication, no GEMM)."""

import torch
import torch.distributed as dist

CACHE = {}


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    if "c" in CACHE:
        c.copy_(CACHE["c"])
        return
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    CACHE["c"] = c.clone()
