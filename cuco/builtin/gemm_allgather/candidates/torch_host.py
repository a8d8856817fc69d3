"""Host-driven GEMM + AllGather in PyTorch: all-gather, then matmul. Runs on GPUs (NCCL) and CPUs (gloo)."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
