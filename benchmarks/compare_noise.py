"""Whether a side-by-side comparison ever calls a program faster than itself: a byte-identical copy of the CPU
example's seed against the seed, `cuco compare` tried again and again on a loaded CPU.

Each try is one `cuco compare` (alternating rounds, cuco.runner.results.comparison); beside its verdict, what one
evaluation of each would have said (the first round's ratio, as a search's table reads), to show the noise it has to
beat. The load: busy processes, one per core unless told, running for the whole benchmark. Writes
benchmarks/results/compare_noise.json and .md.

    python benchmarks/compare_noise.py [--tries 20] [--rounds 5] [--load 2] [--iters N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import record

ROOT = record.ROOT
SEED = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul" / "seed.py"


def spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes beside the comparisons")
    ap.add_argument("--iters", type=int, default=None, help="timed runs per evaluation (default: the workload's)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()

    load = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    tries = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy_of_seed.py"
        shutil.copy(SEED, copy)
        try:
            for i in range(args.tries):
                iters = ["--iters", str(args.iters)] if args.iters else []
                proc = record.cuco("compare", "cpu_allgather_matmul", str(copy), "seed", "--rounds", str(args.rounds),
                                   *iters, "--json", tail=300, env={"CUCO_HOME": str(Path(tmp) / "home")})
                if proc.returncode != 0:
                    sys.exit(f"try {i + 1}: cuco compare exited {proc.returncode}: {proc.stderr[-2000:]}")
                got = json.loads(proc.stdout)
                got["one_evaluation_each"] = got["other_ms"][0] / got["this_ms"][0]
                tries.append(got)
                print(f"try {i + 1}/{args.tries}: {got['verdict']}, {got['speedup']:.2f}x "
                      f"[{got['low']:.2f}, {got['high']:.2f}]; one evaluation each: "
                      f"{got['one_evaluation_each']:.2f}x", flush=True)
        finally:
            for p in load:
                p.terminate()

    verdicts = [t["verdict"] for t in tries]
    single = [t["one_evaluation_each"] for t in tries]
    info = record.meta(None, device_kind="cpu", cpu=platform.processor() or platform.machine(),
                       cores=os.cpu_count(), load_processes=args.load, rounds=args.rounds, iters=args.iters)
    info["device"] = f"CPU, {os.cpu_count()} cores, {args.load} busy processes beside"
    lines = [f"# A copy of the seed against the seed, side by side ({info['date'][:10]}, {info['device']}, "
             f"commit {info['commit']})", "",
             f"`{info['command']}`", "",
             "| try | verdict | speedup | 99.9% interval | one evaluation each |", "|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {t['verdict']} | {t['speedup']:.2f}x | {t['low']:.2f}-{t['high']:.2f}x | "
              f"{t['one_evaluation_each']:.2f}x |" for i, t in enumerate(tries)]
    lines += ["", f"Within noise in {verdicts.count('within noise')} of {len(tries)} tries. One evaluation of each "
                  f"read from {min(single):.2f}x to {max(single):.2f}x; {sum(abs(s - 1) > 0.1 for s in single)} of "
                  f"them more than 10% away from 1.00x."]
    record.save(args.out, "compare_noise", info, {"tries": tries}, lines)


if __name__ == "__main__":
    main()
