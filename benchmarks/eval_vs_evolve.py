"""One candidate, one shape, timed by `cuco eval` and by `cuco evolve`: both must take the same settings (the
workload's [timing] unless run.toml's [eval] sets them) and so report the same median within noise.

Alternates the two commands ROUNDS times each, so that drift of the machine falls on both alike, and records every
median with the iterations each took. Writes benchmarks/results/eval_vs_evolve.json and .md.

    python benchmarks/eval_vs_evolve.py [--workload gemm_allgather] [--shape 8k] [--world 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import record

ROOT = record.ROOT


def timing_of(path: Path, shape: str) -> dict:
    rec = json.loads(path.read_text())
    if not rec.get("ok"):
        raise SystemExit(f"{path}: the evaluation failed: {rec.get('error')}")
    s = rec["shapes"][shape]
    return {"median_ms": s["timing"]["median_ms"], "iters": s["timing"]["iters"],
            "spread_pct": s["timing"]["spread_pct"], "bound_ms": s["bound"]["bound_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--shape", default="8k")
    ap.add_argument("--world", type=int, default=None, help="ranks (default: the workload's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    world = ["--world", str(args.world)] if args.world else []
    work = Path(tempfile.mkdtemp(prefix="cuco-eval-vs-evolve-"))
    from cuco.evolve.rundir import RunDir

    runs: dict[str, list[dict]] = {"eval": [], "evolve": []}
    for r in range(args.rounds):
        out = work / f"eval-{r}.json"
        record.cuco("eval", args.workload, "seed", "--shape", args.shape, *world, "--out", str(out), tail=600)
        runs["eval"].append(timing_of(out, args.shape))
        run_dir = work / f"evolve-{r}"
        record.cuco("evolve", args.workload, "--shape", args.shape, *world, "--generations", "1",
                    "--run-dir", str(run_dir), tail=600)
        runs["evolve"].append(timing_of(RunDir(run_dir).best_record, args.shape))
    from cuco.machine import load_machine

    info = record.meta(load_machine(), world=args.world, workload=args.workload, shape=args.shape)
    medians = {k: statistics.median(t["median_ms"] for t in v) for k, v in runs.items()}
    lines = [f"# {args.workload} seed at {args.shape}: `cuco eval` and `cuco evolve` on the same settings", "",
             f"Date {info['date']}, {info['device']}, commit {info['commit']}. Rounds alternate the two commands; "
             "each median is the slowest rank's over its timed iterations.", "",
             "| round | command | median ms | iterations | spread | bound ms |", "|---|---|---|---|---|---|"]
    for r in range(args.rounds):
        for k in ("eval", "evolve"):
            t = runs[k][r]
            lines.append(f"| {r + 1} | {k} | {t['median_ms']:.4f} | {t['iters']} | {t['spread_pct']:.1f}% | "
                         f"{t['bound_ms']:.4f} |")
    gap = 100.0 * (medians["evolve"] - medians["eval"]) / medians["eval"]
    lines += ["", f"Median of the rounds: eval {medians['eval']:.4f} ms, evolve {medians['evolve']:.4f} ms "
              f"({gap:+.1f}%)."]
    record.save(args.out, "eval_vs_evolve", info, {"runs": runs, "medians_ms": medians, "gap_pct": gap}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
