"""Ring attention reference: causal GQA attention of this rank's zig-zag chunks against the whole sequence, in fp32,
block by block with an online softmax so that 128K tokens fit in memory."""

from __future__ import annotations

import math

import torch

from cuco.workload.contract import RankView

# Query rows per block of the reference: keeps the fp32 scores of one block of one KV group within a few GB at 128K.
QUERY_BLOCK = 2048


def chunk_len(p: dict[str, int], world: int) -> int:
    return p["S"] // (2 * world)


def positions(p: dict[str, int], world: int, rank: int) -> torch.Tensor:
    """Global token positions of this rank's rows: chunk rank, then chunk 2 * world - 1 - rank."""
    c = chunk_len(p, world)
    first, second = rank * c, (2 * world - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)])


def make_inputs(p: dict[str, int], world: int, rank: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    rows, h, kv, d = p["S"] // world, p["H"], p["KV"], p["D"]
    return {name: torch.randn(rows, heads, d, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
            for name, heads in (("q", h), ("k", kv), ("v", kv))}


def _sequence(p, world, inputs, name):
    """K or V of the whole sequence in token order, from every rank's zig-zag chunks."""
    out = torch.empty(p["S"], *inputs[0][name].shape[1:], dtype=torch.float32, device=inputs[0][name].device)
    for r, inp in enumerate(inputs):
        out[positions(p, world, r).to(out.device)] = inp[name].float()
    return out


def reference(p: dict[str, int], world: int, rank: int,
              inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    q = inputs[rank]["q"].float()  # [rows, H, D]
    k, v = _sequence(p, world, inputs, "k"), _sequence(p, world, inputs, "v")  # [S, KV, D]
    pos = positions(p, world, rank).to(q.device)
    group, scale = p["H"] // p["KV"], 1.0 / math.sqrt(p["D"])
    o = torch.empty_like(q)
    lse = torch.empty(p["H"], q.shape[0], dtype=torch.float32, device=q.device)
    for g in range(p["KV"]):
        heads = slice(g * group, (g + 1) * group)
        for lo in range(0, q.shape[0], QUERY_BLOCK):
            rows = slice(lo, lo + QUERY_BLOCK)
            qp = pos[rows]
            keys = int(qp.max()) + 1  # no key after the last query of the block is visible
            s = torch.einsum("qhd,kd->hqk", q[rows, heads], k[:keys, g]) * scale
            s.masked_fill_(torch.arange(keys, device=q.device)[None, None, :] > qp[None, :, None], float("-inf"))
            block_lse = torch.logsumexp(s, dim=-1)  # [group, rows]
            o[rows, heads] = torch.einsum("hqk,kd->qhd", torch.exp(s - block_lse[..., None]), v[:keys, g])
            lse[heads, rows] = block_lse
    return {"o": o, "lse": lse}


def compute_alone(view: RankView):
    """This rank's attention work, block for block as the ring does it, each block merged into the running output by
    the log-sum-exp, with every rank's K and V already in hand: the same kernels as the programs
    (cuco.kernels.attention: the fastest attention the machine has, the fused merge), no communication: the bound's
    compute half."""
    from cuco.kernels.attention import block_attention, merge_lse_

    c, scale, dev = chunk_len(view.params, view.world), 1.0 / math.sqrt(view.params["D"]), view.bufs["q"].device
    q, o, lse = view.bufs["q"], view.bufs["o"], view.bufs["lse"]
    blocks = [(inp["k"].to(dev), inp["v"].to(dev)) for inp in view.inputs]
    acc = torch.empty(q.shape, dtype=torch.float32, device=dev)
    mine = (view.rank, 2 * view.world - 1 - view.rank)

    def run():
        started = set()
        for src, (k, v) in enumerate(blocks):
            theirs = (src, 2 * view.world - 1 - src)
            for i, qi in enumerate(mine):
                for j, kj in enumerate(theirs):
                    if kj <= qi:
                        rows, cols = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                        out, blk = block_attention(q[rows], k[cols], v[cols], kj == qi, scale)
                        merge_lse_(acc[rows], lse[:, rows], out, blk, first=i not in started)
                        started.add(i)
        o.copy_(acc)

    return run


def comm_alone(view: RankView):
    """The ring's sends and receives of K and V alone, world - 1 steps: reported beside the bound."""
    import torch.distributed as dist

    k, v = view.bufs["k"], view.bufs["v"]
    nxt, prv = (view.rank + 1) % view.world, (view.rank - 1) % view.world
    send, recv = torch.cat([k, v]), torch.empty_like(torch.cat([k, v]))

    def ring():
        cur = send
        for _ in range(view.world - 1):
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, nxt, view.group),
                                           dist.P2POp(dist.irecv, recv, prv, view.group)])
            for r in reqs:
                r.wait()
            cur = recv.clone()

    return ring
