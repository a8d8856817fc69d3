"""The MoE layer's expert compute on one GPU: cuco's grouped GEMM (cuco/kernels/grouped_gemm.py, Triton) against the
per-expert loop and torch's grouped GEMM, at the DeepSeek-V3 shapes of moe_deepseek_v3 with every expert local.

Cases: the workload's shapes t4096, t4096_hot5, t128 and t128_hot5 (E = 256, top-8, HID = 7168, FF = 2048) at
world 1, routed by the workload's own generator (HOT as in workload.toml). Each method computes every token-expert
pair's SwiGLU FFN on the rows sorted by expert (w13, silu(gate) * up, w2):
- per-expert loop, as torch_host runs it: the sizes brought to the host, one matmul pair per expert through torch
  (cuBLAS); timed eager (what the loop costs as written: the synchronisation and the launches) and captured in a
  CUDA graph with the sizes fixed (cuBLAS's GPU time alone: the judge's library bound for the compute);
- torch._grouped_mm (CUTLASS's grouped GEMM; the offsets on the device), W as stored (row-major) and column-major
  (a transposed copy made once, as a serving engine would lay its weights out at load). cuBLAS's own grouped GEMM,
  cublasGemmGroupedBatchedEx, takes each group's sizes in host arrays, so it needs the host round trip this kernel
  removes, and torch does not expose it;
- cuco's kernel with its own tiles (config_for), on rows sorted beforehand (untimed), and with the dispatch's gather
  timed too: the sorted rows written out first (x[rows], as the MoE layer ran it), or read by w13's loads from the
  tokens where they lie (grouped_swiglu's rows); and the best of a small sweep of tiles per projection.
Every method is checked against the graphed loop before it is timed. Times: medians of CUDA-event timed CUDA-graph
replays, L2 overwritten before each; cuco's kernel's three ways timed in ROUNDS alternating rounds, the median
round taken. Rates: flops = pairs x 6 x HID x FF against the bf16 tensor ceiling (the
target at T = 4096: 70%), and the touched experts' weights read once against the HBM read ceiling (the target at
T = 128: 80%); ceilings from `cuco doctor` where it ran, else measured here first. At T = 4096 all 256 experts
are touched: their 22.5 GB of weights at the HBM ceiling take about as long as the flops at the tensor one, so both
rates are shown for every case.
Writes benchmarks/results/grouped_gemm.json and .md.

    python benchmarks/grouped_gemm.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import record
from replay import median_ms

ROOT = record.ROOT
CASES = ("t4096", "t4096_hot5", "t128", "t128_hot5")
# (block_m, block_n, block_k, num_stages, num_warps[, programs_per_sm[, flatten]]), per projection and regime.
# SwiGLU's block_n is per half: a tile reads 2 * block_n columns of w13. Shared memory per program is
# at most stages x (block_m + 2 block_n) x block_k x 2 bytes for SwiGLU, stages x (block_m + block_n) x block_k x 2
# plain (Triton keeps one buffer fewer than the stages for some tiles): every entry stays under the 227 KB an H100
# or H200 SM gives its blocks, two programs an SM under half each once Triton's buffer count is counted.
SWEEP = {
    ("decode", "w13"): [(16, 64, 128, 3, 4), (16, 32, 256, 4, 4), (16, 128, 128, 3, 4), (16, 64, 128, 4, 4, 2),
                        (16, 64, 128, 4, 4, 1, True)],
    ("decode", "w2"): [(16, 128, 128, 4, 4), (16, 256, 64, 4, 4), (16, 64, 128, 4, 4), (16, 128, 64, 6, 4),
                       (16, 128, 128, 4, 4, 1, True)],
    ("prefill", "w13"): [(128, 128, 64, 4, 8), (64, 128, 64, 3, 4), (64, 128, 64, 4, 8), (128, 64, 64, 4, 4),
                         (64, 128, 64, 4, 4, 1, True), (64, 64, 64, 2, 4, 2)],
    ("prefill", "w2"): [(128, 256, 64, 4, 8), (64, 256, 64, 3, 4), (64, 256, 64, 4, 8), (64, 128, 64, 4, 4),
                        (64, 256, 64, 4, 4, 1, True), (64, 128, 64, 2, 4, 2)],
}
ROUNDS = 5  # cuco's kernel with the dispatch's gather three ways, timed in alternation: their gaps are a few %
TOLERANCE = 2e-2  # relative (norm) error against the loop: bf16 hidden activations rounded at different points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="the uniform cases, no sweep, fewer replays")
    ap.add_argument("--reps", type=int, default=None, help="replays per timing (default 20, --quick 5)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    if not torch.cuda.is_available():
        sys.exit("grouped_gemm: needs a CUDA GPU")
    bench = Bench(args.reps or (5 if args.quick else 20))
    ceilings = bench.ceilings()
    print(f"ceilings: tensor {ceilings['tensor']:.0f} TFLOP/s, HBM read {ceilings['hbm_read']:.0f} GB/s", flush=True)
    cases = [c for c in CASES if not (args.quick and "hot" in c)]
    rows = [bench.case(name, sweep=not args.quick) for name in cases]
    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, ceilings=ceilings,
                       torch=torch.__version__, triton=__import__("triton").__version__, reps=bench.reps)
    record.save(args.out, "grouped_gemm", info, {"cases": rows}, table(rows, info, ceilings),
                current=not args.quick)
    return 0


class Bench:
    """The weights (drawn once, with a column-major copy for torch's grouped GEMM), the L2 flush and the timers."""

    def __init__(self, reps: int):
        import torch

        from cuco.runner.judge.l2 import L2Flush
        from cuco.workload import load_workload
        from cuco.workload.reference import load_reference

        self.torch, self.reps, self.dev = torch, reps, torch.device("cuda")
        self.spec = load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3", 1)
        self.ref = load_reference(self.spec)
        self.l2 = L2Flush(self.dev)
        self.weights: dict[str, torch.Tensor] = {}
        self.captured = False

    def ceilings(self) -> dict[str, float | str]:
        """The bf16 tensor rate and HBM read rate `cuco doctor` saved, else measured now (before the weights take
        the memory), without doctor's checks for a busy GPU."""
        from cuco.ceilings import hbm_rates, tensor_rate
        from cuco.machine import load_machine

        saved = load_machine().get("ceilings") or {}
        if "tensor_bf16_tflops" in saved and "hbm_read_gbps" in saved:
            return {"tensor": saved["tensor_bf16_tflops"]["value"], "hbm_read": saved["hbm_read_gbps"]["value"],
                    "source": "cuco doctor (machine.json)"}
        tensor, _ = tensor_rate(iters=3)
        hbm, _ = hbm_rates(iters=3)["read"]
        return {"tensor": tensor, "hbm_read": hbm, "source": "measured by this script (cuco.ceilings, 3 iterations)"}

    def draw_weights(self, p: dict[str, int]) -> None:
        """The workload's own parameters (make_parameters: scaled by fan-in), and column-major copies of them."""
        if self.weights:
            return
        gen = self.torch.Generator(self.dev).manual_seed(1)
        w = self.ref.make_parameters(p, 1, 0, gen, self.dev)
        self.weights = {**w, **{f"{k}_cm": v.transpose(1, 2).contiguous().transpose(1, 2) for k, v in w.items()}}

    def time(self, fn, graph: bool = True) -> float:
        """Median ms of `reps` runs, L2 flushed before each; replays of a CUDA graph of fn where it captures
        (self.captured says whether it did: a method that cannot be captured is timed eager, launches and all)."""
        ms, self.captured = median_ms(fn, self.l2.flush, self.reps, graph=graph)
        return ms

    def case(self, name: str, sweep: bool) -> dict:
        torch = self.torch
        p = self.spec.shape(name).params
        self.draw_weights(p)
        inputs = self.ref.make_inputs(p, 1, 0, torch.Generator(self.dev).manual_seed(CASES.index(name)), self.dev)
        idx = self.ref.module.routing(inputs["logits"], p["TOPK"])[0]
        methods = Methods(torch, self.weights, inputs["x"], idx, p)
        regime = "decode" if p["T"] * p["TOPK"] / p["E"] <= 16 else "prefill"
        want = methods.run("loop_graphed")
        out = {"case": name, "T": p["T"], "hot": p["HOT"], "regime": regime, "rows": methods.rows,
               "touched": methods.touched, "flops": methods.flops, "weight_bytes": methods.weight_bytes,
               "rows_per_expert": {"max": max(methods.counts), "min": min(methods.counts)}, "methods": {}}
        alternated = []
        for m in methods.names():
            try:
                err = rel_err(methods.run(m), want)
                if not err < TOLERANCE:  # NaN fails too
                    out["methods"][m] = {"error": f"wrong result: relative error {err:.3g}"}
                    continue
                if m.startswith("triton"):
                    alternated.append(m)
                    out["methods"][m] = {"rel_err": err}
                    continue
                ms = self.time(methods.fn(m), graph=m != "loop_eager")
            except Exception as exc:  # a method this torch or GPU cannot run: recorded, not timed
                out["methods"][m] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                continue
            out["methods"][m] = {"ms": ms, "rel_err": err, "graphed": self.captured}
            print(f"{name} {m}: {ms:.4f} ms (error {err:.2g})", flush=True)
        rounds = [{m: (self.time(methods.fn(m)), self.captured) for m in alternated} for _ in range(ROUNDS)]
        for m in alternated:
            times = [r[m][0] for r in rounds]
            out["methods"][m].update(ms=statistics.median(times), rounds=times, graphed=all(r[m][1] for r in rounds))
            print(f"{name} {m}: {out['methods'][m]['ms']:.4f} ms, median of {ROUNDS} alternating rounds", flush=True)
        if sweep:
            out["sweep"] = self.sweep(methods, regime, want)
        return out

    def sweep(self, methods: Methods, regime: str, want) -> dict:
        """Each projection alone per tile shape (compiled once, shared by the cases of a regime), checked against the
        library's own tiles on the same operands; then the best of each together, checked against the loop and
        timed as the whole layer."""
        from cuco.kernels.grouped_gemm import GroupedConfig

        found = {}
        for proj in ("w13", "w2"):
            own = methods.projection(proj, None)
            mine = own().clone()
            tried = []
            for t in SWEEP[regime, proj]:
                cfg = GroupedConfig(*t)
                try:
                    fn = methods.projection(proj, cfg)
                    err = rel_err(fn(), mine)
                    if not err < TOLERANCE:
                        tried.append({"config": asdict(cfg), "error": f"wrong result: relative error {err:.3g}"})
                        continue
                    tried.append({"config": asdict(cfg), "ms": self.time(fn), "rel_err": err})
                except Exception as exc:  # a tile shape this GPU cannot hold: recorded
                    tried.append({"config": asdict(cfg), "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            timed = [r for r in tried if "ms" in r]
            found[proj] = {"own_ms": self.time(own), "tried": tried,
                           "best": min(timed, key=lambda r: r["ms"]) if timed else None}
        best = tuple(GroupedConfig(**found[p]["best"]["config"]) if found[p]["best"] else None for p in ("w13", "w2"))
        err = rel_err(methods.triton(best), want)
        found["layer"] = {"configs": [asdict(c) if c else None for c in best], "rel_err": err,
                          "ms": self.time(lambda: methods.triton(best)) if err < TOLERANCE else None}
        print(f"  sweep: best layer {found['layer']['ms']} ms", flush=True)
        return found


class Methods:
    """One case's rows sorted by expert and the ways to run its experts, each returning [rows, HID] in bf16."""

    def __init__(self, torch, weights: dict, x, idx, p: dict[str, int]):
        from cuco.kernels.grouped_gemm import sort_by_expert

        self.torch, self.w, self.p = torch, weights, p
        layout = sort_by_expert(idx, p["E"])
        self.offs, self.ends = layout.offs, layout.offs[1:].contiguous()  # _grouped_mm: each group's end
        self.x, self.src = x, layout.order // p["TOPK"]  # the tokens, and the token each sorted row is
        self.xs = x[self.src].contiguous()
        self.rows = self.xs.shape[0]
        self.counts = layout.offs.diff().tolist()
        self.touched = sum(1 for c in self.counts if c)
        hid, ff = p["HID"], p["FF"]
        self.flops = self.rows * 6 * hid * ff  # three [HID, FF] projections per pair
        self.weight_bytes = self.touched * 3 * hid * ff * 2  # each touched expert's bf16 weights once
        self.out = torch.empty_like(self.xs)
        # w2's operand when a projection runs alone: w13's output where it ran first, random values otherwise
        self.hidden = torch.randn(self.rows, ff, device=x.device).bfloat16()

    def names(self) -> list[str]:
        names = ["loop_eager", "loop_graphed", "triton", "triton, gathered first", "triton, gather in w13's loads"]
        if hasattr(self.torch, "_grouped_mm"):
            names[2:2] = ["grouped_mm_row_major", "grouped_mm_col_major"]
        return names

    def fn(self, name: str):
        return {"loop_eager": lambda: self.loop(self.offs.tolist()),
                "loop_graphed": lambda bounds=self.offs.tolist(): self.loop(bounds),
                "grouped_mm_row_major": lambda: self.grouped_mm(""),
                "grouped_mm_col_major": lambda: self.grouped_mm("_cm"),
                "triton": lambda: self.triton((None, None)),
                "triton, gathered first": self.gathered_first,
                "triton, gather in w13's loads": self.gather_in_loads}[name]

    def run(self, name: str):
        return self.fn(name)().clone()

    def loop(self, bounds: list[int]):
        """torch_host's expert loop: per expert, x W13, SwiGLU in bf16, then W2, into the sorted output."""
        F = self.torch.nn.functional
        ff = self.p["FF"]
        for e in range(self.p["E"]):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                h13 = self.xs[lo:hi] @ self.w["w13"][e]
                self.torch.matmul(F.silu(h13[:, :ff]) * h13[:, ff:], self.w["w2"][e], out=self.out[lo:hi])
        return self.out

    def grouped_mm(self, layout: str):
        """torch._grouped_mm for both projections, the SwiGLU between them in bf16 (torch's elementwise kernels)."""
        torch, ff = self.torch, self.p["FF"]
        h13 = torch._grouped_mm(self.xs, self.w["w13" + layout], offs=self.ends)
        h = torch.nn.functional.silu(h13[:, :ff]) * h13[:, ff:]
        return torch._grouped_mm(h, self.w["w2" + layout], offs=self.ends)

    def triton(self, configs):
        from cuco.kernels.grouped_gemm import moe_experts

        return moe_experts(self.xs, self.offs, self.w["w13"], self.w["w2"], out=self.out, configs=configs)

    def gathered_first(self):
        """The dispatch as grouped_triton ran it: the sorted rows written out, then the experts on them."""
        from cuco.kernels.grouped_gemm import moe_experts

        return moe_experts(self.x[self.src], self.offs, self.w["w13"], self.w["w2"], out=self.out)

    def gather_in_loads(self):
        """The dispatch inside the w13 launch: each sorted row read from the token's row where it lies."""
        from cuco.kernels.grouped_gemm import moe_experts

        return moe_experts(self.x, self.offs, self.w["w13"], self.w["w2"], rows=self.src, out=self.out)

    def projection(self, proj: str, cfg):
        """One projection alone (w13 with its SwiGLU epilogue, or w2 on a bf16 hidden activation)."""
        from cuco.kernels.grouped_gemm import grouped_gemm, grouped_swiglu

        if proj == "w13":
            return lambda: grouped_swiglu(self.xs, self.offs, self.w["w13"], self.hidden, config=cfg)
        return lambda: grouped_gemm(self.hidden, self.offs, self.w["w2"], self.out, config=cfg)


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def table(rows: list[dict], info: dict, ceilings: dict) -> list[str]:
    """The layer per case and method, its rates against the ceilings; then the sweep's best tiles."""
    lines = ["# MoE experts on one GPU: cuco's grouped GEMM, the per-expert loop, torch's grouped GEMM", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}, torch {info['torch']}, Triton "
             f"{info['triton']}; DeepSeek-V3 experts (E = 256, top-8, HID = 7168, FF = 2048), world 1. Median of "
             f"{info['reps']} CUDA-graph replays (the eager loop: runs), L2 flushed before each; cuco's kernel "
             f"(triton): the median of {ROUNDS} rounds alternating its three ways with the dispatch's gather. Ceilings "
             f"({ceilings['source']}): tensor {ceilings['tensor']:.0f} TFLOP/s, HBM read {ceilings['hbm_read']:.0f} "
             "GB/s. Targets: 70% of the tensor rate at T = 4096, 80% of HBM read at T = 128.", "",
             "| case | rows | experts touched | method | ms | TFLOP/s | of tensor | weights GB/s | of HBM read |",
             "|---" * 9 + "|"]
    for r in rows:
        for m, v in r["methods"].items():
            if "ms" not in v:
                lines.append(f"| {r['case']} | {r['rows']} | {r['touched']} | {m} | {v['error']} | | | | |")
                continue
            tflops, gbps = r["flops"] / v["ms"] / 1e9, r["weight_bytes"] / v["ms"] / 1e6
            m += " (not captured: eager)" if not v["graphed"] and m != "loop_eager" else ""
            lines.append(f"| {r['case']} | {r['rows']} | {r['touched']} | {m} | {v['ms']:.3f} | {tflops:.0f} | "
                         f"{tflops / ceilings['tensor']:.0%} | {gbps:.0f} | {gbps / ceilings['hbm_read']:.0%} |")
        layer = (r.get("sweep") or {}).get("layer") or {}
        if layer.get("ms"):
            ms = layer["ms"]
            tflops, gbps = r["flops"] / ms / 1e9, r["weight_bytes"] / ms / 1e6
            lines.append(f"| {r['case']} | {r['rows']} | {r['touched']} | triton, best swept tiles | {ms:.3f} | "
                         f"{tflops:.0f} | {tflops / ceilings['tensor']:.0%} | {gbps:.0f} | "
                         f"{gbps / ceilings['hbm_read']:.0%} |")
    swept = [r for r in rows if r.get("sweep")]
    if swept:
        lines += ["", "Per projection (cuco's kernel alone): the library's own tiles and the best swept ones "
                  "(block_m x block_n x block_k, stages, warps, programs per SM, flatten).", "",
                  "| case | projection | own ms | best ms | best tiles |", "|---|---|---|---|---|"]
        for r in swept:
            for proj in ("w13", "w2"):
                s = r["sweep"][proj]
                best = s["best"]
                tiles = ("{block_m}x{block_n}x{block_k} s{num_stages} w{num_warps} p{programs_per_sm}"
                         .format(**best["config"]) + (" flatten" if best["config"]["flatten"] else "")) if best else "-"
                best_ms = f"{best['ms']:.3f}" if best else "-"
                lines.append(f"| {r['case']} | {proj} | {s['own_ms']:.3f} | {best_ms} | {tiles} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
