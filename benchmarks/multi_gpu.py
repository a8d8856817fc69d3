"""cuco beyond two GPUs in one command, on a machine with 4 or 8 GPUs.

1. `python benchmarks/gemm_workload.py --world W` for each W of 4 and 8 the machine holds: `cuco doctor`, the
   baselines and every shipped candidate at every shape (that script records its own table).
2. `pytest -m gpu tests/test_world_sizes.py`: every shipped candidate verified at world 4 and 8.
3. With 4 GPUs or more: a search of gemm_allgather (cuco.search, as `cuco evolve` runs it) at world 2 with one
   evaluation slot and then with two (two disjoint GPU pairs), the same number of evaluations each: wall time and
   evaluations per minute.

Writes benchmarks/results/multi_gpu.json and .md.

    python benchmarks/multi_gpu.py [--evals 12] [--shape 4k] [--steps tables tests slots]

Each step fits one device call of ten minutes on its own; --steps runs a subset and records what it ran.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = record.ROOT
STEPS = ("tables", "tests", "slots")


def run(*cmd: str) -> tuple[int, str, float]:
    """record.run, timed: exit status, output, seconds."""
    t0 = time.monotonic()
    proc = record.run(*cmd)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=12, help="evaluations per slot configuration (step 3)")
    ap.add_argument("--shape", default="4k", help="GEMM+AllGather shape of the slot comparison")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), help="which steps to run")
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    steps: dict[str, dict] = {}
    for world in (w for w in (4, 8) if w <= gpus and "tables" in args.steps):
        rc, _, secs = run(sys.executable, "benchmarks/gemm_workload.py", "--world", str(world), "--out", str(args.out))
        steps[f"gemm_allgather world {world}"] = {"ok": rc == 0, "seconds": round(secs)}
    if "tests" in args.steps:
        rc, out, secs = run(sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_world_sizes.py")
        said = [line for line in out.splitlines() if " passed" in line or " failed" in line]
        steps["pytest -m gpu tests/test_world_sizes.py"] = {"ok": rc == 0, "seconds": round(secs),
                                                            "summary": said[-1] if said else out[-200:]}
    slots = {}
    if gpus >= 4 and "slots" in args.steps:
        runs = Path(tempfile.mkdtemp())
        for n in (1, 2):
            run_dir = runs / f"slots{n}"
            t0 = time.monotonic()
            found = record.search("gemm_allgather", run_dir, 2, {"search.shape": args.shape, "search.seed": 0,
                                                                  "search.generations": args.evals, "search.slots": n})
            secs = time.monotonic() - t0
            s = record.summarize(run_dir)
            slots[n] = {"ok": found is not None and found.exit_code == 0, "seconds": round(secs, 1),
                        "evaluations": s["evaluations"],
                        "failed": s["failed"], "per_minute": round(60 * s["evaluations"] / secs, 1),
                        "best": s["best"]["label"], "best_ms": s["best"]["median_ms"]}
    from cuco.machine import load_machine

    info = record.meta(load_machine(), gpus=gpus, steps=steps)
    lines = [f"# cuco beyond two GPUs on {info['device']} ({info['links']})", "", f"Date {info['date']}, commit "
             f"{info['commit']}.", "", f"Command: `{info['command']}`"]
    if steps:
        lines += ["", "| step | result | seconds |", "|---|---|---|"]
        lines += [f"| {k} | {'ok' if v['ok'] else 'FAILED'} {v.get('summary', '')} | {v['seconds']} |"
                  for k, v in steps.items()]
    if slots:
        lines += ["", f"Evaluation slots, `cuco evolve gemm_allgather --world 2 --shape {args.shape}`:", "",
                  "| slots | evaluations (failed) | wall s | evaluations per minute | best | best ms |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {n} | {v['evaluations']} ({v['failed']}) | {v['seconds']} | {v['per_minute']} | {v['best']} | "
                  f"{v['best_ms']:.3f} |" for n, v in slots.items()]
    record.save(args.out, "multi_gpu", info, {"slots": slots}, lines, with_time=True)
    return 0 if all(v["ok"] for v in steps.values()) and all(v["ok"] for v in slots.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
