"""The decode GEMM (cuco/kernels/decode.py, split-K) against cuBLAS and the HBM ceiling, at every decode shape the
GEMM workloads ship (M = 1, 8, 32, 128; their per-rank K and N at world 1 and 2), on one GPU.

At these shapes the time is reading the weights: the table gives each kernel's time and the bytes it must move
(A and B read once, C written once) over that time, as a share of the HBM read ceiling measured here first (cuco's
streaming kernels, cuco.ceilings.hbm_rates). cuBLAS (torch.matmul into a preallocated output), the tiled Triton GEMM
(cuco.kernels.gemm with its own tiles) and the decode kernel with its default configuration are timed in three
alternating rounds (medians taken); a sweep of configurations, each checked against cuBLAS before it is timed,
says which the default should be. Times: median of 50 CUDA-graph replays, L2 overwritten before each, random bf16.
Writes benchmarks/results/decode_gemm.json and .md.

    python benchmarks/decode_gemm.py [--out DIR] [--no-sweep]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import record
from replay import graph_median_ms

ROOT = record.ROOT
ROWS = (1, 8, 32, 128)
# (K, N) of the per-rank decode GEMMs: gemm_allreduce and gemm_reducescatter multiply K / world, gemm_allgather
# N / world, of K = N = 8192; world 1 and world 2.
KN = {(8192, 8192): "world 1: every decode shape", (4096, 8192): "world 2: gemm_allreduce, gemm_reducescatter",
      (8192, 4096): "world 2: gemm_allgather"}
# (block_n, block_k) x split_k x (num_stages, num_warps): tiles whose stages fit in shared memory at BLOCK_M <= 128.
TILES = ((32, 256), (64, 128), (64, 256), (128, 128), (128, 64))
SPLITS = (1, 2, 4, 8)
PIPES = ((4, 4), (6, 4), (4, 8))
ROUNDS = 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--no-sweep", action="store_true", help="time only cuBLAS, the tiled GEMM and the default")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from cuco.ceilings import hbm_rates
    from cuco.ceilings.stream import read_all
    from cuco.kernels.decode import MAX_ROWS, DecodeConfig, decode_config_for, decode_workspace, gemm_decode
    from cuco.kernels.gemm import config_for, gemm
    from cuco.runner.judge.l2 import L2Flush

    if not torch.cuda.is_available():
        sys.exit("decode_gemm: needs a CUDA GPU")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    hbm_read, hbm_how = hbm_rates()["read"]
    l2 = L2Flush(dev)

    def bench(fn, flush=l2.flush) -> float:
        return graph_median_ms(fn, flush)

    def decode_run(a, b, c, cfg):
        ws = decode_workspace(a.shape[0], b.shape[1], a.shape[1], dev, cfg)  # made before the graph's capture
        return lambda: gemm_decode(a, b, c, config=cfg, workspace=ws)

    sweep = [] if args.no_sweep else [DecodeConfig(bn, bk, s, st, w) for (bn, bk), s, (st, w)
                                      in itertools.product(TILES, SPLITS, PIPES)]
    rows = []
    for (k, n), m in itertools.product(KN, ROWS):
        a, b = torch.randn(m, k, device=dev).bfloat16(), torch.randn(k, n, device=dev).bfloat16()
        ref, c = (torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        moved = 2 * (m * k + k * n + m * n)
        torch.matmul(a, b, out=ref)
        tried = []
        own_cfg = decode_config_for(m, n, k, sms)
        for cfg in sweep:
            programs = -(-n // cfg.block_n) * cfg.split_k
            if m > MAX_ROWS or not sms // 2 <= programs <= 32 * sms:  # fewer leave SMs idle; more add partial sums
                continue
            try:
                run = decode_run(a, b, c.fill_(float("nan")), cfg)
                run()
                torch.cuda.synchronize()
            except Exception as exc:  # a tile this GPU cannot hold (shared memory): recorded, not timed
                tried.append({"config": asdict(cfg), "error": f"{type(exc).__name__}: {str(exc)[:100]}"})
                continue
            err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
            entry = {"config": asdict(cfg), "rel_err": err}
            if err < 1e-2:
                entry["ms"] = bench(run)
            tried.append(entry)
        tiled = lambda a=a, b=b, c=c, cfg=config_for(m, n, k): gemm(a, b, c, config=cfg)  # noqa: E731
        # cuco: what cuco.kernels.gemm.gemm runs with no tiles asked for (the decode kernel up to MAX_ROWS rows)
        runs = {"cublas": lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref), "tiled": tiled,
                "cuco": decode_run(a, b, c, own_cfg) if m <= MAX_ROWS else tiled}
        # The floor of any kernel that reads B once at this size, timed alike: the streaming read of the ceilings
        # over B's bytes alone (a launch's ramp and tail weigh on tens of MB as they do not on the ceiling's 2 GiB).
        partial = torch.empty(4096, device=dev)
        runs["read_b"] = lambda b=b, partial=partial: read_all(b.view(torch.float32), partial)
        rounds = [{name: bench(fn) for name, fn in runs.items()} for _ in range(ROUNDS)]
        med = {name: statistics.median(r[name] for r in rounds) for name in runs}
        # What the flush costs the run after it: cuBLAS after a read flush (the judge's), a written one, and none.
        flush_effect = {"read": med["cublas"], "write": bench(runs["cublas"], flush=l2.buf.zero_),
                        "none": bench(runs["cublas"], flush=lambda: None)}
        runs["cuco"]()
        c.fill_(float("nan"))
        runs["cuco"]()
        first = c.clone()
        c.fill_(float("nan"))
        runs["cuco"]()
        timed = [t for t in tried if "ms" in t]
        best = min(timed, key=lambda t: t["ms"]) if timed else None
        row = {"shape": [m, k, n], "where": KN[k, n], "bytes": moved, **{f"{x}_ms": v for x, v in med.items()},
               "decode_config": asdict(own_cfg) if m <= MAX_ROWS else None,
               "bitwise_repeatable": torch.equal(c, first),
               "cuco_rel_err": ((c.float() - ref.float()).norm() / ref.float().norm()).item(),
               "cublas_after_flush_ms": flush_effect, "best": best, "tried": tried}
        rows.append(row)
        print(f"{m}x{k}x{n}: " + ", ".join(f"{x} {v * 1e3:.1f} us ({moved / v / 1e6:.0f} GB/s)" for x, v in med.items())
              + (f"; best {best['ms'] * 1e3:.1f} us {best['config']}" if best else ""), flush=True)

    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, hbm_read_gbps=hbm_read,
                       hbm_read_method=hbm_how)

    def share(ms, moved):
        return f"{moved / ms / 1e6:.0f} ({moved / ms / 1e6 / hbm_read:.0%})"

    def cfg_text(c):
        return "{block_n}x{block_k} split {split_k} s{num_stages} w{num_warps}".format(**c)

    lines = ["# Decode GEMM (cuco/kernels/decode.py) vs cuBLAS and the HBM read ceiling", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}; HBM read ceiling {hbm_read:.0f} GB/s "
             f"({hbm_how}). GB/s: A and B read once and C written once over the time (share of the ceiling). "
             "read B, cuBLAS, tiled and cuco: medians of three alternating rounds of 50 graph replays, L2 flushed "
             "before each; best swept: each configuration timed once (a guide for the default, not a comparison).", "",
             "read B: the ceilings' streaming read over B's bytes alone, the fastest a kernel that reads B once is "
             "at this size (its GB/s counts B alone).", "",
             "| M,K,N | per-rank shape of | read B us, GB/s | cuBLAS us, GB/s | tiled Triton us, GB/s | cuco (decode "
             f"to {MAX_ROWS} rows) us, GB/s | vs cuBLAS | cuco vs read B | repeatable | best swept us, GB/s | best "
             "configuration |",
             "|---" * 11 + "|"]
    for r in rows:
        m, k, n = r["shape"]
        best = r["best"]
        lines.append(f"| {m},{k},{n} | {r['where']} | {r['read_b_ms'] * 1e3:.1f}, {share(r['read_b_ms'], 2 * k * n)} | "
                     f"{r['cublas_ms'] * 1e3:.1f}, {share(r['cublas_ms'], r['bytes'])} "
                     f"| {r['tiled_ms'] * 1e3:.1f}, {share(r['tiled_ms'], r['bytes'])} | {r['cuco_ms'] * 1e3:.1f}, "
                     f"{share(r['cuco_ms'], r['bytes'])} | {r['cublas_ms'] / r['cuco_ms']:.2f}x | "
                     f"{r['read_b_ms'] / r['cuco_ms']:.0%} | "
                     f"{'yes' if r['bitwise_repeatable'] else 'NO'} | "
                     + (f"{best['ms'] * 1e3:.1f}, {share(best['ms'], r['bytes'])} | {cfg_text(best['config'])} |"
                        if best else "- | - |"))
    lines += ["", "What the L2 flush before a run costs it: cuBLAS after the judge's flush (a read of twice L2), "
              "after a written flush of the same size (L2 left dirty: the run writes it back) and after none "
              "(B is larger than L2: nothing of it stays cached).", "",
              "| M,K,N | read flush us | written flush us | no flush us |",
              "|---|---|---|---|"]
    lines += [f"| {','.join(map(str, r['shape']))} | " + " | ".join(f"{r['cublas_after_flush_ms'][f] * 1e3:.1f}"
                                                                 for f in ("read", "write", "none")) + " |"
              for r in rows]
    record.save(args.out, "decode_gemm", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
