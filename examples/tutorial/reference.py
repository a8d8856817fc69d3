"""Reference of the scaled_sum workload: what scaled_sum.cu computes, in PyTorch, in float64."""

import torch

from cuco.workload.contract import RankView


def make_inputs(p, world, rank, gen, device):
    """This rank's activations and gain; of order one, so that bf16 rounding is judged fairly."""
    return {"x": torch.randn(p["T"], p["H"], generator=gen, device=device).to(torch.bfloat16),
            "gain": (1 + 0.1 * torch.randn(p["H"], generator=gen, device=device)).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    """Every rank's partial in float64; this rank gets their sum and every rank's row sums."""
    partials = [inp["x"].double() * inp["gain"].double() for inp in inputs]
    return {"out": sum(partials), "all_sums": torch.stack([q.sum(dim=1) for q in partials])}


def _scale_rows(x, gain):
    partial = x * gain
    return partial, partial.float().sum(dim=1)


def compute_alone(view: RankView):
    """The scaling and the row sums, the compute half of the bound: compiled by torch into one pass over x, as
    the program's kernel does it (run eagerly, torch reads x three times, and a bound from that would sit above
    what the program itself reaches)."""
    x, gain = view.bufs["x"], view.bufs["gain"]
    fused = torch.compile(_scale_rows, dynamic=False)
    return lambda: fused(x, gain)


def comm_alone(view: RankView):
    """The all-reduce of the scaled activations and the all-gather of the row sums, through torch.distributed."""
    import torch.distributed as dist

    partial, sums = torch.empty_like(view.bufs["out"]), torch.empty(view.params["T"], device=view.bufs["out"].device)
    gathered = torch.empty(view.world * view.params["T"], device=view.bufs["out"].device)

    def run():
        dist.all_reduce(partial, group=view.group)
        dist.all_gather_into_tensor(gathered, sums, group=view.group)

    return run
