"""KV-transfer reference: the decode rank's pool holds every layer's K = X Wk_l and V = X Wv_l (fp32) at the pages
its block table names; every other element of every rank's pool is NaN, which the judge reads as "must still
hold the poison": nothing may write there."""

from __future__ import annotations

import torch

from cuco.workload.contract import RankView


def pages(p: dict[str, int]) -> int:
    return (p["S"] + p["PAGE"] - 1) // p["PAGE"]


def make_inputs(p: dict[str, int], world: int, rank: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    if p["LAYOUT"] == 2:
        table = torch.randperm(p["POOL"], generator=gen, device=device)[:pages(p)]
    else:
        table = torch.arange(pages(p), device=device)
    x = torch.randn(p["S"], p["HID"], generator=gen, device=device).to(torch.bfloat16)
    return {"x": x, "block_table": table.to(torch.int32)}


def make_parameters(p: dict[str, int], world: int, rank: int, gen: torch.Generator,
                    device) -> dict[str, torch.Tensor]:
    """The K and V projections, drawn once per shape, a layer at a time (no fp32 copy of all of them), scaled by
    1/sqrt(HID): K and V of order one, as after a real model's projections."""
    hid, cols, layers = p["HID"], p["KV"] * p["D"], p["L"]
    out = {n: torch.empty(layers, hid, cols, dtype=torch.bfloat16, device=device) for n in ("wk", "wv")}
    for w in out.values():
        for layer in range(layers):
            w[layer] = torch.randn(hid, cols, generator=gen, device=device) * hid ** -0.5
    return out


def reference(p: dict[str, int], world: int, rank: int,
              inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    s, page, cols = p["S"], p["PAGE"], p["KV"] * p["D"]
    pool = torch.full((p["L"], p["POOL"], 2 * page, cols), float("nan"), device=inputs[0]["x"].device)
    if rank != world - 1:
        return {"pool": pool}
    prefill, table = inputs[0], inputs[rank]["block_table"].long()
    x = prefill["x"].float()
    token = torch.arange(s, device=x.device)
    page_of, slot = table[token // page], token % page
    for layer in range(p["L"]):
        pool[layer, page_of, slot] = x @ prefill["wk"][layer].float()
        pool[layer, page_of, page + slot] = x @ prefill["wv"][layer].float()
    return {"pool": pool}


def compute_alone(view: RankView):
    """The prefill rank's projections alone, through cuBLAS (torch.matmul), into the contiguous staging buffer."""
    if view.rank != 0:
        return lambda: None
    x, wk, wv, stage = view.bufs["x"], view.bufs["wk"], view.bufs["wv"], view.bufs["kv_stage"]

    def run():
        for layer in range(view.params["L"]):
            torch.matmul(x, wk[layer], out=stage[layer, 0])
            torch.matmul(x, wv[layer], out=stage[layer, 1])
    return run


def comm_alone(view: RankView):
    """NCCL moving every layer's contiguous K and V from the prefill rank to the decode rank, in one send."""
    import torch.distributed as dist

    stage, decode = view.bufs["kv_stage"], view.world - 1
    if decode == 0 or view.rank not in (0, decode):
        return lambda: None
    op = dist.isend if view.rank == 0 else dist.irecv

    def run():
        for req in dist.batch_isend_irecv([dist.P2POp(op, stage, decode if view.rank == 0 else 0, view.group)]):
            req.wait()
    return run
