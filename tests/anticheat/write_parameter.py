"""Keeps something of its own in the weights: computes C honestly, then leaves a mark in B (a parameter, drawn
once per shape), as a candidate that cached across runs in memory it was told to leave alone would."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    b[0, 0] = 0.0
