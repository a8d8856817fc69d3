"""Planted fault: rank 0 waits in a barrier that rank 1 never enters (the host analogue of a device
barrier nobody satisfies)."""

import torch.distributed as dist


def run(ctx):
    if ctx.rank == 0:
        dist.barrier(group=ctx.group)
