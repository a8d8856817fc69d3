"""Honest: lays the weights out anew once, in setup, as a serving engine does at load time, and multiplies with
that copy in every run (allowed: the weights are there when setup runs, and never change)."""

import torch
import torch.distributed as dist


def setup(ctx):
    ctx.state["bt"] = ctx.buffers["b"].t().contiguous()


def run(ctx):
    a, c, a_full = (ctx.buffers[k] for k in ("a", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, ctx.state["bt"].t(), out=c)
