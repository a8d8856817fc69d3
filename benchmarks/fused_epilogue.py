"""The fused reduce-scatter and all-reduce GEMMs (cuco/kernels/gemm.py) as one rank of world 2 does them, on one GPU.

A rank of the fused placement computes every tile of its K slice; the tiles of the peer's rows go into the peer's
receive slot (stores, then a release per tile), its own rows' tiles are summed with the peer's partial of them.
Here the peer is emulated: its slot is a buffer of this GPU and its partials have already landed (their counters
set past any run's target), so the table is the kernel's own cost, the link's latency and bandwidth left out (at
these shapes the peer's tiles, 32-128 MB, cross NV18 well within the GEMM's time). Beside it: cuBLAS on the same
GEMM (what the unfused program computes before its collective) and cuco's plain Triton GEMM with the library's
tiles. `fused` is the kernel as it runs at world 2 (each own tile plus the peer's partial, added into it);
`general sum` the same kernel with the sum of any world (an fp32 accumulator from zero, every rank added in
order). Every variant's output and the peer's slot are checked against the fp32 product before timing. Times:
the median of 50 CUDA-graph replays, L2 overwritten before each; the variants alternate, five rounds, the median
round taken.
Writes benchmarks/results/fused_epilogue.json and .md.

    python benchmarks/fused_epilogue.py [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import record
from replay import graph_median_ms

ROOT = record.ROOT
WORLD = 2  # the rank emulated is rank 0 of two
ROUNDS = 5
COUNTER_LANDED = 1 << 30  # the emulated peer's counters: past any run's target, so no tile waits
WARM_RUNS = 200  # cuBLAS runs before the first timing: the clocks leave idle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    import torch

    from cuco.kernels import gemm as g
    from cuco.kernels.decode import MAX_ROWS as DECODE_ROWS
    from cuco.runner.judge.l2 import L2Flush
    from cuco.workload import load_workload

    if not torch.cuda.is_available():
        sys.exit("fused_epilogue: needs a CUDA GPU")
    dev = torch.device("cuda")
    l2 = L2Flush(dev)
    shapes: dict[tuple[str, tuple[int, int, int]], list[str]] = {}
    for wl, op in (("gemm_reducescatter", "reduce_scatter"), ("gemm_allreduce", "all_reduce")):
        for s in load_workload(ROOT / "cuco" / "builtin" / wl).shapes:
            m, k, n = s.params["M"], s.params["K"] // WORLD, s.params["N"]
            if m > DECODE_ROWS:  # decode rows take the one-kernel decode path, not these tiles
                shapes.setdefault((op, (m, k, n)), []).append(f"{wl}/{s.name}")
    rows = []
    for (op, (m, k, n)), names in shapes.items():
        summed = m // WORLD if op == "reduce_scatter" else m
        a = torch.randn(m, k, device=dev).bfloat16() / 16
        b = torch.randn(k, n, device=dev).bfloat16() / 16
        full, plain = (torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty(summed, n, device=dev, dtype=torch.bfloat16)
        recv = torch.randn(WORLD, summed, n, device=dev).bfloat16()  # slot 1: the peer's partial, landed
        peer_slot = torch.empty(summed, n, device=dev, dtype=torch.bfloat16)
        counters = torch.full((g.partials_counters(WORLD, summed, n),), COUNTER_LANDED, dtype=torch.int32,
                              device=dev)
        peer_counters = torch.zeros_like(counters)
        parts = g.Partials(0, WORLD, recv, counters,
                           torch.tensor([0, peer_slot.data_ptr()], dtype=torch.int64, device=dev),
                           torch.tensor([0, peer_counters.data_ptr()], dtype=torch.int64, device=dev), 1)
        kernel = g._gemm_rs_kernel if op == "reduce_scatter" else g._gemm_ar_kernel
        runs = {"cublas": lambda a=a, b=b, full=full: torch.matmul(a, b, out=full),
                "triton": lambda a=a, b=b, plain=plain: g.gemm(a, b, plain),
                "fused": lambda a=a, b=b, out=out, parts=parts, kernel=kernel, op=op:
                    g._summed(kernel, op, a, b, out, parts, out.shape[0], None, None),
                "general sum": lambda a=a, b=b, out=out, parts=parts, kernel=kernel, op=op:
                    g._summed(kernel, op, a, b, out, parts, out.shape[0], None, None, pair=False)}
        product = a.float() @ b.float()
        own, theirs = (product[:summed], product[summed:]) if op == "reduce_scatter" else (product, product)
        errors = {}
        for name in ("fused", "general sum"):
            out.fill_(float("nan"))
            peer_slot.fill_(float("nan"))
            runs[name]()
            torch.cuda.synchronize()
            want = own + recv[1].float()
            errors[name] = max(((out.float() - want).norm() / want.norm()).item(),
                               ((peer_slot.float() - theirs).norm() / theirs.norm()).item())
            if not errors[name] < 1e-2:  # NaN fails too
                sys.exit(f"fused_epilogue: {op} {m}x{k}x{n} {name}: wrong result (relative error {errors[name]:.3g})")
        for _ in range(WARM_RUNS):
            runs["cublas"]()
        rounds = [[graph_median_ms(fn, l2.flush) for fn in runs.values()] for _ in range(ROUNDS)]
        ms = {name: statistics.median(t) for name, t in zip(runs, zip(*rounds))}
        spread = {name: [min(t), max(t)] for name, t in zip(runs, zip(*rounds))}
        rows.append({"op": op, "shape": [m, k, n], "workloads": names, "ms": ms, "spread": spread,
                     "rel_err": errors, "tflops_cublas": 2 * m * k * n / 1e9 / ms["cublas"]})
        print(f"{op} {m}x{k}x{n}: " + ", ".join(f"{k_} {v:.4f}" for k_, v in ms.items()), flush=True)

    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, emulated_rank_of_world=WORLD)
    lines = [f"# The fused reduce-scatter and all-reduce GEMMs as rank 0 of world {WORLD}, on one GPU", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}. The peer emulated on the same GPU, its "
             "partials landed before the run: the kernel's own cost, no link in it. Median of 50 CUDA-graph "
             f"replays, L2 overwritten before each; the variants alternate, median of {ROUNDS} rounds; ms.", "",
             "Command: `python benchmarks/fused_epilogue.py`", "",
             "| collective | M,K,N (per rank) | workloads | cuBLAS GEMM | Triton GEMM | fused | fused / cuBLAS "
             "| general sum | general / fused |", "|---" * 9 + "|"]
    for r in rows:
        t = r["ms"]
        lines.append(f"| {r['op']} | {','.join(map(str, r['shape']))} | {', '.join(r['workloads'])} | "
                     f"{t['cublas']:.4f} | {t['triton']:.4f} | {t['fused']:.4f} | {t['fused'] / t['cublas']:.2f}x | "
                     f"{t['general sum']:.4f} | {t['general sum'] / t['fused']:.2f}x |")
    record.save(args.out, "fused_epilogue", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
