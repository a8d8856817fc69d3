"""What the tests of cuco.kernels' Triton kernels share: where they run (a GPU, else Triton's interpreter on the CPU,
in fp16: the interpreter mistranslates bf16), random and poisoned tensors, the relative error, and the peer
pointers of an emulated rank. Imported before cuco.kernels: the interpreter is chosen when kernels are decorated."""

from __future__ import annotations

import os

import torch
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = torch.device("cuda" if gpu_count() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(DTYPE)


def nan(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE, dtype=DTYPE)


def rel_err(c: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(c).any(), "an element of the output was never written"
    return ((c.float() - ref).norm() / ref.norm()).item()


def ptrs(values) -> torch.Tensor:
    """Addresses, as the kernels take them: int64 on the device."""
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def partials_for(rank, world, recv, counters, peers_recv, peers_counters, target):
    """Rank `rank`'s cuco.kernels.gemm.Partials: peers_recv[s] / peers_counters[s] stand for rank s's buffers."""
    from cuco.kernels.gemm import Partials

    dest = [peers_recv[s][rank].data_ptr() if s != rank else 0 for s in range(world)]
    flags = [peers_counters[s].data_ptr() if s != rank else 0 for s in range(world)]
    return Partials(rank, world, recv, counters, ptrs(dest), ptrs(flags), target)
