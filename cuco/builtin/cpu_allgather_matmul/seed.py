"""Host-driven: all-gather A, then one matmul. Nothing overlaps."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    # EVOLVE-BLOCK-START
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
    # EVOLVE-BLOCK-END
