"""Host-driven ring attention pipelined, as ring-flash-attention's zig-zag variant does it: world steps; at each,
the K and V block in hand is sent on to the next rank while the previous rank's arrives (batched isend/irecv,
issued before the attention), attention runs on the block in hand through torch's flash-attention kernel, and
its output merges into this rank's by the log-sum-exp. The next block is waited for only before the next step:
the transfer overlaps one step's attention, as far as the host's waits allow.

Zig-zag: rank r holds sequence chunks r and 2*world-1-r. A query chunk sees a key chunk whole if it comes earlier,
causally if it is the same chunk, not at all if it comes later.
"""

import math

import torch
import torch.distributed as dist


def _flash(q, k, v, causal, scale):
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    else:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out[0], out[1]


def _heads(x, h):
    """[L, heads, D] -> [1, H, L, D]: each KV head repeated for its group of query heads."""
    return x.transpose(0, 1).repeat_interleave(h // x.shape[1], dim=0).unsqueeze(0)


def run(ctx):
    q, k, v, o, lse = (ctx.buffers[n] for n in ("q", "k", "v", "o", "lse"))
    world, rank = ctx.world, ctx.rank
    rows, h, d = q.shape
    c, scale = rows // 2, 1.0 / math.sqrt(d)
    ring = ctx.buffers["kv_ring"].view(2, 2, rows, *k.shape[1:])  # [slot][K or V][rows, KV, D]
    # EVOLVE-BLOCK-START
    ring[0, 0].copy_(k)
    ring[0, 1].copy_(v)
    qh = _heads(q, h)
    acc = torch.zeros(1, h, rows, d, dtype=torch.float32, device=q.device)
    acc_lse = torch.full((1, h, rows), float("-inf"), dtype=torch.float32, device=q.device)
    mine = (rank, 2 * world - 1 - rank)
    for step in range(world):
        cur, nxt = ring[step % 2], ring[(step + 1) % 2]
        reqs = []
        if step < world - 1:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, (rank + 1) % world, ctx.group),
                                           dist.P2POp(dist.irecv, nxt, (rank - 1) % world, ctx.group)])
        src = (rank - step) % world
        kh, vh = _heads(cur[0], h), _heads(cur[1], h)
        for i, qi in enumerate(mine):
            for j, kj in enumerate((src, 2 * world - 1 - src)):
                if kj > qi:
                    continue
                r, s = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                out, blk = _flash(qh[:, :, r], kh[:, :, s], vh[:, :, s], kj == qi, scale)
                new = torch.logaddexp(acc_lse[:, :, r], blk)
                acc[:, :, r] = acc[:, :, r] * torch.exp(acc_lse[:, :, r] - new)[..., None] + \
                    out.float() * torch.exp(blk - new)[..., None]
                acc_lse[:, :, r] = new
        for req in reqs:
            req.wait()
    o.copy_(acc[0].transpose(0, 1))
    lse.copy_(acc_lse[0])
    # EVOLVE-BLOCK-END
