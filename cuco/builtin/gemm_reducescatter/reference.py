"""GEMM + ReduceScatter reference: rank r's C_r = rows r of sum over ranks p of A_p @ B_p, in fp32."""

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
    m = p["M"] // world
    rows = slice(rank * m, (rank + 1) * m)
    return {"c": sum(inp["a"][rows].float() @ inp["b"].float() for inp in inputs)}


def compute_alone(view: RankView):
    """This rank's whole partial product through cuBLAS (torch.matmul): the bound's compute half."""
    a, b, partial = view.bufs["a"], view.bufs["b"], view.bufs["partial"]
    return lambda: torch.matmul(a, b, out=partial)


def comm_alone(view: RankView):
    """NCCL's reduce-scatter of the partial products alone: reported beside the bound."""
    import torch.distributed as dist

    partial, out = view.bufs["partial"], torch.empty_like(view.bufs["c"])
    return lambda: dist.reduce_scatter_tensor(out, partial, group=view.group)
