"""Rank r's y: the blocks every rank p sends to r, packed in rank order, then zeros; exact."""

import torch

from cuco.workload.contract import RankView


def make_inputs(p, world, rank, gen, device):
    n = p["N"]
    # Uneven blocks of N / (2 world) .. N / world elements (workload.toml's bound relies on the minimum), odd
    # sizes included; fresh ones for every trial.
    counts = torch.randint(n // (2 * world), n // world + 1, (world,), generator=gen, device=device,
                           dtype=torch.int64)
    return {"x": torch.randn(n, generator=gen, device=device).to(torch.bfloat16), "counts": counts}


def reference(p, world, rank, inputs):
    blocks = []
    for inp in inputs:
        c = inp["counts"].tolist()
        start = sum(c[:rank])
        blocks.append(inp["x"][start:start + c[rank]])
    y = torch.cat(blocks).double()
    return {"y": torch.cat([y, torch.zeros(p["N"] - y.numel(), dtype=torch.float64, device=y.device)])}


def comm_alone(view: RankView):
    import torch.distributed as dist

    rows = view.params["N"] // view.world * view.world
    y, x = view.bufs["y"][:rows], view.bufs["x"][:rows]
    return lambda: dist.all_to_all_single(y, x, group=view.group)
