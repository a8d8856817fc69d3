"""y = concatenation over ranks of x, exactly."""

import torch

from cuco.workload.contract import RankView


def make_inputs(p, world, rank, gen, device):
    return {"x": torch.randn(p["N"] // world, generator=gen, device=device).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    return {"y": torch.cat([inp["x"] for inp in inputs]).double()}


def comm_alone(view: RankView):
    import torch.distributed as dist

    return lambda: dist.all_gather_into_tensor(view.bufs["y"], view.bufs["x"], group=view.group)
