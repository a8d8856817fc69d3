"""The CPU example at world sizes 2, 4 and 8 (gloo ranks on this machine's cores): a search end to end.

Shows that the runner and the search work beyond two ranks where no 4- or 8-GPU box is at hand. Times are CPU
times on an oversubscribed machine (8 ranks on 2 cores are noisy); what matters is that every evaluation is
verified at every world size. Writes benchmarks/results/cpu_world_sizes.json and .md.

    python benchmarks/cpu_world_sizes.py [--worlds 2 4 8] [--generations 6]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import record

ROOT = record.ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--generations", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp())
    results = {}
    for w in args.worlds:
        run_dir = runs / f"w{w}"
        record.search("cpu_allgather_matmul", run_dir, w, {"search.generations": args.generations, "search.seed": 0})
        results[w] = record.summarize(run_dir)
    info = record.meta(None, host=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    lines = [f"# cuco evolve cpu_allgather_matmul at world sizes {', '.join(map(str, args.worlds))} (gloo, CPU)", "",
             f"Date {info['date']}, commit {info['commit']}, {info['host']}. Shape 'tiny' (64,48,40), checked at 'odd' "
             "(24,17,56) too; slowest rank's median in ms.", "", f"Command: `{info['command']}`", "",
             "| world | evaluations (failed) | seed ms | best design point | best ms | found at evaluation |",
             "|---|---|---|---|---|---|"]
    for w, r in results.items():
        b = r["best"]
        lines.append(f"| {w} | {r['evaluations']} ({r['failed']}) | {r['seed_ms']:.3f} | {b['label']} | "
                     f"{b['median_ms']:.3f} | {r['best_found_at']} |")
    record.save(args.out, "cpu_world_sizes", info, {"results": results}, lines)
    return 0 if all(r["failed"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
