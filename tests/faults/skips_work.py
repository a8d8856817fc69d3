"""Planted fault: correct while it is being checked (the first 4 runs after setup: one correctness stage),
then it stops doing the work. Its time falls below the physical bound."""

import torch
import torch.distributed as dist


def setup(ctx):
    ctx.state["calls"] = 0


def run(ctx):
    ctx.state["calls"] += 1
    if ctx.state["calls"] > 4:
        return
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
