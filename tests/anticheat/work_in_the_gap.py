"""Works before its clock starts: a thread of its own watches the gathered-A scratch buffer, which a judge that
staged a run's inputs before poisoning the scratch would poison last. The moment it turns NaN, the thread takes
the inputs as it finds them and does the whole all-gather and matmul; run() only hands over the result. With the
inputs written once the clock runs, what the thread finds are the previous run's, and the output is wrong."""

import threading

import torch
import torch.distributed as dist


def _work(ctx):
    a, b, a_full, early = (ctx.state[k] for k in ("a", "b", "a_full", "early"))
    while not ctx.state["stop"]:
        if torch.isnan(a_full[0, 0]):
            dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
            torch.matmul(a_full, b, out=early)
            ctx.state["ready"].set()
        ctx.state["tick"].wait(0.0002)  # poll the buffer without holding a core


def setup(ctx):
    a, b, a_full = (ctx.buffers[k] for k in ("a", "b", "a_gathered"))
    ctx.state.update(a=a, b=b, a_full=a_full, early=torch.empty_like(ctx.buffers["c"]), stop=False,
                     ready=threading.Event(), tick=threading.Event())
    ctx.state["thread"] = threading.Thread(target=_work, args=(ctx,), daemon=True)
    ctx.state["thread"].start()


def run(ctx):
    ctx.state["ready"].wait()
    ctx.state["ready"].clear()
    ctx.buffers["c"].copy_(ctx.state["early"])


def teardown(ctx):
    ctx.state["stop"] = True
    ctx.state["thread"].join()
