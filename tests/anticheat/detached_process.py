"""Cheat: leaves a process behind in a session of its own (double fork, setsid) that outlives the evaluation;
it writes its pid into /dev/shm so that the test can look for it afterwards."""

import os
import signal

import torch
import torch.distributed as dist

PID_DIR = "/dev/shm"


def setup(ctx):
    if ctx.rank == 0 and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(PID_DIR, f"cuco-detached-{os.getpid()}"), "w") as f:
                f.write(str(os.getpid()))
            while True:
                signal.pause()
        os._exit(0)


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
