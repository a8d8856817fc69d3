"""What an evaluation costs through Ray (search.backend = ray) against the local backend, on this machine.

The same candidate (the workload's seed) is evaluated by the evaluator `cuco evolve` uses for each backend, rounds
alternating, and the wall time of each evaluation is kept: the difference of the medians is the overhead a
Ray task adds (shipping the job, scheduling, the worker, the record's way back). Ray runs on this machine (no
--address) or on the cluster given. Writes benchmarks/results/ray_overhead-<device>.json and .md.

    python benchmarks/ray_overhead.py [--workload cpu_allgather_matmul] [--device cpu] [--rounds 5] [--address A]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = record.ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="cpu_allgather_matmul")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--address", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from cuco.cluster.ray_slots import RayBackend
    from cuco.evolve.config import RunConfig
    from cuco.evolve.slots import local_evaluator, make_slots
    from cuco.machine import load_machine
    from cuco.workload import load_workload, resolve_workload

    spec = load_workload(resolve_workload(args.workload))
    shape = args.shape or spec.shapes[0].name
    cfg = RunConfig()
    local = local_evaluator(args.device, cfg.eval, shape)
    slot = make_slots(args.device, spec.world_size, 1)[0]
    cluster = RayBackend.connect(args.address, args.device, spec.world_size, retries=0)
    remote = cluster.evaluator(cfg, shape)
    src = spec.candidates["seed"]
    work = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    times: dict[str, list[float]] = {"local": [], "ray": []}
    medians: dict[str, list[float]] = {"local": [], "ray": []}  # the candidate's own timed median, ms
    for i in range(args.rounds):
        for name, evaluate in (("local", local), ("ray", remote)):
            t0 = time.monotonic()
            rec = evaluate(spec, src, slot, work / f"{name}-{i}")
            times[name].append(time.monotonic() - t0)
            if not rec.ok:
                print(f"{name} round {i}: {rec.failed_level}: {rec.error}", file=sys.stderr)
                return 1
            medians[name].append(rec.median_ms(shape))
            print(f"round {i} {name}: {times[name][-1]:.2f} s, median {medians[name][-1]:.3f} ms", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    host = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    machine = load_machine() if args.device == "cuda" else None
    info = record.meta(machine, spec.world_size if machine else None, host=host, workload=spec.name, shape=shape)
    lines = [f"# Evaluation through Ray against the local backend: {spec.name} ({shape}), {args.device}", "",
             f"Date {info['date']}, commit {info['commit']}, {host}; "
             f"Ray {'at ' + args.address if args.address else 'started on this machine'}. "
             f"The seed evaluated {args.rounds} times by each backend's evaluator, rounds alternating; wall "
             "seconds per evaluation, and the median time the evaluation measured for the candidate itself.", "",
             f"Command: `{info['command']}`", "",
             "| backend | median s | min s | max s | candidate's median ms (median of the rounds) |",
             "|---|---|---|---|---|"]
    lines += [f"| {k} | {med[k]:.2f} | {min(v):.2f} | {max(v):.2f} | {statistics.median(medians[k]):.3f} |"
              for k, v in times.items()]
    lines += ["", "Overhead of a Ray task per evaluation (difference of the medians): "
                  f"{med['ray'] - med['local']:.2f} s."]
    name = f"ray_overhead-{args.device}"
    record.save(args.out, name, info, {"seconds": times, "median_s": med, "overhead_s": med["ray"] - med["local"],
                                       "candidate_median_ms": medians}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
