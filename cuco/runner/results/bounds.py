"""The physical bound beside every number: compute alone, communication alone, and their max (plus the bytes that
can move only once the compute is over, where a workload has such).

Compute alone is measured: the workload's best-library version of the compute, timed by judges that run
no candidate, once per machine, workload and shape, and cached in CUCO_HOME; its fastest iteration.
Communication alone is the bytes each rank must receive over the measured peer-link bandwidth (`cuco
doctor`); on the CPU, where no link rate is known, the measured collective stands in.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuco.machine import fingerprint
from cuco.paths import atomic_write_json, cuco_home
from cuco.runner.judge.timing import REFERENCE_TIMING
from cuco.runner.processes.job import Job, Stage
from cuco.runner.results.rank_report import BoundsStage
from cuco.workload.expr import eval_expr
from cuco.workload.spec import DELIVERED, Shape, WorkloadSpec

# How far the library bound may sit under the speed of light before it is taken for one that leaves work out: the
# ceilings are measured rates, a few percent under what the fastest library reaches on a good day.
LIGHT_SLACK = 0.05


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
    serial_bytes = eval_expr(spec.bounds.serial_comm_bytes, env)
    serial_ms = None
    if serial_bytes and comm_ms is not None and comm_bytes:
        serial_ms = comm_ms * serial_bytes / comm_bytes
    tflops = machine.get("gemm_bf16_tflops")
    parts = [v for v in (compute_ms, comm_ms) if v is not None]
    hbm_bytes = eval_expr(spec.bounds.hbm_bytes, env)
    # Every timed run starts by writing its fresh inputs into the candidate's buffers (read once, written once):
    # traffic inside the time that the workload's own hbm_bytes does not count.
    inputs_bytes = sum(b.nbytes(env) for b in spec.buffers.values() if b.role in DELIVERED)
    out = {
        "compute_ms": compute_ms,
        "compute_floor_ms": flops / (tflops * 1e12) * 1e3 if tflops and flops else None,
        "comm_ms": comm_ms,
        "comm_source": comm_source,
        "comm_bytes": comm_bytes,
        "flops": flops,
        "serial_comm_ms": serial_ms,
        # The serial part follows the compute, and is part of the communication's own time: counted on the
        # compute's side only, as in the speed of light (where communication dominates, it is not counted twice).
        "bound_ms": max((compute_ms or 0.0) + (serial_ms or 0.0), comm_ms or 0.0) if parts else None,
        "hbm_bytes": hbm_bytes,
        "inputs_bytes": inputs_bytes,
    }
    terms = light_terms(flops, hbm_bytes + 2 * inputs_bytes, comm_bytes, serial_bytes, machine)
    if device == "cuda" and terms:
        out.update(_light(terms))
        if why := library_misses(out, terms):
            out.update(bound_ms=None, library_refused=why)
    return out


def library_misses(bound: dict[str, Any], terms: LightTerms) -> str | None:
    """Why a library bound under the speed of light cannot be one (the library cannot beat the machine): the term it
    leaves out, by more than LIGHT_SLACK. None where it is no lower."""
    library, light = bound["bound_ms"], bound.get("speed_of_light_ms")
    if library is None or not light or library >= light * (1 - LIGHT_SLACK):
        return None
    compute, comm, serial = terms.compute_ms, terms.comm_ms, terms.serial_ms
    missing = []
    if (bound["compute_ms"] or 0.0) < compute * (1 - LIGHT_SLACK):
        measured = "not measured" if bound["compute_ms"] is None else f"{bound['compute_ms']:.4f} ms"
        missing.append(f"compute alone ({measured}: reference.py's compute_alone) is under the {compute:.4f} ms that "
                       "[bounds] flops and hbm_bytes take at the machine's ceilings: it leaves out work they count")
    if (bound["comm_ms"] or 0.0) < comm * (1 - LIGHT_SLACK):
        missing.append(f"communication alone ({bound['comm_ms'] or 0.0:.4f} ms, {bound['comm_source']}) is under the "
                       f"{comm:.4f} ms that [bounds] comm_bytes take at the link's rate")
    if not missing:
        missing.append(f"the communication that only follows the compute ({serial:.4f} ms at the link's rate, "
                       "[bounds] serial_comm_bytes) is left out of it")
    return f"the library bound {library:.4f} ms is under the speed of light {light:.4f} ms: " + "; ".join(missing)


@dataclass(frozen=True)
class LightTerms:
    """The speed of light's terms in ms, from the machine's ceilings (`cuco doctor`)."""

    compute_ms: float  # the flops at the tensor rate or the HBM bytes at the fastest HBM rate, the longer
    comm_ms: float  # the bytes received at the link's rate with both directions busy
    serial_ms: float  # the communication that only follows the compute, at the link's rate
    hbm_ms: float


def light_terms(flops: float, hbm_bytes: float, comm_bytes: float, serial_bytes: float,
                machine: dict[str, Any]) -> LightTerms | None:
    """None where the ceilings were not measured."""
    c = machine.get("ceilings") or {}
    tensor = (c.get("tensor_bf16_tflops") or {}).get("value")
    hbm = max([(c.get(k) or {}).get("value") or 0.0 for k in ("hbm_read_gbps", "hbm_write_gbps", "hbm_copy_gbps")])
    link = (c.get("link_both_ways_gbps") or {}).get("value") or machine.get("peer_bw_gbps")
    if not tensor or not hbm or (comm_bytes and not link):
        return None
    hbm_ms = hbm_bytes / (hbm * 1e9) * 1e3

    def at_link(nbytes: float) -> float:
        return nbytes / (link * 1e9) * 1e3 if nbytes else 0.0

    return LightTerms(max(flops / (tensor * 1e12) * 1e3, hbm_ms), at_link(comm_bytes), at_link(serial_bytes), hbm_ms)


def speed_of_light(flops: float, hbm_bytes: float, comm_bytes: float, serial_bytes: float,
                   machine: dict[str, Any]) -> dict[str, float]:
    """The least time the machine's ceilings allow: the largest of its terms (light_terms); communication that can
    only follow the compute adds to the compute's term, never to the link's (it is part of comm_bytes), so nothing
    is counted twice. Empty where the ceilings were not measured."""
    t = light_terms(flops, hbm_bytes, comm_bytes, serial_bytes, machine)
    return {} if t is None else _light(t)


def _light(t: LightTerms) -> dict[str, float]:
    return {"hbm_ms": t.hbm_ms, "speed_of_light_ms": max(t.compute_ms + t.serial_ms, t.comm_ms)}


# ---- the references' timings: measured in a clean process, once per machine, workload and shape ----------


def _machine_key(device: str) -> dict[str, Any]:
    info = fingerprint()
    info.pop("time", None)
    return {**info, "device": device}


def _workload_key(spec: WorkloadSpec, device: str) -> str:
    """What every shape's references depend on: the machine, the workload's reference and buffers, its timing."""
    h = hashlib.sha256()
    h.update(json.dumps([REFERENCE_TIMING, _machine_key(device), spec.name, spec.world_size,
                         [(b.name, b.role, b.dtype, b.shape) for b in spec.buffers.values()],
                         spec.timing.warmup, spec.timing.iters, spec.timing.l2_flush, dict(spec.nccl_env)],
                        sort_keys=True, default=str).encode())
    h.update(spec.reference_path.read_bytes())
    return h.hexdigest()


def _cache_path(spec: WorkloadSpec, workload_key: str, shape: Shape, device: str) -> Path:
    key = hashlib.sha256((workload_key + json.dumps(shape.params, sort_keys=True)).encode()).hexdigest()[:20]
    return cuco_home() / "bounds" / f"{spec.name}-w{spec.world_size}-{device}-{shape.name}-{key}.json"


def reference_timings(spec: WorkloadSpec, shapes: list[str], device: str, gpus: list[int],
                      timeout_s: float, fresh: bool = False) -> tuple[dict[str, dict[str, Any]], str]:
    """Per shape, every rank's times of the workload's compute alone and collective alone, from the cache or
    measured now by judges with no candidate (fresh: measured now, the cache replaced); and an error message (""
    when all were measured)."""
    workload_key = _workload_key(spec, device)  # the machine's fingerprint and the reference file, read once
    paths = {s: _cache_path(spec, workload_key, spec.shape(s), device) for s in shapes}
    missing = [s for s, p in paths.items() if fresh or not p.is_file()]
    error = _measure(spec, missing, device, gpus, timeout_s, paths) if missing else ""
    return {s: json.loads(p.read_text()) for s, p in paths.items() if p.is_file()}, error


def _measure(spec: WorkloadSpec, shapes: list[str], device: str, gpus: list[int], timeout_s: float,
             paths: dict[str, Path]) -> str:
    from cuco.runner.processes.launch import free_port, launch

    work = Path(tempfile.mkdtemp(prefix="cuco-bounds-"))
    try:
        job = Job(workload_root=str(spec.root), world=spec.world_size, candidate="", language="python", device=device,
                  stages=[Stage("bounds", s) for s in shapes], out_dir=str(work),
                  host_port=free_port(), mode="bounds", gpus=list(gpus), env=dict(spec.nccl_env))
        res = launch(job, timeout_s, work / "job.json")
        reports = [o.report for o in res.ranks]
        errors = [r.error for r in reports if r.error]
        if res.timed_out or errors or not all(r.done for r in reports):
            return "measuring the bound's references failed: " + (errors[0] if errors else "timeout" if res.timed_out
                                                                  else "a judge ended without a result")
        for st in reports[0].stages:
            assert isinstance(st, BoundsStage), st
            atomic_write_json(paths[st.shape], st.times())
        return ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
