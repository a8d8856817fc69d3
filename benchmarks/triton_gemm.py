"""The fused placement's own GEMM (cuco/kernels/gemm.py, Triton) against cuBLAS, at every shipped GEMM workload's
per-rank GEMM, on one GPU.

The fused placement replaces cuBLAS by a kernel cuco controls (tiles that wait for their rows, programs that push
them); that pays only if the plain kernel stands beside cuBLAS. For each per-rank shape the table gives cuBLAS
(torch.matmul into a preallocated output), the library's own choice of tiles and, at the row-parallel shapes, the
summing epilogue of the fused reduce-scatter and all-reduce at world 1 (timed in three alternating rounds, the
median round taken), and the best of a sweep of tile
configurations, each launched with a program per tile and with one per SM (persistent), each checked against
cuBLAS's result before it is timed. Times: the median of 50 CUDA-graph replays, L2 overwritten before each, random
bf16 inputs.
Writes benchmarks/results/triton_gemm.json and .md.

    python benchmarks/triton_gemm.py [--world 2] [--out DIR] [--no-sweep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import record
from replay import graph_median_ms

ROOT = record.ROOT
# The per-rank GEMM of each workload at world w, from its shape (M, K, N): the column-parallel all-gather GEMM
# multiplies every row by this rank's column slice; the row-parallel ones multiply this rank's K slice.
PER_RANK = {
    "gemm_allgather": lambda M, K, N, w: (M, K, N // w),
    "gemm_reducescatter": lambda M, K, N, w: (M, K // w, N),
    "gemm_allreduce": lambda M, K, N, w: (M, K // w, N),
}
# (block_m, block_n, block_k, group_m, num_stages, num_warps[, flatten]): Hopper tile shapes worth trying for bf16.
SWEEP_LARGE = [(128, 256, 64, 8, 3, 8), (128, 256, 64, 8, 4, 8), (256, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8),
               (128, 128, 64, 8, 4, 4), (128, 128, 128, 8, 3, 8), (128, 64, 64, 8, 4, 4),
               (128, 256, 64, 8, 3, 8, True), (256, 128, 64, 8, 3, 8, True), (128, 128, 64, 8, 4, 8, True)]
SWEEP_SMALL = [(128, 64, 128, 1, 3, 4), (128, 64, 128, 1, 4, 4), (128, 64, 128, 1, 4, 8), (128, 64, 64, 1, 6, 4),
               (128, 64, 256, 1, 2, 8), (128, 32, 256, 1, 3, 4), (128, 128, 64, 1, 3, 8), (64, 64, 256, 1, 3, 4),
               (64, 128, 64, 1, 4, 4), (32, 64, 128, 1, 4, 4), (32, 32, 256, 1, 4, 4), (16, 64, 256, 1, 4, 4),
               (16, 32, 256, 1, 4, 4), (16, 128, 128, 1, 4, 4)]
ROUNDS = 3  # alternating timings of cuBLAS and the library's own tiles, medians taken
GRIDS = ("tiles", "sms")  # a program per tile (the plain default), or one per SM looping over tiles (persistent)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="ranks the per-rank shapes are cut for")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--no-sweep", action="store_true", help="time only cuBLAS and the library's own tiles")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from cuco.kernels.gemm import GemmConfig, Partials, config_for, gemm, gemm_all_reduce, partials_counters
    from cuco.runner.judge.l2 import L2Flush
    from cuco.workload import load_workload

    if not torch.cuda.is_available():
        sys.exit("triton_gemm: needs a CUDA GPU")
    dev = torch.device("cuda")
    shapes: dict[tuple[int, int, int], list[str]] = {}
    for wl, cut in PER_RANK.items():
        for s in load_workload(ROOT / "cuco" / "builtin" / wl).shapes:
            shapes.setdefault(cut(s.params["M"], s.params["K"], s.params["N"], args.world), []).append(f"{wl}/{s.name}")

    l2 = L2Flush(dev)

    def bench(fn) -> float:
        return graph_median_ms(fn, l2.flush)

    rows = []
    for (m, k, n), names in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2]):
        a, b = torch.randn(m, k, device=dev).bfloat16(), torch.randn(k, n, device=dev).bfloat16()
        ref, c = (torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        cublas = bench(lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref))
        tried = {}
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        fits = max(16, triton.next_power_of_2(m))  # taller tiles than the rows only compute padding
        sweep = [] if args.no_sweep else [GemmConfig(*t) for t in (SWEEP_SMALL if m <= 256 else SWEEP_LARGE)
                                          if t[0] <= fits]
        own_cfg = config_for(m, n, k)
        own_grid = "sms" if own_cfg.flatten else "tiles"  # the library's default grid for it
        for cfg, grid in [(own_cfg, own_grid), *((c, g) for c in sweep for g in GRIDS)]:
            if (cfg, grid) in tried:
                continue
            programs = sms if grid == "sms" else None
            c.fill_(float("nan"))
            try:
                gemm(a, b, c, config=cfg, programs=programs)
                torch.cuda.synchronize()
            except Exception as exc:  # a tile shape this GPU cannot hold (shared memory): recorded, not timed
                tried[cfg, grid] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
                continue
            err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
            if not err < 1e-2:  # NaN fails too
                tried[cfg, grid] = {"error": f"wrong result: relative error {err:.3g}"}
                continue
            tried[cfg, grid] = {"ms": bench(lambda a=a, b=b, c=c, cfg=cfg, programs=programs:
                                            gemm(a, b, c, config=cfg, programs=programs)), "rel_err": err}
        own = tried[own_cfg, own_grid]
        # The row-parallel shapes also through the summing epilogue the fused reduce-scatter and all-reduce run
        # (gemm_all_reduce at world 1: no peer, the tile rounded and stored by pointer): what the epilogue costs.
        summed = None
        if any(w.startswith(("gemm_reducescatter", "gemm_allreduce")) for w in names):
            none = torch.zeros(1, dtype=torch.int64, device=dev)
            alone = Partials(0, 1, torch.empty(1, m, n, device=dev, dtype=torch.bfloat16),
                             torch.zeros(partials_counters(1, m, n), dtype=torch.int32, device=dev), none, none, 1)
            summed = {"ms": None}
        if "ms" in own:  # the comparison that counts, timed in alternation: clocks drift between far-apart timings
            own_programs = sms if own_grid == "sms" else None
            runs = [lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref),
                    lambda a=a, b=b, c=c, own_cfg=own_cfg, own_programs=own_programs:
                    gemm(a, b, c, config=own_cfg, programs=own_programs)]
            if summed is not None:
                runs.append(lambda a=a, b=b, c=c, alone=alone: gemm_all_reduce(a, b, c, alone))
            rounds = [[bench(fn) for fn in runs] for _ in range(ROUNDS)]
            cublas, own["ms"], *rest = (statistics.median(x) for x in zip(*rounds))
            if summed is not None:
                summed["ms"] = rest[0]
                summed["rel_err"] = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
        timed = [(v["ms"], cfg, grid) for (cfg, grid), v in tried.items() if "ms" in v]
        best_ms, best_cfg, best_grid = min(timed, key=lambda t: t[0]) if timed else (None, None, None)
        tflops = 2 * m * k * n / 1e9
        rows.append({"shape": [m, k, n], "workloads": names, "cublas_ms": cublas, "cublas_tflops": tflops / cublas,
                     "own_config": asdict(own_cfg), "own_grid": own_grid, "own_ms": own.get("ms"),
                     "own_error": own.get("error"), "summing_epilogue": summed,
                     "best_config": asdict(best_cfg) if best_cfg else None, "best_grid": best_grid, "best_ms": best_ms,
                     "tried": [{"config": asdict(cfg), "grid": grid, **v} for (cfg, grid), v in tried.items()]})
        print(f"{m}x{k}x{n}: cuBLAS {cublas:.4f} ms, own {own.get('ms') or own.get('error')}, best {best_ms}",
              flush=True)

    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, per_rank_of_world=args.world)

    def pct(x):
        return f"{x:.0%}" if x else "-"

    def ms(x, why=None):
        return f"{x:.4f}" if x else (why or "-")

    def tiles(c, grid):
        if not c:
            return "-"
        flat = ", flatten" if c["flatten"] else ""
        return "{block_m}x{block_n}x{block_k} g{group_m} s{num_stages} w{num_warps}".format(**c) + flat + f", {grid}"

    lines = [f"# Triton GEMM (cuco/kernels/gemm.py) vs cuBLAS, per-rank shapes at world {args.world}",
             "", f"{info['date']}, {info['device']}, commit {info['commit']}; median of 50 graph replays, L2 flushed "
             "before each, bf16. cuBLAS, own tiles and the summing epilogue (the fused reduce-scatter's and "
             "all-reduce's, at world 1): medians of three alternating rounds. Best tiles: each timed "
             "once, apart from cuBLAS (clocks drift by up to ~10% between far-apart timings): a guide for choosing "
             "tiles, not a comparison.",
             "", "| M,K,N | workloads | cuBLAS ms (TFLOP/s) | own tiles ms | of cuBLAS | summing epilogue ms "
             "| of cuBLAS | best tiles ms | of cuBLAS | best tiles, grid |", "|---" * 10 + "|"]
    for r in rows:
        m, k, n = r["shape"]
        own, best = r["own_ms"], r["best_ms"]
        summed = (r["summing_epilogue"] or {}).get("ms")
        lines.append(f"| {m},{k},{n} | {', '.join(r['workloads'])} | {r['cublas_ms']:.4f} ({r['cublas_tflops']:.0f}) | "
                     f"{ms(own, r['own_error'])} | {pct(own and r['cublas_ms'] / own)} | {ms(summed)} | "
                     f"{pct(summed and r['cublas_ms'] / summed)} | {ms(best)} | "
                     f"{pct(best and r['cublas_ms'] / best)} | {tiles(r['best_config'], r['best_grid'])} |")
    record.save(args.out, "triton_gemm", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
