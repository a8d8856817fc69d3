"""Cheat: makes every clock it can reach stand still, so that a runner timing in this process sees ~0 ms."""

import time

import torch
import torch.distributed as dist

time.perf_counter = lambda: 0.0
time.monotonic = lambda: 0.0
time.perf_counter_ns = lambda: 0
time.time = lambda: 0.0


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
