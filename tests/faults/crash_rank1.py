"""Planted fault: rank 1 dies of a segmentation fault during its run; rank 0 is left waiting."""

import numpy as np
import torch
import torch.distributed as dist


def run(ctx):
    if ctx.rank == 1:
        # numpy trusts the strides it is given: the second element lies 16 TB away, unmapped: SIGSEGV.
        np.lib.stride_tricks.as_strided(np.zeros(1), shape=(2,), strides=(1 << 44,)).sum()
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
