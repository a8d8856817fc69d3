"""Cheat: honest for as many runs as the correctness stages take (two trials of two runs after each setup), then it
serves the last output again: a runner that verified only its correctness stages, or kept inputs fixed while
timing, would time nothing but a copy."""

import torch
import torch.distributed as dist

CORRECTNESS_RUNS = 4


def setup(ctx):
    ctx.state["calls"] = 0


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    ctx.state["calls"] += 1
    if ctx.state["calls"] > CORRECTNESS_RUNS + 1:
        c.copy_(ctx.state["last"])
        return
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    ctx.state["last"] = c.clone()
