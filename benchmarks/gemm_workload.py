"""A built-in workload on this GPU machine: baselines, bounds and every shipped candidate at every shape.

Runs `cuco doctor`, `cuco baseline WORKLOAD`, then `cuco eval` of each shipped candidate that is not a baseline
and of each design point named by --point (a strategy's point, as the search writes it), through the real CLI, and
writes benchmarks/results/<workload>-w<world>.json and .md (time, bound, efficiency and speedups over each baseline
per candidate and shape, with date, device and commit).

    python benchmarks/gemm_workload.py [--workload gemm_allgather] [--world 2] [--iters 30] [--shape 8k ...]
        [--point STRATEGY:LABEL ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import record

ROOT = record.ROOT
RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gemm_allgather")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--point", action="append", default=[], metavar="STRATEGY:LABEL",
                    help="a strategy's design point to evaluate beside them (fnmatch on labels: moe_grouped:*)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.paths import baselines_file, cuco_home
    from cuco.workload import load_workload, resolve_workload

    spec = load_workload(resolve_workload(args.workload), args.world)
    common = ["--world", str(args.world), "--device", "cuda"] + [x for s in args.shape for x in ("--shape", s)]
    if args.iters:
        common += ["--iters", str(args.iters)]
    record.cuco("doctor")
    machine = load_machine()
    record.cuco("baseline", spec.name, *common)
    records = json.loads(baselines_file(spec.name, args.world, "cuda").read_text())
    tmp = cuco_home() / "bench"
    tmp.mkdir(exist_ok=True)
    programs = {name: name for name in spec.candidates} | _points(spec, args.point, tmp)
    for name, candidate in programs.items():
        if name in records:
            continue
        out = tmp / f"{name.replace('/', '_').replace(' ', '-')}.json"
        out.unlink(missing_ok=True)
        proc = record.cuco("eval", spec.name, candidate, "--out", str(out), *common)
        if out.is_file():
            records[name] = json.loads(out.read_text())
        else:  # cannot run here: cuco said why in its last line; a row of the table, not the end of it
            said = (proc.stdout + proc.stderr).strip().splitlines()
            records[name] = {"ok": False, "failed_level": "-", "error": said[-1] if said else "no record"}

    info = record.meta(machine, args.world, peer_bw_gbps=machine.get("peer_bw_gbps"),
                       gemm_bf16_tflops=machine.get("gemm_bf16_tflops"), ceilings=_ceilings(machine))
    record.save(args.out, f"{spec.name}-w{args.world}", info, {"records": records}, markdown(spec, info, records))
    return 0 if all(r["ok"] for r in records.values()) else 1


def _points(spec, wanted: list[str], folder: Path) -> dict[str, str]:
    """'strategy label' -> the candidate file of each design point named (STRATEGY:LABEL, fnmatch on labels)."""
    from fnmatch import fnmatch

    from cuco.evolve.strategy import materialize

    out = {}
    for item in wanted:
        name, _, pattern = item.partition(":")
        if name not in spec.strategies:
            raise SystemExit(f"--point {item}: {spec.name} has no strategy {name!r} (it has: "
                             f"{', '.join(spec.strategies)})")
        strategy = spec.strategies[name]
        for point in strategy.points():
            if fnmatch(point.label(), pattern or "*"):
                src = folder / f"{name}-{point.label().replace('/', '_')}{strategy.path.suffix}"
                src.write_text(materialize(strategy, point))
                out[f"{name} {point.label()}"] = str(src)
    return out


def _ceilings(machine: dict) -> str:
    """The ceilings the speed of light divides by, as `cuco doctor` measured them."""
    c = machine.get("ceilings") or {}
    parts = [f"{what} {c[key]['value']:.0f} {c[key]['unit']}" for key, what in (
        ("tensor_bf16_tflops", "bf16 tensor"), ("hbm_read_gbps", "HBM read"), ("hbm_write_gbps", "HBM write"),
        ("link_both_ways_gbps", "link both ways")) if c.get(key)]
    return ", ".join(parts) or "not measured"


def _strongest(refs: list[str], records: dict, shape: str, exclude: str) -> tuple[str, float] | None:
    """The fastest baseline measured in the same run at this shape (other than the candidate itself)."""
    times = [(r, records[r]["shapes"][shape]["timing"]["median_ms"]) for r in refs if r != exclude
             and ((records.get(r) or {}).get("shapes", {}).get(shape, {}).get("timing") or {}).get("median_ms")]
    return min(times, key=lambda t: t[1]) if times else None


def markdown(spec, meta: dict, records: dict) -> list[str]:
    lines = [f"# {spec.name} on {meta['device']} ({meta['links'] or 'one GPU'}): {spec.description}", "",
             f"Date {meta['date']}, commit {meta['commit']}, world {meta['world']}. Judge: fresh inputs delivered "
             "inside each run's time, L2 flushed by a read before each, every rank released by one gate; times in "
             "ms, the slowest rank per iteration, median (p10-p90). Speed of light: the largest of flops at the "
             "tensor rate, HBM bytes at the HBM rate and link bytes at the link rate (ceilings by cuco doctor: "
             f"{meta['ceilings']}); library bound: the reference compute alone (cuBLAS) and the collective alone. "
             "Speedups over the strongest baseline measured in the same run first, then over the seed.", "",
             f"Command: `{meta['command']}`", ""]
    refs = list(spec.baselines)
    lines += ["| shape | candidate | verified | median ms (p10-p90) | speed of light ms | of light | library bound ms "
              "| vs library | vs strongest baseline | vs seed |", "|---" * 10 + "|"]
    measured = [s for s in spec.shapes if any(s.name in r.get("shapes", {}) for r in records.values())]
    for shape in measured or spec.shapes:
        label = f"{shape.name} ({shape.label()})"
        for name, rec in records.items():
            s = rec.get("shapes", {}).get(shape.name, {})
            t = s.get("timing")
            if not t:
                err = (rec.get("error") or "not run")[:80].replace("|", "/")
                lines.append(f"| {label} | {name} | no: {rec.get('failed_level')} {err} |" + " |" * 7)
                continue
            b, med = s["bound"], t["median_ms"]
            light = b.get("speed_of_light_ms")
            best = _strongest(refs, records, shape.name, name)
            seed = ((records.get("seed") or {}).get("shapes", {}).get(shape.name, {}).get("timing") or {})
            cells = [label, name, "yes" if rec["ok"] else "no", f"{med:.4f} ({t['p10_ms']:.4f}-{t['p90_ms']:.4f})",
                     f"{light:.4f}" if light else "-", f"{light / med:.0%}" if light else "-", f"{b['bound_ms']:.4f}",
                     f"{b['bound_ms'] / med:.2f}x" + (" (beats it)" if med < b["bound_ms"] else ""),
                     f"{best[1] / med:.2f}x over {best[0]}" if best else "-",
                     f"{seed['median_ms'] / med:.2f}x" if seed.get("median_ms") else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "References per shape (ms, slowest rank, median): the computation alone (cuBLAS), the collective "
              "alone (NCCL), the communication's share of the speed of light.", "",
              "| shape | compute alone | NCCL alone | HBM bytes at the HBM rate | link bytes at the link rate |",
              "|---|---|---|---|---|"]
    for shape in spec.shapes:
        for rec in records.values():
            s = rec.get("shapes", {}).get(shape.name, {})
            if s.get("references_ms"):
                r, b = s["references_ms"], s["bound"]
                hbm = f"{b['hbm_ms']:.4f}" if b.get("hbm_ms") else "-"
                lines.append(f"| {shape.name} ({shape.label()}) | {r.get('compute_alone', 0):.4f} | "
                             f"{r.get('comm_alone', 0):.4f} | {hbm} | {b['comm_ms']:.4f} |")
                break
    return lines


if __name__ == "__main__":
    sys.exit(main())
