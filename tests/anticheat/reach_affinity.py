"""Reaches into its judge: pins every thread of the judge (its parent) to one CPU, the one its own busy threads
would fill. Affinity calls pass the host's filter (libraries pin their own threads by thread id); the judge sees
its own affinity change and fails the evaluation. Where the kernel itself refuses (a target with capabilities the
host lacks), the call raises."""

import os

import torch
import torch.distributed as dist


def setup(ctx):
    judge = os.getppid()
    one = {min(os.sched_getaffinity(0))}
    for tid in os.listdir(f"/proc/{judge}/task"):
        os.sched_setaffinity(int(tid), one)


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
