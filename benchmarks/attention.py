"""Ring attention's block on every attention kernel torch offers, and the fused log-sum-exp merge, on one GPU.

Blocks: Llama-3-8B heads (H 32, KV 8, D 128, bf16), L = S / (2 * world) rows for S = 8K, 32K, 128K and world 1, 2, 4, 8,
each as the causal diagonal block and as a full block; and the whole sequence, causal, at each S, the efficiency
the blocks are held to. Backends: torch's cuDNN attention and torch's flash kernel, as cuco.kernels.attention calls
them (grouped-query heads in the ring's [L, H, D] buffers), and cuDNN split by query rows (cudnn_split<R>, at each
R of SPLIT_ROWS no more than half the block). Before any is timed, each one's O and log-sum-exp are
checked against an fp32 reference on sampled query rows, and against every other backend's. Times: median of 20
CUDA-graph replays (eager, after a spin, where capture fails), CUDA events, L2 flushed before each as the judge
flushes it (reading twice its size: a written flush would charge the timed run its write-back). TFLOP/s counts
4 * Lq * Lk * D * H, halved for a causal block; the share is of the bf16 tensor rate `cuco doctor` measures (its
saved ceiling, else measured here the same way). The table ends with the choice per shape and the CHOICE entries
for cuco/kernels/attention.py: the shapes where the default, cuDNN, lost.

The merge: a block's O and log-sum-exp into a running fp32 O, by the fused kernel (one pass) and by torch's separate
ops, at block lengths the ring uses, each checked against the other first; GB/s is the fused pass's bytes over the
time. Writes benchmarks/results/attention.json and .md (--quick: a subset, to results/archive/).

    python benchmarks/attention.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

import record
from replay import median_ms

ROOT = record.ROOT
H, KV, D = 32, 8, 128  # Llama-3-8B's attention heads
SIZES = (8192, 32768, 131072)
WORLDS = (1, 2, 4, 8)
MERGE_ROWS = (2048, 8192, 32768)
QUICK = {"sizes": (8192, 32768), "worlds": (2, 4), "merge_rows": (2048, 8192)}
ITERS = 20
WARMUP = 3
MARGIN = 0.02  # another backend replaces cuDNN only when this much faster: the same block's run-to-run spread is ~1%
SAMPLE_ROWS = 16  # query rows checked against the fp32 reference (the first, the last, evenly between)


def flops(lq: int, lk: int, causal: bool) -> float:
    return 4 * lq * lk * D * H / (2 if causal else 1)


def shapes(sizes: tuple[int, ...], worlds: tuple[int, ...]) -> list[dict[str, Any]]:
    """The whole sequence at each S, then each block length the ring uses (once, with every (S, world) it serves),
    each causal and full."""
    out = [{"L": s, "causal": True, "whole": True, "serves": [[s, 1]]} for s in sizes]
    lengths: dict[int, list[list[int]]] = {}
    for s in sizes:
        for w in worlds:
            lengths.setdefault(s // (2 * w), []).append([s, w])
    return out + [{"L": n, "causal": c, "whole": False, "serves": serves}
                  for n, serves in sorted(lengths.items()) for c in (True, False)]


def sampled_reference(q, k, v, causal: bool, rows):
    """fp32 O and log-sum-exp of the query rows `rows`, each against every key it sees (grouped heads, no repeat)."""
    import torch

    group = H // KV
    qs = q[rows].float().view(len(rows), KV, group, D)
    s = torch.einsum("qngd,knd->ngqk", qs, k.float()) * D ** -0.5  # [KV, group, rows, Lk]
    if causal:
        keys = torch.arange(k.shape[0], device=q.device)
        s.masked_fill_(keys[None, :] > rows[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("ngqk,knd->qngd", torch.softmax(s, -1), v.float())
    return o.reshape(len(rows), H, D), lse.reshape(H, len(rows))


def errors(o, lse, want_o, want_lse) -> dict[str, float]:
    """O's error relative to the whole output's size (bf16 rounding: about 4e-3), the log-sum-exp's largest error
    relative to the workload's tolerance for it (1e-4 + 1e-4 * |lse|: at most 1 to pass)."""
    o_err = ((o.float() - want_o).norm() / want_o.norm()).item()
    lse_err = ((lse - want_lse).abs() / (1e-4 + 1e-4 * want_lse.abs())).max().item()
    return {"o_rel_err": o_err, "lse_err_of_tol": lse_err}


