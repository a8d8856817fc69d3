"""`cuco evolve` on users' own programs without an LLM: for each program of the fast path's corpus that the rules
rewrite, the directive proposer over the knobs of its rewrite (search.space = knobs), then the program itself, the
rules' rewrite (`cuco transform`) and the best program found timed by `cuco eval` in alternating rounds, beside the
speed of light and the library bound.

A program's search and its rounds are kept under --runs (a search resumes where it stopped), and the table is made
from every program found there: one device call may run a few programs, and the last call's table holds them all.
Writes benchmarks/results/knobs_search-w<world>.json and .md.

    python benchmarks/knobs_search.py [--world 2] [--evals 20] [--rounds 2] [--programs NAME ...] [--runs DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import record

ROOT = record.ROOT
FASTPATH = ROOT / "tests" / "fastpath"
WORKLOADS = ROOT / "cuco" / "builtin"
# program -> (built-in workload whose buffers, reference and bounds it runs on, the program's file): every program
# the rules rewrite, as tests/test_fastpath_knobs.py lists them (its GPU test runs each point once at world 1).
PROGRAMS = {
    "typed_pointers": ("allreduce_sum", FASTPATH / "corpus" / "typed_pointers.cu"),
    "two_halves": ("allreduce_sum", FASTPATH / "corpus" / "two_halves.cu"),
    "buffer_table": ("sendrecv_ring", FASTPATH / "corpus" / "buffer_table.cu"),
    "gemm_rs_scratch": ("gemm_reducescatter", FASTPATH / "corpus" / "gemm_rs_scratch.cu"),
    "gemm_ar_macros": ("gemm_allreduce", FASTPATH / "corpus" / "gemm_ar_macros.cu"),
    "inplace_allgather": ("allgather_bf16", FASTPATH / "corpus" / "inplace_allgather.cu"),
    "pairwise_loop": ("alltoall_bf16", FASTPATH / "corpus" / "pairwise_loop.cu"),
    "own_block_loop": ("alltoall_bf16", FASTPATH / "corpus" / "own_block_loop.cu"),
    "host_allreduce_scratch": ("allreduce_sum", FASTPATH / "host_allreduce_scratch.cu"),
    "host_halo_exchange": ("sendrecv_ring", FASTPATH / "host_halo_exchange.cu"),
    "overlap_beside": ("allgather_bf16", FASTPATH / "knobs" / "overlap_beside.cu"),
    "gather_gemm_ex": ("gemm_allgather", FASTPATH / "knobs" / "gather_gemm_ex.cu"),
    "gemm_ar_ex": ("gemm_allreduce", FASTPATH / "knobs" / "gemm_ar_ex.cu"),
    **{f"{wl}_seed": (wl, WORKLOADS / wl / "seed.cu")
       for wl in ("gemm_allgather", "gemm_reducescatter", "allreduce_sum", "reducescatter_sum", "allgather_bf16",
                  "alltoall_bf16", "sendrecv_ring", "gemm_allreduce")},
}
TIMED = ("program", "rewrite", "best")


def timed(rec: dict, shape: str) -> dict:
    """What the table needs of one `cuco eval` record at `shape`."""
    s = (rec.get("shapes") or {}).get(shape) or {}
    bound = s.get("bound") or {}
    return {"ok": rec.get("ok", False), "error": rec.get("error"),
            "median_ms": (s.get("timing") or {}).get("median_ms"), "bound_ms": bound.get("bound_ms"),
            "speed_of_light_ms": bound.get("speed_of_light_ms")}


def search(name: str, args, shape: str) -> dict:
    """One program: its search (resumed if cut), its rules' rewrite, and the three timed in alternating rounds."""
    workload, program = PROGRAMS[name]
    runs = args.runs / f"w{args.world}" / name  # a world's searches resume only their own
    runs.mkdir(parents=True, exist_ok=True)
    world = ["--world", str(args.world)]
    found = record.search(workload, runs / "search", args.world, {
        "search.shape": shape, "search.generations": args.evals, "search.seed": 0, "search.start": program,
        "search.space": "knobs"})
    rewrite = runs / "rewrite.cu"
    record.cuco("transform", workload, "--source", str(program), "--out", str(rewrite), *world)
    best = next(found.run_dir.best.glob("candidate.*"), None) if found and found.best else None
    files = {"program": program, "rewrite": rewrite if rewrite.is_file() else None, "best": best}
    rounds: dict[str, list[dict]] = {k: [] for k in TIMED}
    for r in range(args.rounds):
        for what in TIMED if r % 2 == 0 else reversed(TIMED):
            if files[what] is None:
                continue
            out = runs / f"{what}-{r}.json"
            out.unlink(missing_ok=True)  # a record left by an earlier call is not this round's
            record.cuco("eval", workload, str(files[what]), "--shape", shape, "--out", str(out), *world, tail=600)
            rounds[what].append(timed(json.loads(out.read_text()), shape) if out.is_file() else
                                {"ok": False, "error": "cuco eval wrote no record"})
    found = record.summarize(runs / "search")
    result = {"workload": workload, "program": str(program.relative_to(ROOT)), "shape": shape,
              "evaluations": found["evaluations"], "failed": found["failed"], "best_label": found["best"]["label"],
              "best_found_at": found["best_found_at"]}
    for what in TIMED:
        runs_ok = [t for t in rounds[what] if t["ok"] and t["median_ms"]]
        result[what] = ({"median_ms": statistics.median(t["median_ms"] for t in runs_ok), "rounds": rounds[what],
                         "bound_ms": runs_ok[-1]["bound_ms"], "speed_of_light_ms": runs_ok[-1]["speed_of_light_ms"]}
                        if runs_ok else {"error": next((t["error"] for t in rounds[what]), "not run"),
                                         "rounds": rounds[what]})
    (runs / "result.json").write_text(json.dumps(result, indent=1))
    return result


