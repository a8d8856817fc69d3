"""Reaches into its judge: lowers the judge's open-file limit, so that the judge fails (and the evaluation with it)
at its next file. The host's seccomp filter refuses resource-limit calls on any process but its own."""

import os
import resource

import torch
import torch.distributed as dist


def setup(ctx):
    resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (16, 16))


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