def passes(err: dict[str, float]) -> bool:
    return err["o_rel_err"] < 2e-2 and err["lse_err_of_tol"] <= 1.0  # NaN fails both


def check(outs: dict[str, Any], q, k, v, causal: bool) -> dict[str, dict[str, Any]]:
    """Each backend's result against the sampled fp32 reference and against every other backend's."""
    import torch

    rows = torch.linspace(0, q.shape[0] - 1, SAMPLE_ROWS, device=q.device).round().long().unique()
    want = sampled_reference(q, k, v, causal, rows)
    checks = {}
    for name, (o, lse) in outs.items():
        vs_ref = errors(o[rows], lse[:, rows], *want)
        others = [errors(o, lse, ob.float(), lb) for other, (ob, lb) in outs.items() if other != name]
        checks[name] = {"vs_reference": vs_ref, "vs_other": others[0] if others else None,
                        "ok": passes(vs_ref) and all(passes(e) for e in others)}
    return checks


def make_timer(flush):
    """Median ms of ITERS replays of fn (a CUDA graph where it captures), each after flush(), and whether it was
    captured."""
    return lambda fn: median_ms(fn, flush, ITERS, warmup=WARMUP)


def tensor_rates() -> dict[str, tuple[float, str]]:
    """The bf16 tensor rates `cuco doctor` saved on this machine (burst, and sustained under the power cap), each
    measured now by the same method where it saved none."""
    from cuco.ceilings import GEMM_SHAPES, sustained_tensor_rate, tensor_rate
    from cuco.machine import load_machine

    saved = load_machine().get("ceilings") or {}
    out = {}
    for what, key, measure in (("burst", "tensor_bf16_tflops", tensor_rate),
                               ("sustained", "tensor_bf16_sustained_tflops",
                                lambda: sustained_tensor_rate(GEMM_SHAPES[0]))):
        if saved.get(key):
            out[what] = saved[key]["value"], f"cuco doctor's saved ceiling: {saved[key]['method']}"
        else:
            value, method = measure()
            out[what] = value, f"measured here as cuco doctor does: {method}"
    return out


def shape_backends(backends: list[str], n: int) -> list[str]:
    """The backends, and cuDNN split by each row count of at most half the block where cuDNN runs."""
    from cuco.kernels.attention import SPLIT_ROWS

    return backends + [f"cudnn_split{r}" for r in SPLIT_ROWS if "cudnn" in backends and n >= 2 * r]


def run_shape(shape: dict[str, Any], backends: list[str], timed, rate: float) -> dict[str, Any]:
    """One block shape: inputs, every backend's result checked, then each timed (where every check passed)."""
    import torch

    from cuco.kernels.attention import block_attention

    n, causal = shape["L"], shape["causal"]
    backends = shape_backends(backends, n)
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(n, heads, D, device="cuda", generator=gen, dtype=torch.bfloat16)
               for heads in (H, KV, KV))
    outs = {b: block_attention(q, k, v, causal, backend=b) for b in backends}
    checks = check(outs, q, k, v, causal)
    del outs
    result = {**shape, "tflop": flops(n, n, causal) / 1e12, "backends": {}}
    for b in backends:
        entry = {"check": checks[b]}
        if all(c["ok"] for c in checks.values()):
            ms, captured = timed(lambda b=b: block_attention(q, k, v, causal, backend=b))
            tflops = flops(n, n, causal) / (ms * 1e-3) / 1e12
            entry.update(ms=ms, graphed=captured, tflops=tflops, of_tensor_rate=tflops / rate)
        result["backends"][b] = entry
    timed_ones = {b: e["ms"] for b, e in result["backends"].items() if "ms" in e}
    fastest = min(timed_ones, key=timed_ones.get) if timed_ones else None
    beats_cudnn = fastest and timed_ones[fastest] < (1 - MARGIN) * timed_ones.get("cudnn", float("inf"))
    result["fastest"], result["chosen"] = fastest, fastest if beats_cudnn else (fastest and "cudnn")
    print(f"{'whole' if shape['whole'] else 'block'} L={n} {'causal' if causal else 'full'}: "
          + ", ".join(f"{b} {e['ms']:.4f} ms {e['tflops']:.0f} TFLOP/s" if "ms" in e else f"{b} failed its check"
                      for b, e in result["backends"].items()), flush=True)
    return result


