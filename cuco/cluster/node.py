"""What one node of a cluster does for one evaluation: the same cascade as a local slot, on the node's own
devices, build cache and machine facts. Imports only cuco, so a cluster task can call it on any node where cuco
is installed."""

from __future__ import annotations

import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.machine import ensure_bound_facts
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload


@dataclass
class Job:
    """An evaluation, as the driver sends it: the workload's files (the nodes need not share a filesystem, nor
    the driver's version of a built-in), the candidate's text, and how to evaluate it."""

    workload: str
    world: int
    candidate: str  # the program's text
    suffix: str  # .cu or .py
    shape: str
    device: str
    files: dict[str, bytes] = field(default_factory=dict)  # the workload directory: relative path -> bytes
    timeout_s: float | None = None
    warmup: int | None = None
    iters: int | None = None
    name: str | None = None  # the workload's name for the program (a baseline's NCCL settings go by it)


def workload_files(root: Path) -> dict[str, bytes]:
    """A workload directory's files, to rebuild it on a node (workloads are a few small text files)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def run_job(job: Job, gpus: list[int], node: dict[str, Any]) -> dict[str, Any]:
    """The record of one evaluation on this node, as JSON data, with the node that produced it. `gpus`: the
    indices the cluster gave the task among the GPUs it can see."""
    tmp = Path(tempfile.mkdtemp(prefix="cuco-node-"))
    try:
        root = tmp / job.workload
        for rel, data in job.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        spec = load_workload(root, job.world)
        src = tmp / f"candidate{job.suffix}"
        src.write_text(job.candidate)
        if job.device == "cuda":
            ensure_bound_facts()
        opts = EvalOptions(device=job.device, shapes=[job.shape], gpus=gpus, timeout_s=job.timeout_s,
                           warmup=job.warmup, iters=job.iters, work_dir=tmp / "work", name=job.name)
        record = evaluate(spec, src, opts)
        record.work_dir = None  # on the node, and removed below
        record.node = {"host": socket.gethostname(), **node}
        return record.to_dict()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
