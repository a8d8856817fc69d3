"""A built-in workload on this GPU machine: baselines, bounds and every shipped candidate at every shape.

Runs `cuco doctor`, `cuco baseline WORKLOAD`, then `cuco eval` of each shipped candidate that is not a baseline,
through the real CLI, and writes benchmarks/results/<workload>-w<world>.json and .md (time, bound, efficiency and
speedups over each baseline per candidate and shape, with date, device and commit).

    python benchmarks/gemm_workload.py [--workload gemm_allgather] [--world 2] [--iters 30] [--shape 8k ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import record

ROOT = record.ROOT
RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.paths import cuco_home
    from cuco.workload import load_workload, resolve_workload

    spec = load_workload(resolve_workload(args.workload), args.world)
    common = ["--world", str(args.world), "--device", "cuda"] + [x for s in args.shape for x in ("--shape", s)]
    if args.iters:
        common += ["--iters", str(args.iters)]
    record.cuco("doctor")
    machine = load_machine()
    record.cuco("baseline", spec.name, *common)
    records = json.loads((cuco_home() / "baselines" / f"{spec.name}-w{args.world}-cuda.json").read_text())
    tmp = cuco_home() / "bench"
    tmp.mkdir(exist_ok=True)
    for name in spec.candidates:
        if name in records:
            continue
        out = tmp / f"{name}.json"
        out.unlink(missing_ok=True)
        proc = record.cuco("eval", spec.name, name, "--out", str(out), *common)
        if out.is_file():
            records[name] = json.loads(out.read_text())
        else:  # cannot run here: cuco said why in its last line; a row of the table, not the end of it
            said = (proc.stdout + proc.stderr).strip().splitlines()
            records[name] = {"ok": False, "failed_level": "-", "error": said[-1] if said else "no record"}

    info = record.meta(machine, args.world, peer_bw_gbps=machine.get("peer_bw_gbps"),
                       gemm_bf16_tflops=machine.get("gemm_bf16_tflops"))
    record.save(args.out, f"{spec.name}-w{args.world}", info, {"records": records}, markdown(spec, info, records))
    return 0 if all(r["ok"] for r in records.values()) else 1


def markdown(spec, meta: dict, records: dict) -> list[str]:
    lines = [f"# {spec.name} on {meta['device']} ({meta['links']}): {spec.description}", "",
             f"Date {meta['date']}, commit {meta['commit']}, world {meta['world']}; peer link "
             f"{meta['peer_bw_gbps']:.0f} GB/s per direction, bf16 GEMM {meta['gemm_bf16_tflops']:.0f} TFLOP/s "
             f"(measured by cuco doctor). Times in ms: the slowest rank per iteration, median (p10-p90) over the "
             f"timed iterations, L2 flushed, all ranks released by one gate. Bound = max(cuBLAS alone, bytes / "
             f"peer bandwidth); efficiency = bound / time.", "", f"Command: `{meta['command']}`", ""]
    refs = list(spec.baselines)
    lines += ["| shape | candidate | verified | median ms (p10-p90) | bound ms | efficiency | "
              + " | ".join(f"vs {r}" for r in refs) + " |", "|---" * (6 + len(refs)) + "|"]
    measured = [s for s in spec.shapes if any(s.name in r.get("shapes", {}) for r in records.values())]
    for shape in measured or spec.shapes:
        label = f"{shape.name} ({shape.label()})"
        for name, rec in records.items():
            s = rec.get("shapes", {}).get(shape.name, {})
            t = s.get("timing")
            if not t:
                err = (rec.get("error") or "not run")[:80].replace("|", "/")
                lines.append(f"| {label} | {name} | no: {rec.get('failed_level')} {err} |" + " |" * (3 + len(refs)))
                continue
            sp = []
            for r in refs:
                rt = records.get(r, {}).get("shapes", {}).get(shape.name, {}).get("timing", {}).get("median_ms")
                sp.append(f"{rt / t['median_ms']:.2f}x" if rt else "-")
            lines.append(f"| {label} | {name} | {'yes' if rec['ok'] else 'no'} | {t['median_ms']:.3f} "
                         f"({t['p10_ms']:.3f}-{t['p90_ms']:.3f}) | {s['bound']['bound_ms']:.3f} | "
                         f"{s.get('efficiency', 0):.2f} | " + " | ".join(sp) + " |")
    lines += ["", "References per shape (ms, slowest rank, median): the computation alone (cuBLAS), the collective "
              "alone (NCCL), the communication bound.", "", "| shape | compute alone | NCCL alone | comm bound |",
              "|---|---|---|---|"]
    for shape in spec.shapes:
        for rec in records.values():
            s = rec.get("shapes", {}).get(shape.name, {})
            if s.get("references_ms"):
                r, b = s["references_ms"], s["bound"]
                lines.append(f"| {shape.name} ({shape.label()}) | {r.get('compute_alone', 0):.3f} | "
                             f"{r.get('comm_alone', 0):.3f} | {b['comm_ms']:.3f} |")
                break
    return lines


if __name__ == "__main__":
    sys.exit(main())
