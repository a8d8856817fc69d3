"""Evaluation slots: disjoint groups of GPUs of this machine (or CPU process groups), one candidate each."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    index: int
    gpus: tuple[int, ...]  # empty on the CPU


def make_slots(device: str, world: int, requested: int = 0) -> list[Slot]:
    if device == "cuda":
        import torch

        n = torch.cuda.device_count() // world
        if n < 1:
            raise ValueError(f"world size {world} needs {world} GPUs, this machine has {torch.cuda.device_count()}")
        n = min(n, requested) if requested > 0 else n
        return [Slot(i, tuple(range(i * world, (i + 1) * world))) for i in range(n)]
    n = requested if requested > 0 else max(1, (os.cpu_count() or 1) // world)
    return [Slot(i, ()) for i in range(n)]
