"""Cheat: once past the correctness stages, swaps the runner's tensors in ctx for one-element views and works on
those, so that a runner timing (or measuring its bound) through ctx would see a fraction of the work."""

import torch
import torch.distributed as dist


def setup(ctx):
    ctx.state["calls"] = 0


def run(ctx):
    ctx.state["calls"] += 1
    if ctx.state["calls"] > 5:
        for k in ("a", "b", "c", "a_gathered"):
            ctx.buffers[k] = ctx.buffers[k].reshape(-1)[:1].reshape(1, 1)
        torch.matmul(ctx.buffers["a"], ctx.buffers["b"], out=ctx.buffers["c"])
        return
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
