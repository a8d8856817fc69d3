"""CPU all-gather + matmul reference: rank r's C_r = allgather(A) @ B_r, in float64."""

from __future__ import annotations

import torch

from cuco.workload.contract import RankView


def make_inputs(p: dict[str, int], world: int, rank: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    m, k = p["M"] // world, p["K"]
    return {"a": torch.randn(m, k, generator=gen, device=device) / k**0.25}

def make_parameters(p: dict[str, int], world: int, rank: int, gen: torch.Generator,
                    device) -> dict[str, torch.Tensor]:
    """This rank's weights, drawn once per shape."""
    k, n = p["K"], p["N"] // world
    return {"b": torch.randn(k, n, generator=gen, device=device) / k**0.25}


def reference(p: dict[str, int], world: int, rank: int,
              inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    a = torch.cat([inp["a"] for inp in inputs]).double()
    return {"c": a @ inputs[rank]["b"].double()}


def compute_alone(view: RankView):
    a_full = torch.cat([inp["a"] for inp in view.inputs])
    b, c = view.bufs["b"], view.bufs["c"]
    return lambda: torch.matmul(a_full, b, out=c)


def comm_alone(view: RankView):
    import torch.distributed as dist

    a, out = view.bufs["a"], torch.empty_like(view.bufs["a_gathered"])
    return lambda: dist.all_gather(list(out.chunk(view.world)), a, group=view.group)
