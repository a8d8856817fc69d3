"""What Triton offers the decode GEMM at 128 rows, where cuco's kernel (cuco/kernels/decode.py) trails cuBLAS: wider
tiles with K split to fill the SMs, clusters of CTAs sharing a tile, and warp specialisation, each against cuBLAS and
cuco's default at the decode shapes' per-rank K, N, on one GPU.

At 128 rows every byte of B feeds 128 multiply-adds: streaming B at the HBM rate takes about 70% of the tensor rate,
so the loads and the MMAs must overlap, and A (128 x K) is read again from L2 by every column tile: 64-wide tiles read
A twice as often as B's bytes. Wider tiles read it less but leave fewer tiles than SMs, so K is split, and the split's
sum costs what a 128-row partial costs. Warp specialisation (a producer warp feeding consumer warp groups) runs in a
child process with a time limit: a kernel that never finishes is reported as such, not waited on.
Times: medians of three alternating rounds of 50 graph replays, L2 flushed before each, random bf16.
Writes benchmarks/results/decode_rows128.json and .md.

    python benchmarks/decode_rows128.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import record
from replay import graph_median_ms

ROOT = record.ROOT
M = 128
KN = ((8192, 8192), (4096, 8192), (8192, 4096))  # the decode shapes' per-rank K, N at world 1 and 2 (decode_gemm.py)
ROUNDS = 3
WS_LIMIT_S = 90  # a warp-specialised child that has not printed its times by then is stopped


def variants(n: int, k: int, sms: int):
    """name -> DecodeConfig: each tile width split as far as one program per SM (the kernel's own rule)."""
    from cuco.kernels.decode import DecodeConfig, split_k_for

    def split(block_n: int, block_k: int) -> int:
        return split_k_for(n // block_n, k, block_k, sms)

    return {
        "64 wide (BK 128, 4 stages, 4 warps)": DecodeConfig(64, 128, split(64, 128), 4, 4),
        "128 wide, split (BK 64, 4 stages, 8 warps)": DecodeConfig(128, 64, split(128, 64), 4, 8),
        "128 wide, split (BK 128, 3 stages, 8 warps)": DecodeConfig(128, 128, split(128, 128), 3, 8),
        "256 wide, split (BK 64, 4 stages, 8 warps)": DecodeConfig(256, 64, split(256, 64), 4, 8),
        # a cluster's CTAs cannot share the split's counter (gemm_decode refuses it): K whole
        "128 wide on a cluster of 2 (64 each), K whole": DecodeConfig(128, 128, 1, 4, 4, num_ctas=2),
    }


def warp_specialised(k: int, n: int) -> dict:
    """Run in a child (the --ws flag): the 64-wide tile's loop with Triton's warp specialisation, timed alike."""
    import torch
    import triton
    import triton.language as tl

    from cuco.kernels.common import descriptor
    from cuco.runner.judge.l2 import L2Flush

    @triton.jit
    def kernel(a_desc, b_desc, c, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        col = tl.program_id(0) * BLOCK_N
        acc = tl.zeros((128, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=4, warp_specialize=True):
            acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, col]), acc)
        rn = col + tl.arange(0, BLOCK_N)
        tl.store(c + tl.arange(0, 128)[:, None] * N + rn[None, :], acc.to(c.dtype.element_ty))

    dev = torch.device("cuda")
    a, b = torch.randn(M, k, device=dev).bfloat16(), torch.randn(k, n, device=dev).bfloat16()
    c = torch.full((M, n), float("nan"), device=dev, dtype=torch.bfloat16)
    run = lambda: kernel[(n // 64,)](descriptor(a, [128, 128], True), descriptor(b, [128, 64], True), c, n, k,  # noqa: E731
                                     BLOCK_N=64, BLOCK_K=128, num_warps=4)
    run()
    torch.cuda.synchronize()
    ref = (a @ b).float()
    err = ((c.float() - ref).norm() / ref.norm()).item()
    return {"rel_err": err, "ms": graph_median_ms(run, L2Flush(dev).flush) if err < 1e-2 else None}


def ws_child(k: int, n: int) -> dict:
    """warp_specialised(k, n) in a child process, stopped after WS_LIMIT_S."""
    try:
        child = subprocess.run([sys.executable, __file__, "--ws", str(k), str(n)], capture_output=True, text=True,
                               timeout=WS_LIMIT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {WS_LIMIT_S} s (stopped)"}
    lines = child.stdout.strip().splitlines()
    if child.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"error": f"exit code {child.returncode}: {(child.stderr.strip().splitlines() or [''])[-1][:160]}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--ws", nargs=2, type=int, metavar=("K", "N"), help=argparse.SUPPRESS)  # the child's work
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    if args.ws:
        print(json.dumps(warp_specialised(*args.ws)), flush=True)
        return 0
    if not torch.cuda.is_available():
        sys.exit("decode_rows128: needs a CUDA GPU")
    from cuco.kernels.decode import decode_config_for, decode_workspace, gemm_decode
    from cuco.runner.judge.l2 import L2Flush

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    l2 = L2Flush(dev)
    rows, ws_failed = [], None
    for k, n in KN:
        a, b = torch.randn(M, k, device=dev).bfloat16(), torch.randn(k, n, device=dev).bfloat16()
        ref, c = (torch.empty(M, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        torch.matmul(a, b, out=ref)
        configs = {"cuco's default": decode_config_for(M, n, k, sms), **variants(n, k, sms)}
        runs, entries = {"cuBLAS": lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref)}, {}
        for name, cfg in configs.items():
            ws = decode_workspace(M, n, k, dev, cfg)  # made before the graph's capture
            run = lambda a=a, b=b, c=c, cfg=cfg, ws=ws: gemm_decode(a, b, c, config=cfg, workspace=ws)  # noqa: E731
            tiles = triton.cdiv(n, cfg.block_n)
            entries[name] = {"config": asdict(cfg), "ctas": tiles * cfg.split_k * cfg.num_ctas,
                             "a_from_l2_mb": tiles * M * k * 2 / 1e6}
            try:
                c.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
            except Exception as exc:  # a tile or cluster this GPU or this Triton cannot run: recorded, not timed
                entries[name]["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                continue
            entries[name]["rel_err"] = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
            if entries[name]["rel_err"] < 1e-2:
                runs[name] = run
        rounds = [{name: graph_median_ms(fn, l2.flush) for name, fn in runs.items()} for _ in range(ROUNDS)]
        for name in runs:
            entries.setdefault(name, {})["ms"] = statistics.median(r[name] for r in rounds)
        ws = {"error": f"not run: {ws_failed}"} if ws_failed else ws_child(k, n)
        if "error" in ws and not ws_failed:
            ws_failed = f"at {M}x{k}x{n}: {ws['error']}"
        entries["64 wide, warp-specialised loop (BK 128, 4 stages, 4 warps)"] = ws
        rows.append({"shape": [M, k, n], "entries": entries})
        print(f"{M}x{k}x{n}: " + ", ".join(f"{x} {e['ms'] * 1e3:.1f} us" if e.get("ms") else f"{x} {e.get('error')}"
                                           for x, e in entries.items()), flush=True)

    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, triton=triton.__version__)
    lines = [f"# The decode GEMM at {M} rows: what Triton offers against cuBLAS", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}, Triton {triton.__version__}. Medians of "
             f"{ROUNDS} alternating rounds of 50 graph replays, L2 flushed before each (the warp-specialised loop: "
             f"one round, in a child process). CTAs: against the GPU's {sms} SMs. A from L2: A read once per column "
             "tile (B is read once from HBM).", "",
             "| M,K,N | variant | CTAs | A from L2 MB | us | vs cuBLAS |", "|---|---|---|---|---|---|"]
    for r in rows:
        cublas = r["entries"]["cuBLAS"]["ms"]
        for name, e in r["entries"].items():
            us = f"{e['ms'] * 1e3:.1f}" if e.get("ms") else e.get("error", f"wrong (rel. error {e.get('rel_err')})")
            vs = f"{cublas / e['ms']:.2f}x" if e.get("ms") else "-"
            a_l2 = f"{e['a_from_l2_mb']:.0f}" if "a_from_l2_mb" in e else "-"
            lines.append(f"| {','.join(map(str, r['shape']))} | {name} | {e.get('ctas', '-')} | {a_l2} | {us} | "
                         f"{vs} |")
    record.save(args.out, "decode_rows128", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