def markdown(info: dict, results: dict[str, dict]) -> list[str]:
    lines = [f"# Users' programs searched without an LLM (the knobs of their rewrite), world {info['world']}", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}. Per program: `cuco evolve` with the "
             "directive proposer over the knobs of the rules' rewrite (search.space = knobs), then the program, its "
             "rules' rewrite and the best found, each timed by `cuco eval` (slowest rank, median ms) in alternating "
             "rounds, medians of the rounds. vs rewrite: the rewrite's time over the best's.", "",
             f"Command: `{info['command']}`", "",
             "| program | workload, shape | evaluations (failed) | program ms | rewrite ms | best ms | "
             "best design point | vs rewrite | speed of light ms | best / light | library bound ms |",
             "|---" * 11 + "|"]

    def ms(t: dict) -> str:
        return f"{t['median_ms']:.4f}" if t.get("median_ms") else (t.get("error") or "-")[:60].replace("|", "/")

    for name, r in results.items():
        best, rewrite = r["best"], r["rewrite"]
        light = best.get("speed_of_light_ms") or rewrite.get("speed_of_light_ms")
        bound = best.get("bound_ms") or rewrite.get("bound_ms")
        done = best.get("median_ms")
        vs = f"{rewrite['median_ms'] / done:.2f}x" if done and rewrite.get("median_ms") else "-"
        of_light = f"{done / light:.2f}x" if done and light else "-"
        lines.append(f"| {name} | {r['workload']}, {r['shape']} | {r['evaluations']} ({r['failed']}) | "
                     f"{ms(r['program'])} | {ms(rewrite)} | {ms(best)} | {r['best_label'] or 'the program itself'} | "
                     f"{vs} | "
                     f"{f'{light:.4f}' if light else '-'} | {of_light} | {f'{bound:.4f}' if bound else '-'} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--evals", type=int, default=20, help="evaluations per search, the program's own included")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three timed programs")
    ap.add_argument("--programs", nargs="+", choices=sorted(PROGRAMS), default=sorted(PROGRAMS))
    ap.add_argument("--shape", help="one shape for every program (default: each workload's first)")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/cuco-knobs-runs"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if record.cuco("doctor").returncode:  # the ceilings every speed of light needs
        return 1
    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.workload import load_workload

    for name in args.programs:
        shape = args.shape or load_workload(WORKLOADS / PROGRAMS[name][0]).shapes[0].name
        print(f"== {name} ({PROGRAMS[name][0]}, {shape})", flush=True)
        search(name, args, shape)
    results = {p.parent.name: json.loads(p.read_text()) for p in sorted(args.runs.glob(f"w{args.world}/*/result.json"))
               if p.parent.name in PROGRAMS}
    info = record.meta(load_machine(), world=args.world, evals=args.evals, rounds=args.rounds)
    record.save(args.out, f"knobs_search-w{args.world}", info, {"results": results}, markdown(info, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
