"""Evaluation slots: disjoint groups of GPUs of this machine (or CPU process groups), one candidate each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Slot:
    index: int
    gpus: tuple[int, ...]  # empty on the CPU


def make_slots(device: str, world: int, requested: int = 0) -> list[Slot]:
    if device == "cuda":
        from cuco.machine import gpu_count

        n = gpu_count() // world
        if n < 1:
            raise ValueError(f"world size {world} needs {world} GPUs, this machine has {gpu_count()}")
        n = min(n, requested) if requested > 0 else n
        return [Slot(i, tuple(range(i * world, (i + 1) * world))) for i in range(n)]
    n = requested if requested > 0 else max(1, (os.cpu_count() or 1) // world)
    return [Slot(i, ()) for i in range(n)]


def local_evaluator(device: str, eval_cfg, shape: str):
    """The search's evaluator on this machine: the cascade on the slot's GPUs (or CPU processes), at `shape`."""
    from cuco.runner.cascade import EvalOptions, evaluate
    from cuco.runner.results.record import EvalRecord

    def run(spec, src: Path, slot: Slot, work: Path, name: str | None = None) -> EvalRecord:
        opts = EvalOptions(device=device, shapes=[shape], gpus=list(slot.gpus), timeout_s=eval_cfg.timeout_s,
                           warmup=eval_cfg.warmup, iters=eval_cfg.iters, work_dir=work, name=name)
        return evaluate(spec, src, opts)

    return run
