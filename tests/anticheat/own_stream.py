"""Cheat (GPU): enqueues its work on a stream of its own that the runner neither gates nor waits for, so the
timed region on the runner's streams is empty; the work finishes later, before any host synchronisation."""

import torch
import torch.distributed as dist

SPIN_CYCLES = 20_000_000  # about 10 ms at H100/H200 clocks: work that is plainly still running at the end


def run(ctx):
    if "own" not in ctx.state:
        ctx.state["own"] = torch.cuda.Stream(ctx.device)
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    with torch.cuda.stream(ctx.state["own"]):
        torch.cuda._sleep(SPIN_CYCLES)
        dist.all_gather_into_tensor(a_full, a, group=ctx.group)
        torch.matmul(a_full, b, out=c)
