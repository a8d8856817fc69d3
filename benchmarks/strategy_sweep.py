"""Time chosen design points of a workload's strategy at one full shape, beside the seed.

Where `evolve_workload.py` measures what the search finds, this measures the design space itself:
every accepted point whose label matches one of the patterns, through the full cascade (L0-L4, verified at
the small and the full shape), on this machine's GPUs. Writes
benchmarks/results/strategy_sweep-<shape>.json and .md (strategy_sweep-<workload>-<shape>-w<world> for another
workload or world than GEMM+AllGather's default).

    python benchmarks/strategy_sweep.py --shape 8k --points 'ce/*' 'lsa/stream_overlap/*/cta/2' [--out DIR]
    python benchmarks/strategy_sweep.py --workload moe_deepseek_v3 --strategy moe_lsa --shape t128 --points '*'
    python benchmarks/strategy_sweep.py --workload gemm_allreduce --source cuco/builtin/gemm_allreduce/seed.cu \
        --strategy rewrite_ctas64 --shape m128 --points 'lsa/stream_overlap/chunk/*'

With --source, the strategies are the knobs of that program's rules' rewrite (cuco transform --explain lists them:
rewrite_ctas32, rewrite_ctas64, rewrite_ctas128), as `cuco evolve --set search.space=knobs` searches them.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = record.ROOT
sys.path.insert(0, str(ROOT))

from cuco.evolve.strategy import materialize, prebuild  # noqa: E402
from cuco.fastpath.analyze import analyze  # noqa: E402
from cuco.fastpath.knobs import derive  # noqa: E402
from cuco.machine import load_machine  # noqa: E402
from cuco.runner.cascade import EvalOptions, evaluate  # noqa: E402
from cuco.workload import load_workload, resolve_workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--strategy", default="ag_gemm")
    ap.add_argument("--world", type=int, default=None, help="ranks (default: the workload's)")
    ap.add_argument("--shape", default="8k")
    ap.add_argument("--points", nargs="+", default=["*"], help="fnmatch patterns on design-point labels")
    ap.add_argument("--source", type=Path, help="a CUDA program of the workload: the knobs of its rules' rewrite")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    spec = load_workload(resolve_workload(args.workload), args.world)
    work = Path(tempfile.mkdtemp())
    strategies = spec.strategies
    if args.source:
        strategies = derive(analyze(args.source.resolve()), spec).strategies(work / "knobs", spec)
    strategy = strategies[args.strategy]
    points = [p for p in strategy.points() if any(fnmatch.fnmatch(p.label(), pat) for pat in args.points)]
    t0 = time.monotonic()
    prebuild(strategy, work / "prebuilt", points=points)
    print(f"{len(points)} points, prebuilt in {time.monotonic() - t0:.0f} s", flush=True)
    gpus = list(range(spec.world_size))
    opts = EvalOptions(device="cuda", shapes=[args.shape], gpus=gpus, work_dir=work / "eval")

    def run(label: str, src: Path) -> dict:
        rec = evaluate(spec, src, opts).to_dict()
        sh = rec["shapes"].get(args.shape, {})
        t, b = sh.get("timing", {}), sh.get("bound", {})
        row = {"label": label, "ok": rec["ok"], "error": rec["error"], "median_ms": t.get("median_ms"),
               "p10_ms": t.get("p10_ms"), "p90_ms": t.get("p90_ms"), "bound_ms": b.get("bound_ms"),
               "references_ms": sh.get("references_ms")}
        print(json.dumps({k: row[k] for k in ("label", "ok", "median_ms", "bound_ms", "error")}), flush=True)
        return row

    rows = [run("seed", spec.seed_path)]
    for p in points:
        src = work / "src" / (p.label().replace("/", "_") + strategy.path.suffix)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(materialize(strategy, p))
        rows.append(run(p.label(), src))
    write(args, spec, rows)


def write(args, spec, rows: list[dict]) -> None:
    info = record.meta(load_machine(), spec.world_size, shape=args.shape, workload=spec.name, strategy=args.strategy,
                       source=str(args.source) if args.source else None)
    seed = rows[0]["median_ms"]
    of = f" (a knob of the rules' rewrite of {args.source.name})" if args.source else ""
    lines = [f"# {spec.name} strategy {args.strategy}{of} at {args.shape}, world {spec.world_size}, on "
             f"{info['device']} ({info['links']})", "",
             f"Date {info['date']}, commit {info['commit']}. Slowest rank's median (p10-p90) in ms, verified; "
             "bound = the library bound (the workload's own work at the library's measured rates).",
             "", f"Command: `{info['command']}`", "",
             "| point | ms | p10-p90 | bound | time / bound | speedup over seed |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (not r["ok"], r["median_ms"] or 1e9)):
        if not r["ok"]:
            lines.append(f"| {r['label']} | failed: {(r['error'] or '')[:80]} | | | | |")
            continue
        lines.append(f"| {r['label']} | {r['median_ms']:.3f} | {r['p10_ms']:.3f}-{r['p90_ms']:.3f} | "
                     f"{r['bound_ms']:.3f} | {r['median_ms'] / r['bound_ms']:.2f}x | "
                     f"{seed / r['median_ms'] if seed else float('nan'):.2f}x |")
    name = f"strategy_sweep-{args.shape}"
    if (spec.name, spec.world_size) != ("gemm_allgather", 2) or args.source:
        name = f"strategy_sweep-{spec.name}-{args.shape}-w{spec.world_size}"
    if args.source:
        name += f"-knobs-of-{args.source.stem}"
    record.save(args.out, name, info, {"rows": rows}, lines, with_time=True)


if __name__ == "__main__":
    main()
