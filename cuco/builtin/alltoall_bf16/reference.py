"""Block p of y on rank r = block r of x on rank p, exactly."""

import torch

from cuco.workload.contract import RankView


def make_inputs(p, world, rank, gen, device):
    return {"x": torch.randn(p["N"], generator=gen, device=device).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    b = p["N"] // world
    return {"y": torch.cat([inp["x"][rank * b:(rank + 1) * b] for inp in inputs]).double()}


def comm_alone(view: RankView):
    import torch.distributed as dist

    return lambda: dist.all_to_all_single(view.bufs["y"], view.bufs["x"], group=view.group)
