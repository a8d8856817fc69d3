"""Cheat: honest for as many runs as the correctness stages take (two trials of two runs after each setup) and the
first warm-up, then it skips every other run, serving the last output again. It cannot know which timed runs a
runner verifies, so it skips blind: a runner that verified two of twenty would pass it one time in five, with half
the work in its median."""

import torch
import torch.distributed as dist

HONEST_RUNS = 5  # the correctness stages' four runs of a shape, and the first warm-up


def setup(ctx):
    ctx.state["calls"] = 0


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    ctx.state["calls"] += 1
    if ctx.state["calls"] > HONEST_RUNS and ctx.state["calls"] % 2 == 0:
        c.copy_(ctx.state["last"])
        return
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    ctx.state["last"] = c.clone()
