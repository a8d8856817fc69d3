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
import json
import sqlite3
import sys
from pathlib import Path

import record

ROOT = record.ROOT


def summarize(db_path: Path) -> dict:
    """A finished (or cut-off) run from its store. With no correct candidate, best is a row saying so (NaN times),
    so that the tables are still written."""
    nan = float("nan")
    if not db_path.is_file():
        return {"evaluations": 0, "failed": 0, "seed_ms": nan, "best": {"label": "no run", "median_ms": nan,
                "bound_ms": nan}, "best_found_at": None, "speedup_over_seed": nan, "best_over_bound": nan,
                "eval_seconds_mean": nan, "candidates": []}
    con = sqlite3.connect(db_path)
    con.row_factory = sqlite3.Row
    rows = [dict(r) for r in con.execute("SELECT id, label, proposer, ok, failed_level, score, median_ms, bound_ms, "
                                         "finished_at, eval_seconds FROM candidates WHERE status = 'done' "
                                         "ORDER BY finished_at, id")]
    seed_ms = next((r["median_ms"] for r in rows if r["proposer"] == "seed" and r["median_ms"]), nan)
    ok = [r for r in rows if r["ok"] and r["score"] is not None]
    best = max(ok, key=lambda r: r["score"]) if ok else {"label": "none correct", "median_ms": nan, "bound_ms": nan}
    best["speed_of_light_ms"] = nan
    if ok:  # the speed of light, from the best's own record (one shape: the search's)
        rec = json.loads(con.execute("SELECT record FROM candidates WHERE id = ?", (best["id"],)).fetchone()[0] or "{}")
        lights = [(s.get("bound") or {}).get("speed_of_light_ms") for s in (rec.get("shapes") or {}).values()]
        best["speed_of_light_ms"] = next((x for x in lights if x), nan)
    return {"evaluations": len(rows), "failed": len(rows) - len(ok), "seed_ms": seed_ms,
            "best": best, "best_found_at": rows.index(best) + 1 if ok else None,
            "speedup_over_seed": seed_ms / best["median_ms"] if ok else nan,
            "best_over_bound": best["median_ms"] / best["bound_ms"] if ok and best["bound_ms"] else nan,
            "eval_seconds_mean": sum(r["eval_seconds"] or 0 for r in rows) / max(1, len(rows)), "candidates": rows}


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
        proc = record.cuco("evolve", args.workload, "--shape", shape, "--generations", n, "--run-dir",
                           str(run_dir), "--seed", "0", "--world", str(world))
        stamp = record.stamp(f"evolve_{args.workload}-w{world}", info, with_time=True)
        log = args.out / "archive" / f"{stamp}-{shape}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        results[shape] = summarize(run_dir / "cuco.db")
        if (run_dir / "summary.json").is_file():  # the run's own summary, as `cuco evolve` wrote it
            results[shape]["run_summary"] = json.loads((run_dir / "summary.json").read_text())
        write(args, info, results)  # after every shape: a cut-off benchmark keeps what it finished
    return 0


if __name__ == "__main__":
    sys.exit(main())
