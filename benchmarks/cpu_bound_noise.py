"""How far below its bound an honest candidate's median can fall on the CPU, from noise alone: the slack the
impossible-result rule needs there (timing.cpu_bound_slack).

Each round measures the CPU example's bound afresh (a new CUCO_HOME, so the references run again) and evaluates
the seed and every design point of its strategy, as `cuco eval` does. Two things can put an honest median below
its bound: the bound measured on a noisy moment (its spread from round to round: a program at the true bound
sits that far below the highest), and an honest program's own dip (the fastest median against the highest
bound). The slack covers the larger, with a margin. Writes
benchmarks/results/cpu_bound_noise.json and .md.

    python benchmarks/cpu_bound_noise.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import record

ROOT = record.ROOT
WORKLOAD = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"
MARGIN = 1.5  # the slack is this much more than the noise seen, for machines noisier than this one


def candidates(tmp: Path) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT))
    from cuco.evolve.strategy import materialize
    from cuco.workload import load_workload

    spec = load_workload(WORKLOAD)
    out = {"seed": spec.seed_path}
    for name, strategy in spec.strategies.items():
        for point in strategy.points():
            path = tmp / f"{name}-{point.label().replace('/', '_')}.py"
            path.write_text(materialize(strategy, point))
            out[f"{name} {point.label()}"] = path
    return out


def evaluate(path: Path, home: Path, out: Path) -> dict[str, float | None]:
    proc = record.cuco("eval", str(WORKLOAD), str(path), "--device", "cpu", "--out", str(out), tail=1,
                       env={"CUCO_HOME": str(home)})
    if proc.returncode != 0 or not out.is_file():
        return {"median_ms": None, "bound_ms": None}
    shape = json.loads(out.read_text())["shapes"]["tiny"]
    return {"median_ms": shape["timing"]["median_ms"], "bound_ms": shape["bound"]["bound_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cuco-noise-"))
    cands = candidates(tmp)
    rounds: list[dict[str, dict[str, float | None]]] = []
    for r in range(args.rounds):
        home = tmp / f"home{r}"
        rounds.append({name: evaluate(path, home, tmp / f"r{r}-{i}.json")
                       for i, (name, path) in enumerate(cands.items())})
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    bounds = [v["bound_ms"] for rd in rounds for v in rd.values() if v["bound_ms"]]
    medians = {name: [rd[name]["median_ms"] for rd in rounds if rd[name]["median_ms"]] for name in cands}
    worst = min(min(m) for m in medians.values() if m) / max(bounds)
    dip = max(0.0, 1.0 - worst)
    spread = 1.0 - min(bounds) / max(bounds)
    slack = round(min(0.9, max(0.05, MARGIN * max(dip, spread))), 2)
    info = record.meta(None, host=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    lines = [f"# Honest candidates against the CPU bound (cpu_allgather_matmul, shape tiny, world 2, {args.rounds} "
             "rounds)", "", f"Date {info['date']}, commit {info['commit']}, {info['host']}.", "",
             f"Command: `{info['command']}`", "",
             f"Bound (ms) per round, measured afresh: {', '.join(f'{b:.4f}' for b in sorted(set(bounds)))}",
             "", "| candidate | medians ms | fastest / highest bound |", "|---|---|---|"]
    for name, ms in medians.items():
        lines.append(f"| {name} | {', '.join(f'{m:.4f}' for m in ms) or 'failed'} | "
                     f"{(min(ms) / max(bounds)) if ms else float('nan'):.2f} |")
    lines += ["", f"The bound's spread over the rounds: {spread:.1%} below its highest; the deepest honest dip "
              f"below the highest bound: {dip:.1%}. The slack that covers the larger {MARGIN}x over: {slack:.0%} "
              "(timing.cpu_bound_slack)."]
    record.save(args.out, "cpu_bound_noise", info, {"rounds": rounds, "worst_ratio": worst, "bound_spread": spread,
                                                    "slack": slack}, lines)
    failed = [n for n, m in medians.items() if len(m) < args.rounds]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
