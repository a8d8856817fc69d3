"""Host-driven GEMM + ReduceScatter in PyTorch: matmul, then reduce-scatter. Runs on GPUs (NCCL) and CPUs (gloo,
which has no reduce-scatter: an all-reduce of the partials, then this rank's rows)."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, partial = (ctx.buffers[k] for k in ("a", "b", "c", "partial"))
    torch.matmul(a, b, out=partial)
    if partial.is_cuda:
        dist.reduce_scatter_tensor(c, partial, group=ctx.group)
    else:
        dist.all_reduce(partial, group=ctx.group)
        c.copy_(partial.chunk(ctx.world)[ctx.rank])
