"""y_r = sum over ranks of x[r * N/world : (r + 1) * N/world], in float64."""

import torch

from cuco.workload.contract import RankView


def make_inputs(p, world, rank, gen, device):
    return {"x": torch.randn(p["N"], generator=gen, device=device).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    n = p["N"] // world
    return {"y": sum(inp["x"][rank * n:(rank + 1) * n].double() for inp in inputs)}


def comm_alone(view: RankView):
    import torch.distributed as dist

    out = torch.empty_like(view.bufs["y"])
    return lambda: dist.reduce_scatter_tensor(out, view.bufs["x"], group=view.group)
