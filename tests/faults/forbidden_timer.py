"""Planted fault: a candidate that times itself (the runner owns timing)."""

import time

import torch
import torch.distributed as dist


def run(ctx):
    t0 = time.perf_counter()
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    ctx.state["t"] = t0
