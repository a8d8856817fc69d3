"""Reference of the tensor-parallel MLP block (host.cpp): out = sum over ranks of gelu(x W1_r + b1_r) W2_r, plus b2
and the residual x, in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cuco.workload.contract import RankView


def make_parameters(p, world, rank, gen, device):
    """This rank's weights, drawn once per shape: its ffn / world columns of W1 and rows of W2 (scaled so that h and
    out stay of order one)."""
    hidden, shard = p["hidden"], p["ffn"] // world
    w1 = torch.randn(hidden, shard, generator=gen, device=device) / hidden ** 0.5
    w2 = torch.randn(shard, hidden, generator=gen, device=device) / p["ffn"] ** 0.5
    return {"w1": w1.to(torch.bfloat16), "w2": w2.to(torch.bfloat16)}


def make_inputs(p, world, rank, gen, device):
    tokens, hidden, shard = p["tokens"], p["hidden"], p["ffn"] // world
    return {"x": torch.randn(tokens, hidden, generator=gen, device=device).to(torch.bfloat16),
            "b1": (0.1 * torch.randn(shard, generator=gen, device=device)).to(torch.bfloat16),
            "b2": (0.1 * torch.randn(hidden, generator=gen, device=device)).to(torch.bfloat16)}


def _partial(inp):
    h = F.gelu(inp["x"].float() @ inp["w1"].float() + inp["b1"].float())
    return h @ inp["w2"].float()


def reference(p, world, rank, inputs):
    mine = inputs[rank]
    y = sum(_partial(inp) for inp in inputs)
    return {"out": y + mine["b2"].float() + mine["x"].float()}


def compute_alone(view: RankView):
    """This rank's block without the all-reduce, through cuBLAS and torch's kernels: the bound's compute half."""
    b = view.bufs
    x, w1, b1, w2, b2, out = b["x"], b["w1"], b["b1"], b["w2"], b["b2"], b["out"]
    h, y = b["h"], b["y"]

    def run():
        torch.matmul(x, w1, out=h)
        h.copy_(F.gelu(h + b1))
        torch.matmul(h, w2, out=y)
        torch.add(y + b2, x, out=out)
    return run


def comm_alone(view: RankView):
    """NCCL's all-reduce of the partial output alone: reported beside the bound."""
    import torch.distributed as dist

    y = torch.empty_like(view.bufs["y"])
    return lambda: dist.all_reduce(y, group=view.group)
