"""Host-driven ring attention as users first write it: world steps; at each, the K and V block in hand goes to the
next rank and the previous rank's arrives (batched isend/irecv), and only once both are done does attention run
on the block now in hand (cuco.kernels.attention: torch's cuDNN attention on GPUs, grouped-query heads as the
buffers hold them), its output merged into this rank's by the log-sum-exp (one fused pass). Communication and
attention never overlap; candidates/host_pipeline.py overlaps them.

Zig-zag: rank r holds sequence chunks r and 2*world-1-r. A query chunk sees a key chunk whole if it comes earlier,
causally if it is the same chunk, not at all if it comes later.
"""

import math

import torch
import torch.distributed as dist

from cuco.kernels.attention import block_attention, merge_lse_


def run(ctx):
    q, k, v, o, lse = (ctx.buffers[n] for n in ("q", "k", "v", "o", "lse"))
    world, rank = ctx.world, ctx.rank
    rows, _, d = q.shape
    c, scale = rows // 2, 1.0 / math.sqrt(d)
    ring = ctx.buffers["kv_ring"].view(2, 2, rows, *k.shape[1:])  # [slot][K or V][rows, KV, D]
    # EVOLVE-BLOCK-START
    ring[0, 0].copy_(k)
    ring[0, 1].copy_(v)
    acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # O in fp32; lse is merged into in place
    started = set()  # query chunks that hold a block's output already
    mine = (rank, 2 * world - 1 - rank)
    for step in range(world):
        cur = ring[step % 2]
        if step > 0:  # the block from the previous rank, in full, before any attention on it
            prev = ring[(step - 1) % 2]
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, prev, (rank + 1) % world, ctx.group),
                                               dist.P2POp(dist.irecv, cur, (rank - 1) % world, ctx.group)]):
                req.wait()
        src = (rank - step) % world
        for i, qi in enumerate(mine):
            for j, kj in enumerate((src, 2 * world - 1 - src)):
                if kj > qi:
                    continue
                r, s = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                out, blk = block_attention(q[r], cur[0, s], cur[1, s], kj == qi, scale)
                merge_lse_(acc[r], lse[:, r], out, blk, first=i not in started)
                started.add(i)
    o.copy_(acc)
    # EVOLVE-BLOCK-END
