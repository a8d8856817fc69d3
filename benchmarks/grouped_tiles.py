"""The MoE grouped GEMM's tiles (cuco/kernels/grouped_gemm.py) at the prefill shape an expert-parallel rank computes:
rank 0 of moe_deepseek_v3 at world 2, T = 4096, on one GPU.

Rank 0 owns 128 experts and receives the pairs of both ranks' routings that pick them, about 256 rows an expert
(the workload's own draws, uniform and HOT = 5), which moe_grouped's experts multiply in place. Each projection (w13
with its SwiGLU epilogue, w2) with the tiles config_for picks and with the alternatives in TILES (deeper K steps,
more stages, a narrower tile, pipelining across a program's tiles, 64-row tiles): every variant's output checked
against config_for's (TOLERANCE: the same K order per row), then all timed in ROUNDS alternating rounds (CUDA-graph
replays, L2 flushed before each, benchmarks/replay.py; each round starting at the next variant, as the first of a
round runs a few % slower), the median round taken. Rates: useful flops (pairs x 2 x K x
N) against the bf16 tensor ceiling of `cuco doctor`; `computed` is the rows the tiles multiply over the rows there
are (a tile multiplies its rows past its expert's end too).
Writes benchmarks/results/grouped_tiles.json and .md.

    python benchmarks/grouped_tiles.py [--reps 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import record
from grouped_gemm import rel_err
from replay import graph_median_ms

ROOT = record.ROOT
CASES = ("t4096", "t4096_hot5")
WORLD = 2
# (block_m, block_n, block_k, num_stages, num_warps[, programs_per_sm[, flatten]]) per projection beside config_for's;
# SwiGLU's block_n is per half. Shared memory: stages x (block_m + 2 block_n) x block_k x 2 bytes for SwiGLU,
# stages x (block_m + block_n) x block_k x 2 plain, each under the 227 KB an H200 SM gives its blocks.
TILES = {
    "w13": [(128, 128, 64, 4, 8), (128, 128, 128, 2, 8), (128, 64, 64, 4, 4), (128, 64, 64, 4, 8),
            (128, 128, 64, 3, 8, 1, True), (64, 128, 64, 4, 8)],
    "w2": [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 256, 64, 4, 8, 1, True), (128, 256, 128, 2, 8),
           (128, 128, 64, 4, 4), (128, 128, 64, 4, 8), (64, 256, 64, 4, 8)],
}
ROUNDS = 5  # the variants alternate: their gaps are a few %
TOLERANCE = 1e-3  # relative (norm): the same sums over K, rounded to bf16 alike; only the tile's shape differs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="replays per timing")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    if not torch.cuda.is_available():
        sys.exit("grouped_tiles: needs a CUDA GPU")
    from cuco.machine import load_machine
    from cuco.runner.judge.l2 import L2Flush

    record.cuco("doctor")  # the tensor ceiling
    machine = load_machine()
    tensor = ((machine.get("ceilings") or {}).get("tensor_bf16_tflops") or {}).get("value")
    flush = L2Flush(torch.device("cuda")).flush
    rows, weights = [], None
    for shape in CASES:
        case = Case(torch, WORLD, shape, weights)
        weights = case.weights
        rows += case.run(flush, args.reps, tensor)
    info = record.meta(machine, world=1, tensor_tflops=tensor, reps=args.reps, rounds=ROUNDS,
                       triton=__import__("triton").__version__)
    record.save(args.out, "grouped_tiles", info, {"rows": rows}, markdown(info, rows))
    return 0


class Case:
    """One routing's rows for one rank's experts, sorted by expert, and that rank's weights."""

    def __init__(self, torch, world: int, shape: str, weights: dict | None):
        from cuco.kernels.grouped_gemm import sort_by_expert
        from cuco.workload import load_workload
        from cuco.workload.reference import load_reference

        self.torch, self.world, self.shape = torch, world, shape
        spec = load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3", world)
        ref = load_reference(spec)
        p = self.p = spec.shape(shape).params
        dev = torch.device("cuda")
        local = p["E"] // world
        xs, ids = [], []
        for rank in range(world):  # every rank's pairs that pick rank 0's experts, sources in rank order
            inputs = ref.make_inputs(p, world, rank, torch.Generator(dev).manual_seed(rank), dev)
            idx = ref.module.routing(inputs["logits"], p["TOPK"])[0].flatten()
            mine = idx < local
            xs.append(inputs["x"][torch.arange(len(idx), device=dev)[mine] // p["TOPK"]])
            ids.append(idx[mine])
        flat, x = torch.cat(ids), torch.cat(xs)
        layout = sort_by_expert(flat, local)
        self.offs, self.x = layout.offs, x[layout.order].contiguous()
        self.counts = layout.offs.diff().tolist()
        self.weights = weights or ref.make_parameters(p, world, 0, torch.Generator(dev).manual_seed(1), dev)
        self.hidden = torch.randn(len(flat), p["FF"], device=dev).bfloat16()
        self.out = torch.empty_like(self.x)

    def computed(self, block_m: int) -> float:
        """Rows the tiles multiply over the rows there are."""
        return sum(-(-c // block_m) * block_m for c in self.counts) / sum(self.counts)

    def variants(self, proj: str):
        from cuco.kernels.grouped_gemm import GroupedConfig, config_for, grouped_gemm, grouped_swiglu

        swiglu = proj == "w13"
        w = self.weights[proj]
        n, k = (w.shape[2] // 2, w.shape[1]) if swiglu else (w.shape[2], w.shape[1])
        configs = {"config_for": config_for(len(self.x), len(self.counts), n, k, swiglu)}
        configs.update({", ".join(map(str, t)): GroupedConfig(*t) for t in TILES[proj]})

        def fn(cfg):
            if swiglu:
                return lambda: grouped_swiglu(self.x, self.offs, w, self.hidden, config=cfg)
            return lambda: grouped_gemm(self.hidden, self.offs, w, self.out, config=cfg)

        return {name: (cfg, fn(cfg), self.hidden if swiglu else self.out) for name, cfg in configs.items()}

    def run(self, flush, reps: int, tensor: float | None) -> list[dict]:
        rows = []
        for proj in ("w13", "w2"):
            variants = self.variants(proj)
            first, errors = None, {}
            for name, (_, fn, out) in variants.items():  # each variant's output against the first's
                fn()
                got = out.clone()
                first = got if first is None else first
                errors[name] = rel_err(got, first)
                if not errors[name] <= TOLERANCE:
                    raise SystemExit(f"grouped_tiles: {self.shape} {proj} {name} is {errors[name]:.2e} off "
                                     "config_for's output")
            times = {name: [] for name in variants}
            names = list(variants)
            for i in range(ROUNDS):  # each round starts at another variant: the first of a round runs slower
                for name in names[i % len(names):] + names[:i % len(names)]:
                    times[name].append(graph_median_ms(variants[name][1], flush, reps))
            k, n = self.weights[proj].shape[1], self.weights[proj].shape[2]
            flops = sum(self.counts) * 2 * k * n
            for name, (cfg, _, _) in variants.items():
                ms = statistics.median(times[name])
                rows.append({"world": self.world, "shape": self.shape, "proj": proj, "variant": name,
                             "config": asdict(cfg), "ms": ms, "rounds_ms": times[name], "error": errors[name],
                             "rows_per_expert": sum(self.counts) / len(self.counts),
                             "computed": self.computed(cfg.block_m), "tflops": flops / ms / 1e9,
                             "of_tensor": flops / ms / 1e9 / tensor if tensor else None})
            print(f"{self.shape} w{self.world} {proj}: " + ", ".join(
                f"{r['variant']} {r['ms']:.3f}" for r in rows if r["proj"] == proj), flush=True)
        return rows


def markdown(info: dict, rows: list[dict]) -> list[str]:
    lines = [f"# The grouped GEMM's tiles at rank 0 of world 2, T = 4096, on {info['device']}", "",
             f"Date {info['date']}, commit {info['commit']}, Triton {info['triton']}. Each projection of "
             "moe_deepseek_v3's experts as rank 0 computes them at world 2 (its 128 experts, both ranks' pairs); "
             "ms the median of "
             f"{info['rounds']} alternating rounds of {info['reps']} CUDA-graph replays, L2 flushed before each; "
             "every variant's output within 1e-3 (norm) of config_for's; computed: rows the tiles multiply over "
             "the rows; "
             f"TFLOP/s useful, against the tensor ceiling ({info['tensor_tflops']:.0f} TFLOP/s).", "",
             f"Command: `{info['command']}`", "",
             "| shape | rows an expert | proj | tile (m, n, k, stages, warps, per SM, flatten) | computed | ms | "
             "TFLOP/s (of tensor) | vs config_for |", "|---|---|---|---|---|---|---|---|"]
    base = {(r["shape"], r["proj"]): r["ms"] for r in rows if r["variant"] == "config_for"}
    for r in rows:
        c = r["config"]
        of = f" ({r['of_tensor']:.0%})" if r["of_tensor"] else ""
        tile = ", ".join(str(c[f]) for f in ("block_m", "block_n", "block_k", "num_stages", "num_warps",
                                             "programs_per_sm", "flatten"))
        name = f"config_for: {tile}" if r["variant"] == "config_for" else tile
        lines.append(f"| {r['shape']} | {r['rows_per_expert']:.0f} | {r['proj']} | {name} | {r['computed']:.2f}x | "
                     f"{r['ms']:.3f} | {r['tflops']:.0f}{of} | {base[(r['shape'], r['proj'])] / r['ms']:.2f}x |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
