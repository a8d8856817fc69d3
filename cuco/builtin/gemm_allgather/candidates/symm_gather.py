"""Torch symmetric memory's gather, then cuBLAS: what a PyTorch user writes for a decode all-gather over NVLink.
Each rank copies its rows into a symmetric buffer; after a barrier every rank copies every peer's rows out of the
peer's buffer (the copy engine, over the link), and a second barrier keeps a rank from overwriting its rows with
the next run's before the peers have read them; then one GEMM over the gathered rows."""

import torch
import torch.distributed._symmetric_memory as symm_mem


def setup(ctx):
    a = ctx.buffers["a"]
    own = symm_mem.empty(a.shape, dtype=a.dtype, device=a.device)
    ctx.state.update(own=own, handle=symm_mem.rendezvous(own, ctx.group.group_name))


def run(ctx):
    a, b, c, gathered = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    own, handle = ctx.state["own"], ctx.state["handle"]
    rows = a.shape[0]
    own.copy_(a)
    handle.barrier(channel=0)
    for p in range(ctx.world):
        src = a if p == ctx.rank else handle.get_buffer(p, a.shape, a.dtype)
        gathered[p * rows:(p + 1) * rows].copy_(src)
    handle.barrier(channel=1)
    torch.matmul(gathered, b, out=c)


def teardown(ctx):
    ctx.state.clear()