def run_merge(rows: int, timed) -> dict[str, Any]:
    """The fused merge against torch's separate ops at one block length (fp32 running O, bf16 block O)."""
    import torch

    from cuco.kernels.attention import merge_lse_

    gen = torch.Generator(device="cuda").manual_seed(rows)
    acc = torch.randn(rows, H, D, device="cuda", generator=gen)
    acc_lse = torch.randn(H, rows, device="cuda", generator=gen) + 8
    o = torch.randn(rows, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    lse = torch.randn(H, rows, device="cuda", generator=gen) + 8
    both = {f: (acc.clone(), acc_lse.clone()) for f in (True, False)}
    for f, (a, al) in both.items():
        merge_lse_(a, al, o, lse, fused=f)
    diff = max((both[True][0] - both[False][0]).abs().max().item(), (both[True][1] - both[False][1]).abs().max().item())
    moved = rows * H * D * (4 + 4 + 2) + 3 * H * rows * 4  # O read and written, the block's read; three lse passes
    out: dict[str, Any] = {"rows": rows, "bytes": moved, "max_abs_diff": diff}
    for name, f in (("fused", True), ("torch_ops", False)):
        out[f"{name}_ms"], _ = timed(lambda f=f: merge_lse_(acc, acc_lse, o, lse, fused=f))
    print(f"merge L={rows}: fused {out['fused_ms'] * 1e3:.1f} us, torch ops {out['torch_ops_ms'] * 1e3:.1f} us "
          f"(max diff {diff:.2g})", flush=True)
    return out


def choice_entries(blocks: list[dict[str, Any]]) -> list[str]:
    """Lines of cuco.kernels.attention.CHOICE: the blocks whose chosen backend is not the default (cuDNN), each
    shape once (a whole sequence is the diagonal block of its length)."""
    lines = {}
    for r in blocks:
        if r["chosen"] and r["chosen"] != "cudnn" and "cudnn" in r["backends"]:
            them, ours = r["backends"]["cudnn"]["ms"], r["backends"][r["chosen"]]["ms"]
            key = f"({H}, {KV}, {D}, {r['causal']}, {r['L']}, {r['L']})"
            lines.setdefault(key, f"    {key}: \"{r['chosen']}\",  # {ours:.4f} ms, cuDNN {them:.4f}")
    return list(lines.values())


def report(info: dict[str, Any], results: list[dict[str, Any]], merges: list[dict[str, Any]],
           backends: list[str], rate: float) -> list[str]:
    whole = {r["L"]: r for r in results if r["whole"]}
    sustained = info["tensor_rate_sustained_tflops"]

    def of_sustained(r):
        """A whole sequence's chosen rate as a share of the sustained tensor rate."""
        best = r["backends"].get(r["chosen"] or "", {})
        return f"{best['tflops'] / sustained:.0%} of the sustained rate" if "ms" in best else "-"

    def cell(e):
        if e is None:
            return "-"
        if "ms" not in e:
            return "check failed"
        return f"{e['ms']:.4f} ({e['tflops']:.0f}, {e['of_tensor_rate']:.0%})"

    def best_split(r):
        """The fastest cudnn_split<R> of the block, as `R: cell`."""
        timed = {b: e for b, e in r["backends"].items() if b.startswith("cudnn_split") and "ms" in e}
        if not timed:
            return "-"
        b = min(timed, key=lambda b: timed[b]["ms"])
        return f"{b.removeprefix('cudnn_split')}: {cell(timed[b])}"

    def of_whole(r):
        """The chosen backend's block efficiency over the whole sequence's (chosen) at each S the block serves."""
        best = r["backends"].get(r["chosen"] or "", {})
        parts = []
        for s, w in r["serves"]:
            ref = whole.get(s)
            if "ms" in best and ref and ref["chosen"]:
                parts.append(f"{best['tflops'] / ref['backends'][ref['chosen']]['tflops']:.0%} at {s // 1024}K/w{w}")
        return ", ".join(parts) or "-"

    lines = ["# Ring attention's block: every attention kernel on one GPU", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}, torch {info['torch']}, cuDNN "
             f"{info['cudnn']}; `{info['command']}`. Llama-3-8B heads (H {H}, KV {KV}, D {D}), bf16, grouped-query "
             f"heads in the ring's [L, H, D] buffers. ms: median of {ITERS} CUDA-graph replays, L2 flushed before "
             f"each; in brackets TFLOP/s (causal counted as half the pairs) and the share of the tensor rate, "
             f"{rate:.0f} TFLOP/s ({info['tensor_rate_method']}). A whole sequence's last column: its share of the "
             f"sustained tensor rate, {sustained:.0f} TFLOP/s ({info['tensor_rate_sustained_method']}): the rate under "
             "the power cap that long work runs at. Each backend checked against an fp32 reference on sampled rows "
             "and against the others before timing.", "",
             "| S / world | L | block | " + " | ".join(f"{b} ms (TFLOP/s, of tensor rate)" for b in backends)
             + " | cudnn split by R query rows, the best R: ms (TFLOP/s, of tensor rate) | chosen | chosen's "
             "efficiency of the whole sequence's (a whole sequence: of the sustained rate) |",
             "|---" * (len(backends) + 6) + "|"]
    for r in results:
        served = ", ".join(f"{s // 1024}K/{w}" for s, w in r["serves"])
        kind = "whole, causal" if r["whole"] else ("causal (diagonal)" if r["causal"] else "full")
        last = of_sustained(r) if r["whole"] else of_whole(r)
        lines.append(f"| {served} | {r['L']} | {kind} | " + " | ".join(cell(r["backends"].get(b)) for b in backends)
                     + f" | {best_split(r)} | {r['chosen'] or '-'} | {last} |")
    entries = choice_entries(results)
    lines += ["", "CHOICE for cuco/kernels/attention.py (blocks where another backend beat the default, cuDNN, by "
              f"more than {MARGIN:.0%}):", "",
              "```python", "CHOICE = {" + ("" if entries else "}"), *entries, *(["}"] if entries else []), "```",
              "", "## The log-sum-exp merge", "",
              "A block's O (bf16) and log-sum-exp merged into a running fp32 O and log-sum-exp ([L, 32, 128]), in "
              "place. GB/s: the fused pass's bytes (running O read and written, the block's read, the log-sum-exps) "
              "over the time.", "",
              "| L | fused us (GB/s) | torch ops us (GB/s) | fused speedup | max difference |", "|---|---|---|---|---|"]
    for m in merges:
        gbs = {k: m["bytes"] / (m[f"{k}_ms"] * 1e-3) / 1e9 for k in ("fused", "torch_ops")}
        lines.append(f"| {m['rows']} | {m['fused_ms'] * 1e3:.1f} ({gbs['fused']:.0f}) | "
                     f"{m['torch_ops_ms'] * 1e3:.1f} ({gbs['torch_ops']:.0f}) | "
                     f"{m['torch_ops_ms'] / m['fused_ms']:.2f}x | {m['max_abs_diff']:.2g} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="S = 8K and 32K at world 2 and 4 only (a partial run)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from cuco.kernels.attention import cudnn_fits
    from cuco.runner.judge.l2 import L2Flush

    if not torch.cuda.is_available():
        sys.exit("attention: needs a CUDA GPU")
    sizes, worlds, merge_rows = ((QUICK["sizes"], QUICK["worlds"], QUICK["merge_rows"]) if args.quick
                                 else (SIZES, WORLDS, MERGE_ROWS))
    probe = torch.empty(2, H, D, device="cuda", dtype=torch.bfloat16)
    backends = (["cudnn"] if cudnn_fits(probe, probe[:, :KV]) else []) + ["flash"]
    rates = tensor_rates()
    rate, rate_how = rates["burst"]
    timed = make_timer(L2Flush(torch.device("cuda")).flush)
    results = []
    for shape in shapes(sizes, worlds):
        results.append(run_shape(shape, backends, timed, rate))
        gc.collect()
        torch.cuda.empty_cache()
    merges = [run_merge(n, timed) for n in merge_rows]
    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, torch=torch.__version__,
                       cudnn=torch.backends.cudnn.version(), triton=triton.__version__, tensor_rate_tflops=rate,
                       tensor_rate_method=rate_how, tensor_rate_sustained_tflops=rates["sustained"][0],
                       tensor_rate_sustained_method=rates["sustained"][1], quick=args.quick)
    lines = report(info, results, merges, backends, rate)
    record.save(args.out, "attention", info, {"backends": backends, "blocks": results, "merge": merges}, lines,
                current=not args.quick)
    return 0 if all(r["fastest"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
