"""Host-driven KV transfer in PyTorch, as a connector does it: the prefill rank computes every layer, then each
layer's K and V go to the decode rank (send/recv into its contiguous staging), which scatters them into the pages
its block table names. Runs on GPUs (NCCL) and CPUs (gloo)."""

import torch
import torch.distributed as dist


def run(ctx):
    p, b = ctx.params, ctx.buffers
    stage, pool, table = b["kv_stage"], b["pool"], b["block_table"]
    decode, page = ctx.world - 1, p["PAGE"]
    if ctx.rank == 0:
        for layer in range(p["L"]):
            torch.matmul(b["x"], b["wk"][layer], out=stage[layer, 0])
            torch.matmul(b["x"], b["wv"][layer], out=stage[layer, 1])
    if decode != 0 and ctx.rank in (0, decode):
        op, peer = (dist.isend, decode) if ctx.rank == 0 else (dist.irecv, 0)
        for layer in range(p["L"]):
            for req in dist.batch_isend_irecv([dist.P2POp(op, stage[layer], peer, ctx.group)]):
                req.wait()
    if ctx.rank == decode:
        token = torch.arange(p["S"], device=stage.device)
        page_of, slot = table.long()[token // page], token % page
        for layer in range(p["L"]):
            pool[layer, page_of, slot] = stage[layer, 0]
            pool[layer, page_of, page + slot] = stage[layer, 1]
