"""Cheat (GPU): does the work, but makes the CUDA events of its process report a tenth of the time they measure,
the way a candidate that could reach the timer in its own process would."""

import torch
import torch.distributed as dist

_real = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: 0.1 * _real(self, end)


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather_into_tensor(a_full, a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
