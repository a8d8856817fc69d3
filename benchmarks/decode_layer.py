"""A tensor-parallel decode layer (GEMM + AllReduce, or AllGather + GEMM, 1 to 128 tokens) at world 2: every
baseline and every point of the one-kernel strategies, in one run, on this machine's GPUs.

Each program is evaluated once over all the decode shapes (the full cascade: verified at the small and the full
shapes, timed with fresh inputs, L2 flushed, the slowest rank); the table gives, per shape, the strongest baseline,
the best one-kernel program, the speedup of one over the other, and both against the speed of light. Writes
benchmarks/results/decode_layer-<workload>-w<world>.json and .md.

    python benchmarks/decode_layer.py [--workload gemm_allreduce] [--shapes m1 m8 ...] [--strategies ar_decode ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import record

from cuco.evolve.strategy import materialize
from cuco.machine import load_machine
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload, resolve_workload

ROOT = record.ROOT
# Per workload: its decode shapes and the strategies that run a layer in one kernel.
DECODE = {"gemm_allreduce": (["m1", "m8", "m32", "m128"], ["ar_decode", "ar_decode_two_shot", "ar_gemm_fused"]),
          "gemm_allgather": (["decode"], ["ag_decode", "ag_decode_prefetch", "ag_gemm_fused"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(DECODE), default="gemm_allreduce")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--shapes", nargs="+", default=None, help="default: the workload's decode shapes")
    ap.add_argument("--strategies", nargs="+", default=None, help="default: its one-kernel strategies")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    args.shapes = args.shapes or DECODE[args.workload][0]
    args.strategies = args.strategies or DECODE[args.workload][1]
    spec = load_workload(resolve_workload(args.workload), args.world)
    record.cuco("doctor")  # the ceilings, for the speed of light
    work = Path(tempfile.mkdtemp())
    opts = EvalOptions(device="cuda", shapes=args.shapes, gpus=list(range(args.world)), work_dir=work / "eval")
    programs = [(name, "baseline", spec.candidates[name]) for name in spec.baselines]
    for sname in args.strategies:
        strategy = spec.strategies[sname]
        for point in strategy.points():
            src = work / "src" / f"{sname}-{point.label().replace('/', '_')}{strategy.path.suffix}"
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(materialize(strategy, point))
            programs.append((f"{sname} {point.label()}", "one kernel", src))
    rows = []
    for label, kind, src in programs:
        t0 = time.monotonic()
        rec = evaluate(spec, src, opts).to_dict()
        for shape in args.shapes:
            sh = rec["shapes"].get(shape, {})
            t, b = sh.get("timing", {}), sh.get("bound", {})
            rows.append({"program": label, "kind": kind, "shape": shape, "ok": rec["ok"], "error": rec["error"],
                         "median_ms": t.get("median_ms"), "p10_ms": t.get("p10_ms"), "p90_ms": t.get("p90_ms"),
                         "inputs_ms": t.get("inputs_ms"), "bound_ms": b.get("bound_ms"),
                         "speed_of_light_ms": b.get("speed_of_light_ms")})
        got = {r["shape"]: r["median_ms"] for r in rows[-len(args.shapes):]}
        print(json.dumps({"program": label, "ok": rec["ok"], "ms": got, "s": round(time.monotonic() - t0),
                          "error": (rec["error"] or "")[:200]}), flush=True)
    info = record.meta(load_machine(), args.world, workload=spec.name, shapes=args.shapes)
    record.save(args.out, f"decode_layer-{spec.name}-w{args.world}", info, {"rows": rows},
                markdown(spec.description, info, rows, args.shapes), with_time=True)
    return 0


def _fastest(rows: list[dict], shape: str, kind: str) -> dict | None:
    ok = [r for r in rows if r["shape"] == shape and r["kind"] == kind and r["ok"] and r["median_ms"]]
    return min(ok, key=lambda r: r["median_ms"]) if ok else None


def markdown(what: str, info: dict, rows: list[dict], shapes: list[str]) -> list[str]:
    lines = [f"# {info['workload']} at decode, world {info['world']}, on {info['device']} ({info['links']}): "
             f"{what}", "",
             f"Date {info['date']}, commit {info['commit']}. Times in ms: the slowest rank's median (p10-p90) over "
             "the timed runs, verified, L2 flushed, fresh inputs each run (`inputs` of it is the judge delivering "
             "them). Light: the speed of light from the measured ceilings.", "", f"Command: `{info['command']}`", "",
             "| shape | strongest baseline | ms | best one-kernel program | ms | speedup | light ms | best / light |",
             "|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        base, best = _fastest(rows, shape, "baseline"), _fastest(rows, shape, "one kernel")
        if not base or not best:
            lines.append(f"| {shape} | {base and base['program'] or '-'} | | {best and best['program'] or '-'} "
                         "| | | | |")
            continue
        light = best["speed_of_light_ms"]
        lines.append(f"| {shape} | {base['program']} | {base['median_ms']:.4f} | {best['program']} | "
                     f"{best['median_ms']:.4f} | {base['median_ms'] / best['median_ms']:.2f}x | "
                     f"{light:.4f} | {best['median_ms'] / light:.2f}x |" if light else
                     f"{best['median_ms']:.4f} | {base['median_ms'] / best['median_ms']:.2f}x | - | - |")
    lines += ["", "Every program at every shape:", "",
              "| program | shape | ms (p10-p90) | inputs ms | library bound ms |", "|---|---|---|---|---|"]
    for r in rows:
        if not r["ok"] or r["median_ms"] is None:
            lines.append(f"| {r['program']} | {r['shape']} | failed: {(r['error'] or '')[:100]} | | |")
            continue
        lines.append(f"| {r['program']} | {r['shape']} | {r['median_ms']:.4f} ({r['p10_ms']:.4f}-{r['p90_ms']:.4f}) "
                     f"| {r['inputs_ms'] or 0:.4f} | {r['bound_ms'] or 0:.4f} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
