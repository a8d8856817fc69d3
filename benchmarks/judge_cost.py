"""What the isolated judge costs and changes: the same candidates evaluated by this tree and by another checkout
of cuco (the runner before the judge moved out of the candidate's process), one after the other on the same GPUs.

For each candidate and tree: the median time of each shape (slowest rank), the judge's own clock, the bound, the
evaluation's wall time (builds done beforehand, so they are not in it) and the verdict.

    python benchmarks/judge_cost.py --other /path/to/other/checkout [--world 2] [--shapes 8k 4k]
        [--candidates seed device_lsa host_two_stream torch_host] [--rounds 2]
    python benchmarks/judge_cost.py --other ... --device cpu --workload cpu_allgather_matmul --shapes tiny
        --candidates seed --rounds 8

Writes benchmarks/results/judge_cost.json and .md (judge_cost-cpu on the CPU; the previous pair moves to
benchmarks/results/archive/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import record

ROOT = record.ROOT
SNIPPET = r"""
import json, sys, time
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload
workload, world, name, shapes, level, device = (sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(","),
                                                 sys.argv[5], sys.argv[6])
spec = load_workload(workload, world)
t0 = time.monotonic()
rec = evaluate(spec, spec.candidates[name], EvalOptions(device=device, shapes=shapes, max_level=level,
               gpus=list(range(world)) if device == "cuda" else []))
rec = rec.to_dict() if hasattr(rec, "to_dict") else rec  # an EvalRecord here, a dict in an older checkout
out = {"ok": rec["ok"], "error": rec.get("error"), "seconds": time.monotonic() - t0, "shapes": {}}
for s, r in rec.get("shapes", {}).items():
    t = r.get("timing") or {}
    out["shapes"][s] = {"median_ms": t.get("median_ms"), "spread_pct": t.get("spread_pct"),
                        "judge_median_ms": t.get("judge_median_ms"), "clock": t.get("clock"),
                        "bound_ms": (r.get("bound") or {}).get("bound_ms")}
print("RESULT " + json.dumps(out))
"""


def _workload_dir(tree: Path, name: str) -> Path:
    """The workload in any layout a checkout has had: cuco/builtin/, cuco/workloads/, a top-level workloads/."""
    places = (tree / "cuco" / "builtin", tree / "cuco" / "workloads", tree / "workloads")
    return next(p / name for p in places if (p / name).is_dir())


def evaluate(tree: Path, home: Path, args, name: str, level: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "CUCO_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", SNIPPET, str(_workload_dir(tree, args.workload)), str(args.world),
                           name, ",".join(args.shapes), level, args.device], cwd=tree, env=env, text=True,
                          capture_output=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"ok": False, "error": (proc.stdout + proc.stderr)[-800:], "seconds": None, "shapes": {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="another checkout of cuco to compare with")
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--world", type=int, default=None, help="ranks (default: 2, or 1 on a machine of one GPU)")
    ap.add_argument("--shapes", nargs="+", default=["8k", "4k"])
    ap.add_argument("--candidates", nargs="+", default=["seed", "device_lsa", "host_two_stream", "torch_host"])
    ap.add_argument("--rounds", type=int, default=2, help="evaluations per candidate and tree, interleaved")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    import torch

    args.world = args.world or (2 if args.device == "cpu" else min(2, torch.cuda.device_count()))
    trees = {"this tree": ROOT, "other": args.other.resolve()}
    homes = {k: Path(tempfile.mkdtemp(prefix="cuco-home-")) for k in trees}
    for k, tree in trees.items():  # builds (and the bound's references) outside the timed comparison
        for name in args.candidates:
            evaluate(tree, homes[k], args, name, "L1")
    runs: dict[str, dict[str, list[dict]]] = {k: {n: [] for n in args.candidates} for k in trees}
    for _ in range(args.rounds):
        for name in args.candidates:
            for k, tree in trees.items():
                runs[k][name].append(evaluate(tree, homes[k], args, name, "L4"))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    lines = [f"# What the judge costs: {args.workload}, world {args.world}, {where}", "",
             f"Date {record.meta()['date']}, commit {record.commit()}; other: {args.other}.", "",
             "ms, slowest rank, median of each evaluation; seconds of wall time per evaluation (builds excluded)", "",
             "| candidate | shape | other: median | this tree: median | this tree: judge's clock | bound | other: s | "
             "this tree: s | verdicts |", "|---|---|---|---|---|---|---|---|---|"]
    for name in args.candidates:
        for shape in args.shapes:
            med = {k: [r["shapes"].get(shape, {}).get("median_ms") for r in runs[k][name]] for k in trees}
            judge = [r["shapes"].get(shape, {}).get("judge_median_ms") for r in runs["this tree"][name]]
            bound = next((r["shapes"][shape]["bound_ms"] for r in runs["this tree"][name] if shape in r["shapes"]),
                         None)
            secs = {k: [r["seconds"] for r in runs[k][name] if r["seconds"]] for k in trees}
            verdicts = " / ".join(k + ": " + ",".join("ok" if r["ok"] else "FAIL" for r in runs[k][name])
                                  for k in trees)
            lines.append(f"| {name} | {shape} | {_fmt(med['other'])} | {_fmt(med['this tree'])} | {_fmt(judge)} | "
                         f"{bound and f'{bound:.4f}'} | {_fmt(secs['other'], 1)} | {_fmt(secs['this tree'], 1)} | "
                         f"{verdicts} |")
    failures = [f"{k} {n}: {r['error']}" for k in trees for n in args.candidates for r in runs[k][n] if not r["ok"]]
    lines += [""] + [f"- {f}" for f in failures]
    sys.path.insert(0, str(ROOT))
    from cuco.machine import gpu_inventory

    info = record.meta({"gpus": gpu_inventory()} if args.device == "cuda" else None, world=args.world,
                       other=str(args.other))
    name = "judge_cost" if args.device == "cuda" else "judge_cost-cpu"
    record.save(args.out, name, info, {"runs": runs}, lines, with_time=True)
    return 0


def _fmt(values: list, nd: int = 4) -> str:
    vals = [v for v in values if v is not None]
    return " ".join(f"{v:.{nd}f}" for v in vals) if vals else "-"


if __name__ == "__main__":
    sys.exit(main())
