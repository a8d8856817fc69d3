"""cuco's device-side collectives (cuda/include/cuco_collectives.cuh) against NCCL's, on this GPU machine.

For each test workload (all-gather, reduce-scatter, all-reduce, all-to-all, a send/recv ring) the host-driven
seed (NCCL) and its rule-based rewrite (`cuco transform`) are evaluated by the same runner at 1 MB and 64 MB;
the table gives time and bus bandwidth (bytes each rank must receive over time) against the peer link that
`cuco doctor` measured.
Writes benchmarks/results/collectives.json and .md (the one they replace moves to results/archive/); a run of
some of the workloads, or with --variant, is an experiment and goes to results/archive/ directly.

    python benchmarks/collectives.py [--out DIR] [--variant CUCO_COLL_CTAS=128 ...] [--workloads reducescatter_sum ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = record.ROOT
LIBRARY = ROOT / "cuco" / "cuda" / "include" / "cuco_collectives.cuh"  # and its parts, cuco_coll_*.cuh
WORKLOADS = [ROOT / "cuco" / "builtin" / w for w in ("allgather_bf16", "reducescatter_sum", "allreduce_sum",
                                                        "alltoall_bf16", "sendrecv_ring", "alltoallv_bf16")]


def uses_any(program: str, library: str, macros: list[str]) -> bool:
    """Whether a variant's macros can change the program: named in it or in the collectives header it includes.
    Timing the same program again under another label would only spend device time."""
    text = program + library if LIBRARY.name in program else program
    return any(re.search(rf"\b{re.escape(m)}\b", text) for m in macros)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--variant", nargs="*", default=[], metavar="MACRO=VALUE[,MACRO=VALUE]",
                    help="also time the rewrite and the shipped device programs that use these macros with them "
                         "defined (CUCO_COLL_CTAS=128,CUCO_COLL_UNROLL=8; RS_CHUNKS=8 for reducescatter_sum's push.cu)")
    ap.add_argument("--workloads", nargs="+", choices=[w.name for w in WORKLOADS], default=[w.name for w in WORKLOADS],
                    help="which test workloads to time (default: all)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.workload import load_workload

    library = "".join(p.read_text() for p in sorted(LIBRARY.parent.glob("cuco_coll*.cuh")))
    record.cuco("doctor")
    tmp = Path(tempfile.mkdtemp())
    rows, records, transforms = [], {}, {}
    for wl in (w for w in WORKLOADS if w.name in args.workloads):
        transformed = tmp / f"{wl.name}.cu"
        # Rewrite, build and verify on this machine's GPUs, as a user would run it.
        t0 = time.monotonic()
        rc = record.cuco("transform", str(wl), "--out", str(transformed)).returncode
        transforms[wl.name] = {"ok": rc == 0, "seconds": round(time.monotonic() - t0, 1)}
        # The rewrite, and the device programs the workload ships (written against the library where the rules
        # do not reach): each also under every --variant.
        spec = load_workload(wl)
        device = [("cuco device", transformed)] + [(f"cuco device ({name}.cu)", path)
                                                   for name, path in spec.candidates.items() if name != "seed"]
        variants = [("NCCL (seed)", wl / "seed.cu"), *device]
        for i, defs in enumerate(args.variant):
            pairs = [d.partition("=")[::2] for d in defs.split(",")]  # (name, value); a bare name defines it empty
            macros = "".join(f"#define {name} {value}\n" for name, value in pairs)
            for j, (label, path) in enumerate(device):
                source = path.read_text() if path.is_file() else ""
                if source and uses_any(source, library, [name for name, _ in pairs]):
                    variant = tmp / f"{wl.name}-variant{i}-{j}.cu"
                    variant.write_text(macros + source)
                    variants.append((f"{label}, {defs}", variant))
        for i, (label, cand) in enumerate(variants):
            out = tmp / f"{wl.name}-{i}.json"
            if not cand.is_file() or record.cuco("eval", str(wl), str(cand), "--out", str(out)).returncode \
                    or not out.is_file():
                rows.append((wl.name, "-", label, None, None, False))
                continue
            rec = json.loads(out.read_text())
            records[f"{wl.name}/{label}"] = rec
            for shape, s in rec.get("shapes", {}).items():
                t = s.get("timing")
                if t:
                    gbps = s["bound"]["comm_bytes"] / (t["median_ms"] * 1e-3) / 1e9
                    rows.append((wl.name, shape, label, t["median_ms"], gbps, rec["ok"]))
    m = load_machine()
    bw = m.get("peer_bw_gbps") or 0
    info = record.meta(m, peer_bw_gbps=bw, transforms=transforms)
    lines = [f"# cuco device collectives vs NCCL on {info['device']}", "", f"Date {info['date']}, commit "
             f"{info['commit']}; peer link {bw:.0f} GB/s per direction. Bus bandwidth = bytes each rank receives / "
             "time.", "", f"Command: `{info['command']}`", "",
             "| workload | shape | implementation | verified | median ms | GB/s | of the link |",
             "|---|---|---|---|---|---|---|"]
    for w, shape, label, ms, gbps, ok in rows:
        if ms is None:
            lines.append(f"| {w} | - | {label} | failed | - | - | - |")
            continue
        lines.append(f"| {w} | {shape} | {label} | {'yes' if ok else 'no'} | {ms:.4f} | {gbps:.0f} | "
                     f"{gbps / bw:.1%} |" if bw else f"| {w} | {shape} | {label} | {ok} | {ms:.4f} | {gbps:.0f} | - |")
    lines += ["", "`cuco transform` (rewrite, build, verify on the GPUs; no LLM): " + ", ".join(
        f"{w} {'ok' if t['ok'] else 'not done (see the log)'} in {t['seconds']} s" for w, t in transforms.items())]
    complete = set(args.workloads) == {w.name for w in WORKLOADS} and not args.variant
    record.save(args.out, "collectives", info, {"records": records}, lines, with_time=True, current=complete)
    return 0


if __name__ == "__main__":
    sys.exit(main())
