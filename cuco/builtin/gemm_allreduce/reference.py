"""GEMM + AllReduce reference: every rank's C = sum over ranks p of A_p @ B_p, in fp32."""

from __future__ import annotations

import torch

from cuco.workload.contract import RankView


def make_inputs(p: dict[str, int], world: int, rank: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    m, k = p["M"], p["K"] // world
    # Scaled (with B's) so that the sum over ranks has entries of order one whatever K is.
    return {"a": (torch.randn(m, k, generator=gen, device=device) / p["K"] ** 0.25).to(torch.bfloat16)}

def make_parameters(p: dict[str, int], world: int, rank: int, gen: torch.Generator,
                    device) -> dict[str, torch.Tensor]:
    """This rank's weights, drawn once per shape."""
    k, n = p["K"] // world, p["N"]
    return {"b": (torch.randn(k, n, generator=gen, device=device) / p["K"] ** 0.25).to(torch.bfloat16)}


def reference(p: dict[str, int], world: int, rank: int,
              inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"c": sum(inp["a"].float() @ inp["b"].float() for inp in inputs)}


def compute_alone(view: RankView):
    """This rank's partial product through cuBLAS (torch.matmul): the bound's compute half."""
    a, b, c = view.bufs["a"], view.bufs["b"], view.bufs["c"]
    return lambda: torch.matmul(a, b, out=c)


def comm_alone(view: RankView):
    """NCCL's all-reduce of one partial product alone: reported beside the bound."""
    import torch.distributed as dist

    out = torch.empty_like(view.bufs["c"])
    return lambda: dist.all_reduce(out, group=view.group)
