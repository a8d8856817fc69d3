"""Probe of the runner: skips the all-gather whenever the scratch buffer still holds data (not NaN), as a cheat
that reuses communicated data across runs would. Correct only if the scratch is poisoned before every run."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    if torch.isnan(a_full).any():
        dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
