"""The physical bound beside every number: compute alone, communication alone, and their max.

Compute alone is measured (the workload's best-library version of the compute, timed by the same
runner; its fastest iteration). Communication alone is the bytes each rank must receive over the measured peer-link
bandwidth (`cuco doctor`); on the CPU, where no link rate is known, the measured collective stands in.
"""

from __future__ import annotations

from typing import Any

from cuco.workload.expr import eval_expr
from cuco.workload.spec import Shape, WorkloadSpec


def compute_bound(spec: WorkloadSpec, shape: Shape, world: int, device: str, compute_ms: float | None,
                  comm_alone_ms: float | None, machine: dict[str, Any]) -> dict[str, Any]:
    env = shape.env(world)
    comm_bytes = eval_expr(spec.bounds.comm_bytes, env)
    flops = eval_expr(spec.bounds.flops, env)
    bw = machine.get("peer_bw_gbps")
    if device == "cuda" and bw:
        comm_ms, comm_source = comm_bytes / (bw * 1e9) * 1e3, f"{comm_bytes / 1e6:.1f} MB at {bw:.0f} GB/s"
    else:
        comm_ms, comm_source = comm_alone_ms, "measured collective alone"
    tflops = machine.get("gemm_bf16_tflops")
    parts = [v for v in (compute_ms, comm_ms) if v is not None]
    return {
        "compute_ms": compute_ms,
        "compute_floor_ms": flops / (tflops * 1e12) * 1e3 if tflops and flops else None,
        "comm_ms": comm_ms,
        "comm_source": comm_source,
        "comm_bytes": comm_bytes,
        "flops": flops,
        "bound_ms": max(parts) if parts else None,
    }
