"""`cuco evolve WORKLOAD` with the directive proposer at every shape, on this GPU machine.

Writes benchmarks/results/evolve_<workload>-w<world>.json and .md: per shape, the seed's time, the best program's
design point, time, bound, efficiency and speedup over the seed, and the evaluation at which the best appeared.
Each search's console output goes to results/archive/ beside the dated tables. The plan defaults to 40
evaluations at the workload's first shape and 12 at each other one.

    python benchmarks/evolve_workload.py [--workload gemm_allgather] [--plan 8k:40 4k:12 ...] [--world N] [--runs DIR]
                                         [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import record

ROOT = record.ROOT


def prebuild(spec) -> None:
    """Compile every design point of the workload's strategies at once: the search then pays no compile."""
    import tempfile
    import time

    from cuco.evolve.strategy import prebuild as build_all

    t0 = time.monotonic()
    for name, strategy in spec.strategies.items():
        ok, n = build_all(strategy, Path(tempfile.mkdtemp()))
        print(f"{name}: prebuilt {ok}/{n} design points in {time.monotonic() - t0:.0f} s", flush=True)


def write(args, info: dict, results: dict) -> None:
    where = f"{info['device']} ({info['links'] or 'one GPU'})"
    lines = [f"# cuco evolve {args.workload} (directive proposer, no LLM) on {where}", "",
             f"Date {info['date']}, commit {info['commit']}. Each shape is its own run (seed 0); times are the "
             "slowest rank's median in ms as `cuco eval` measures them; bound = max(cuBLAS alone, bytes / peer "
             "bandwidth); speed of light: from the machine's ceilings alone (the best's record).", "",
             f"Command: `{info['command']}`", "",
             "| shape | evaluations (failed) | seed ms | best design point | best ms | bound ms | best / bound | "
             "speed of light ms | best / light | speedup over seed | best found at evaluation |",
             "|---" * 11 + "|"]
    for shape, r in results.items():
        b = r["best"]
        lines.append(f"| {shape} | {r['evaluations']} ({r['failed']}) | {r['seed_ms']:.3f} | {b['label']} | "
                     f"{b['median_ms']:.3f} | {b['bound_ms']:.3f} | {r['best_over_bound']:.2f}x | "
                     f"{b['speed_of_light_ms']:.3f} | {b['median_ms'] / b['speed_of_light_ms']:.2f}x | "
                     f"{r['speedup_over_seed']:.2f}x | {r['best_found_at']} |")
    record.save(args.out, f"evolve_{args.workload}-w{info['world']}", info, {"results": results}, lines, with_time=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--plan", nargs="*", default=None, help="SHAPE:EVALUATIONS pairs")
    ap.add_argument("--world", type=int, help="ranks (default: the workload's; 1 for a dry run on one GPU)")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/cuco-evolve-runs"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if record.cuco("doctor").returncode:  # the device facts every bound needs
        return 1
    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.workload import load_workload, resolve_workload

    spec = load_workload(resolve_workload(args.workload))
    if args.plan is None:
        args.plan = [f"{s.name}:{40 if i == 0 else 12}" for i, s in enumerate(spec.shapes)]
    world = args.world or spec.world_size
    # one date for the run: its file is rewritten per shape
    info = record.meta(load_machine(), world=world, plan=args.plan)
    prebuild(spec)
    results = {}
    for item in args.plan:
        shape, n = item.split(":")
        run_dir = args.runs / f"{args.workload}-w{world}" / shape  # a search resumes only its own
        found = record.search(args.workload, run_dir, world, {"search.shape": shape, "search.generations": n,
                                                               "search.seed": 0})
        results[shape] = record.summarize(run_dir)
        if found is not None:  # what the search ended with, as summary.json says it
            results[shape]["run_summary"] = found.summary()
        write(args, info, results)  # after every shape: a cut-off benchmark keeps what it finished
    return 0


if __name__ == "__main__":
    sys.exit(main())
