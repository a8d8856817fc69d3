"""The judge's fixed cost per GPU run, at the decode shapes where it weighs most: what a run that does nothing costs
(the null runs each timed evaluation interleaves: start event, the inputs' unsealing, end events) against an empty
kernel between two CUDA events (queued behind a kernel that holds the stream, as the gate holds a run, so that the
host's launches stay out of both), and the inputs' delivery as the record shows it (`inputs ms`), for this tree and
(with --other) another checkout, one after the other on the same GPUs.

    python benchmarks/judge_fixed_cost.py [--other OLD_CHECKOUT] [--workload gemm_allreduce] [--world 2]
        [--shapes m1 m8 m128] [--candidate seed]

Writes benchmarks/results/judge_fixed_cost-w<world>.json and .md (the previous pair moves to archive/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import record

ROOT = record.ROOT
SNIPPET = r"""
import json, statistics, sys, torch
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload, resolve_workload
workload, world, name, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
spec = load_workload(resolve_workload(workload), world)
rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", shapes=shapes, gpus=list(range(world))))
rec = rec.to_dict() if hasattr(rec, "to_dict") else rec
stream, pairs = torch.cuda.Stream(0), []
with torch.cuda.stream(stream):
    torch.cuda._sleep(100_000_000)  # holds the stream while the pairs are queued, as the gate holds a run
    for _ in range(500):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream); torch.cuda._sleep(0); b.record(stream); pairs.append((a, b))
torch.cuda.synchronize()
empty = statistics.median(a.elapsed_time(b) for a, b in pairs)
out = {"ok": rec["ok"], "error": rec.get("error"), "empty_kernel_ms": empty, "shapes": {}}
for shape, s in rec["shapes"].items():
    t = s.get("timing") or {}
    if t.get("median_ms") is not None:
        out["shapes"][shape] = {k: t.get(k) for k in ("median_ms", "inputs_ms", "null_median_ms")}
print("RESULT " + json.dumps(out))
"""


def measure(tree: Path, args: argparse.Namespace) -> dict:
    proc = subprocess.run([sys.executable, "-c", SNIPPET, args.workload, str(args.world), args.candidate,
                           ",".join(args.shapes)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:], "shapes": {}}
    return json.loads(lines[-1][len("RESULT "):])


def rows(runs: dict) -> list[str]:
    """A row per tree and shape; a record that failed its checks (a bound it broke) still shows what was timed."""
    out = []
    for label, run in runs.items():
        verdict = "passed" if run["ok"] else f"failed: {str(run['error']).splitlines()[-1][:160]}"
        if not run["shapes"]:
            out.append(f"| {label} | | | | | | | {verdict} |")
        for shape, t in run["shapes"].items():
            null, empty = t["null_median_ms"], run["empty_kernel_ms"]
            over = "-" if null is None else f"{(null - empty) * 1e3:.1f}"
            out.append(f"| {label} | {shape} | {t['median_ms']:.4f} | {t['inputs_ms'] or 0:.4f} | "
                       f"{'-' if null is None else f'{null:.4f}'} | {empty:.4f} | {over} | {verdict} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, help="another checkout of cuco, measured after this one")
    ap.add_argument("--workload", default="gemm_allreduce")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--shapes", nargs="+", default=["m1", "m8", "m128"])
    ap.add_argument("--candidate", default="seed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    from cuco.machine import gpu_inventory

    trees = {"this tree": ROOT, **({"other": args.other.resolve()} if args.other else {})}
    runs = {label: measure(tree, args) for label, tree in trees.items()}
    info = record.meta({"gpus": gpu_inventory()}, args.world, other=str(args.other) if args.other else None)
    lines = [f"# The judge's fixed cost per GPU run ({info['date'][:10]}, {info['device']}, commit {info['commit']})",
             "", f"`{info['command']}`", "",
             f"{args.workload} / {args.candidate}: the null run (start event, the inputs' unsealing, end events) "
             "against an empty kernel between two events; `inputs` is the record's delivery time.", "",
             "| tree | shape | median ms | inputs ms | null run ms | empty kernel ms | null - empty, us | record |",
             "|---|---|---|---|---|---|---|---|"]
    lines += rows(runs)
    record.save(args.out, f"judge_fixed_cost-w{args.world}", info, {"runs": runs}, lines)


if __name__ == "__main__":
    main()
