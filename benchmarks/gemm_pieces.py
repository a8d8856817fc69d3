"""What a cuBLAS GEMM costs cut into pieces of its output's columns, as the fusion knob of an all-reduce cuts it
(sync chunk: cuco::gemmSignalColumns, each piece its own cuBLAS call on columns [c0, c1) of the weights and the
output, rows `N` elements apart), beside the same GEMM whole, on one GPU.

The knob can win only the all-reduce it hides, and only if the pieces together cost the GEMM about what it costs
whole: this measures that price at the shapes the knob was swept at (the row-parallel GEMMs of the decode
GEMM+AllReduce workload and of examples/tp_mlp at world 2). Pieces are cut as the knob cuts them (on 8-column,
16-byte boundaries). Times: median of 50 CUDA-graph replays, L2 overwritten before each, random bf16, three
alternating rounds (medians taken). Writes benchmarks/results/gemm_pieces.json and .md.

    python benchmarks/gemm_pieces.py [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import record
from replay import graph_median_ms

ROOT = record.ROOT
# (name, M, K, N) per rank at world 2: gemm_allreduce's m128 and m1024 (K = 8192 / 2, N = 8192), and tp_mlp's second
# GEMM at t128 and t2048 (K = ffn / 2 = 8192, N = hidden = 4096).
SHAPES = (("gemm_allreduce m128", 128, 4096, 8192), ("gemm_allreduce m1024", 1024, 4096, 8192),
          ("tp_mlp t128", 128, 8192, 4096), ("tp_mlp t2048", 2048, 8192, 4096))
PIECES = (1, 2, 4)
ROUNDS = 3
PACK = 8  # bf16 elements in 16 bytes: the knob's pieces start on such boundaries (packSlice)


def cuts(n: int, pieces: int) -> list[tuple[int, int]]:
    """Columns [c0, c1) of each piece, as packSlice cuts n columns."""
    packs = n // PACK
    return [(packs * j // pieces * PACK, n if j == pieces - 1 else packs * (j + 1) // pieces * PACK)
            for j in range(pieces)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from cuco.machine import load_machine
    from cuco.runner.judge.l2 import L2Flush

    if not torch.cuda.is_available():
        sys.exit("gemm_pieces: needs a CUDA GPU")
    dev = torch.device("cuda")
    l2 = L2Flush(dev)
    rows = []
    for name, m, k, n in SHAPES:
        a, b = torch.randn(m, k, device=dev).bfloat16(), torch.randn(k, n, device=dev).bfloat16()
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

        def run(pieces: int, a=a, b=b, c=c, n=n):
            # b[:, c0:c1] and c[:, c0:c1] are strided views: cuBLAS reads and writes them in place (ld = n)
            spans = cuts(n, pieces)
            return lambda: [torch.matmul(a, b[:, c0:c1], out=c[:, c0:c1]) for c0, c1 in spans]

        whole = torch.matmul(a, b)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run(4)()
            torch.cuda.synchronize()
        # the pieces must be cuBLAS's alone: a copy into the strided output would be a price the knob does not pay
        kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        err = ((c.float() - whole.float()).norm() / whole.float().norm()).item()
        rounds = [{p: graph_median_ms(run(p), l2.flush) for p in PIECES} for _ in range(ROUNDS)]
        med = {p: statistics.median(r[p] for r in rounds) for p in PIECES}
        rows.append({"shape": name, "m": m, "k": k, "n": n, "pieces_ms": med, "rounds": rounds,
                     "rel_err_4_pieces": err, "kernels_4_pieces": kernels})
        print(f"{name}: " + ", ".join(f"{p} piece(s) {med[p]:.4f} ms" for p in PIECES) + f"; kernels {kernels}",
              flush=True)
    info = record.meta(load_machine(), world=1)
    lines = ["# A cuBLAS GEMM cut into pieces of its output's columns (the all-reduce fusion knob's cut), one GPU", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}. Median of 50 CUDA-graph replays, L2 "
             "overwritten before each, medians of three alternating rounds; ms.", "",
             f"Command: `{info['command']}`", "",
             "| GEMM (per rank, world 2) | M x K x N | whole | 2 pieces | 4 pieces | 2 pieces / whole | "
             "4 pieces / whole |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["pieces_ms"]
        lines.append(f"| {r['shape']} | {r['m']} x {r['k']} x {r['n']} | {p[1]:.4f} | {p[2]:.4f} | {p[4]:.4f} | "
                     f"{p[2] / p[1]:.2f}x | {p[4] / p[1]:.2f}x |")
    record.save(args.out, "gemm_pieces", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
