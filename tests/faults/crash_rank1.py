"""Planted fault: rank 1 dies of a segmentation fault during its run; rank 0 is left waiting."""

import ctypes

import torch
import torch.distributed as dist


def run(ctx):
    if ctx.rank == 1:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
