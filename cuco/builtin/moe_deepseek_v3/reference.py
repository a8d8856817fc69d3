"""DeepSeek-V3 MoE layer reference: each rank's tokens routed to their top-k experts (softmax-normalised weights
over the chosen logits), each expert a SwiGLU FFN living on rank e // (E / world), outputs combined by weight;
in fp32, from every rank's inputs (the experts' weights are spread over the ranks)."""

from __future__ import annotations

import torch

from cuco.workload.contract import RankView


def routing(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the top-k experts by logit, in descending order, and their weights (softmax over those logits)."""
    vals, idx = logits.float().topk(topk, dim=-1)
    return idx, torch.softmax(vals, dim=-1)


def make_parameters(p: dict[str, int], world: int, rank: int, gen: torch.Generator,
                    device) -> dict[str, torch.Tensor]:
    """This rank's experts, drawn once per shape. One expert at a time: the fp32 draw of all of them at once would
    be 15 GB beside their 7.5 GB in bf16 (DeepSeek-V3, 128 experts a rank)."""
    hid, ff, local = p["HID"], p["FF"], p["E"] // world
    w13 = torch.empty(local, hid, 2 * ff, dtype=torch.bfloat16, device=device)
    w2 = torch.empty(local, ff, hid, dtype=torch.bfloat16, device=device)
    for e in range(local):  # scaled by fan-in: hidden activations of order one through both projections
        w13[e] = torch.randn(hid, 2 * ff, generator=gen, device=device) * hid ** -0.5
        w2[e] = torch.randn(ff, hid, generator=gen, device=device) * ff ** -0.5
    return {"w13": w13, "w2": w2}


def make_inputs(p: dict[str, int], world: int, rank: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    t, hid, e, k = p["T"], p["HID"], p["E"], p["TOPK"]
    # Routing: each token's k experts drawn without replacement, E // 16 hot experts HOT times as likely as the
    # rest (and, when skewed, one expert that no token picks); the logits then rank exactly those k first.
    share = torch.ones(e, device=device)
    if p["HOT"] > 1:
        order = torch.randperm(e, generator=gen, device=device)
        share[order[: max(1, e // 16)]] = float(p["HOT"])
        share[order[-1]] = 0.0
    chosen = torch.multinomial(share.expand(t, e), k, replacement=False, generator=gen)
    logits = torch.randn(t, e, generator=gen, device=device) - 8.0
    logits.scatter_(1, chosen, torch.randn(t, k, generator=gen, device=device))
    return {"x": torch.randn(t, hid, generator=gen, device=device).to(torch.bfloat16), "logits": logits}


def expert_ffn(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU: (silu(x Wg) * (x Wu)) Wd, with w13 = [Wg | Wu]."""
    g, u = (x @ w13).chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u) @ w2


def reference(p: dict[str, int], world: int, rank: int,
              inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    mine = inputs[rank]
    x = mine["x"].float()
    idx, weight = routing(mine["logits"], p["TOPK"])
    local = p["E"] // world
    y = torch.zeros_like(x)
    for e in idx.unique().tolist():
        owner = inputs[e // local]
        tok, slot = (idx == e).nonzero(as_tuple=True)
        out = expert_ffn(x[tok], owner["w13"][e % local].float(), owner["w2"][e % local].float())
        y.index_add_(0, tok, out * weight[tok, slot, None])
    return {"y": y}


def compute_alone(view: RankView):
    """The expert FFNs alone on the tokens this rank's experts receive from every rank, one cuBLAS call per
    projection per expert (torch.matmul), the tokens already in place: the bound's compute half."""
    local = view.params["E"] // view.world
    counts = torch.zeros(local, dtype=torch.long)
    for inp in view.inputs:
        idx, _ = routing(inp["logits"], view.params["TOPK"])
        mine = idx[(idx // local) == view.rank] % local
        counts += torch.bincount(mine.cpu(), minlength=local)
    w13, w2 = view.bufs["w13"], view.bufs["w2"]
    xs = [torch.randn(int(n), view.params["HID"], device=w13.device).to(torch.bfloat16) for n in counts.tolist()]

    def run():
        for e, xe in enumerate(xs):
            if len(xe):
                g, u = torch.matmul(xe, w13[e]).chunk(2, dim=-1)
                torch.matmul(torch.nn.functional.silu(g) * u, w2[e])
    return run


def comm_alone(view: RankView):
    """NCCL's all-to-allv of the dispatch (one row per token and chosen expert on another rank) and of the
    combine back, with this routing's counts: reported beside the bound."""
    import torch.distributed as dist

    local, hid = view.params["E"] // view.world, view.params["HID"]
    send = [0] * view.world  # rows this rank sends to each rank
    recv = [0] * view.world
    for src, inp in enumerate(view.inputs):
        owner = routing(inp["logits"], view.params["TOPK"])[0] // local
        for dst in range(view.world):
            n = int((owner == dst).sum())
            if src == view.rank:
                send[dst] = n
            if dst == view.rank:
                recv[src] = n
    send[view.rank] = recv[view.rank] = 0  # a rank's own tokens stay where they are
    device = view.bufs["x"].device
    out_d, in_d = (torch.empty(sum(c), hid, dtype=torch.bfloat16, device=device) for c in (recv, send))

    def run():
        dist.all_to_all_single(out_d, in_d, recv, send, group=view.group)
        dist.all_to_all_single(in_d, out_d, send, recv, group=view.group)
    return run
