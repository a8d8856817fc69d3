"""The microbenchmarks behind the ceilings: the best rate this GPU reaches at each resource (tensor cores, HBM,
the peer link), each with the method that reached it. measure.py runs them, guarded against a busy GPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# (M, K, N): square and skinny, since cuBLAS's best tile choice, and so its rate, moves with the shape (on an H100 it
# multiplied 4096 x 8192 x 8192 faster than any of the first four).
GEMM_SHAPES = ((8192, 8192, 8192), (16384, 8192, 8192), (8192, 16384, 16384), (4096, 16384, 8192),
               (4096, 8192, 8192), (8192, 8192, 4096), (8192, 4096, 8192))
HBM_BYTES = 2 << 30  # 2 GiB per buffer: 40x an H100's or H200's L2 (50 MB), so no pass is served from it
LINK_SIZES_MB = (64, 256, 1024)
# Work per timing of the sustained tensor rate: 50x the ~6 ms of full-rate tensor work after which an H200's driver
# held its clocks down to stay under its 700 W cap (1980 -> 1500-1650 MHz; benchmarks/results/power_cap.md).
SUSTAINED_MS = 300.0


def _timed(fn: Callable[[], Any], iters: int) -> float:
    """Milliseconds per call: the best of `iters` calls after two warm-up calls, each timed by CUDA events."""
    import torch

    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def tensor_rate(iters: int = 10) -> tuple[float, str]:
    """Dense bf16 TFLOP/s through cuBLAS: the best of several large shapes on random data, and the fastest of them
    again on zeros. The rate moves with the data (the tensor cores draw less power on zeros, so the clocks stay
    higher: benchmarks/results/logs/tensor_rate_by_data-w1.log), and a workload's own data may run faster than random
    data does: the ceiling is the best the chip reaches on any data, or an honest candidate could beat it."""
    import torch

    def rate(m: int, k: int, n: int, fill) -> float:
        a, b = fill(m, k), fill(k, n)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return 2 * m * n * k / (_timed(lambda: torch.matmul(a, b, out=c), iters) * 1e-3) / 1e12

    def randn(r: int, c: int):
        return torch.randn(r, c, device="cuda", dtype=torch.bfloat16)

    def zeros(r: int, c: int):
        return torch.zeros(r, c, device="cuda", dtype=torch.bfloat16)

    random_rates = {shape: rate(*shape, randn) for shape in GEMM_SHAPES}
    fastest = max(random_rates, key=random_rates.get)
    on_zeros = rate(*fastest, zeros)
    where = "x".join(map(str, fastest))
    return max(on_zeros, random_rates[fastest]), (
        f"cuBLAS bf16 GEMM, best of {len(GEMM_SHAPES)} shapes on random data ({where} fastest, "
        f"{random_rates[fastest]:.0f}) and that shape on zeros ({on_zeros:.0f})")


def sustained_tensor_rate(shape: tuple[int, int, int], iters: int = 3) -> tuple[float, str]:
    """Dense bf16 TFLOP/s of one GEMM shape run back to back for SUSTAINED_MS, on random data: the rate under the
    board's power cap, which long work (a 128K-token attention, a large MoE layer) runs at. Not a bound: a short
    kernel runs at the burst rate of tensor_rate, so the speed of light divides by that one; this one says how
    much of the gap between them long work cannot close."""
    import math

    import torch

    m, k, n = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    calls = max(1, math.ceil(SUSTAINED_MS / _timed(lambda: torch.matmul(a, b, out=c), 2)))

    def run() -> None:
        for _ in range(calls):
            torch.matmul(a, b, out=c)

    ms = _timed(run, iters)
    return 2 * m * n * k * calls / (ms * 1e-3) / 1e12, (
        f"cuBLAS bf16 GEMM {m}x{k}x{n} on random data, {calls} calls back to back ({ms:.0f} ms), best of {iters}")


def hbm_rates(iters: int = 10) -> dict[str, tuple[float, str]]:
    """HBM GB/s reading, writing and copying, each the best of torch's kernel and cuco's Triton one."""
    import torch

    from cuco.ceilings.stream import read_all, write_all

    n = HBM_BYTES // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    sums = torch.empty(4096, device="cuda")
    runs = {
        "read": (HBM_BYTES, {"Triton, 16-byte loads": lambda: read_all(src, sums),
                             "torch sum": lambda: src.sum()}),
        "write": (HBM_BYTES, {"Triton, 16-byte stores": lambda: write_all(dst, 1.0),
                              "torch fill": lambda: dst.fill_(1.0)}),
        "copy": (2 * HBM_BYTES, {"torch copy": lambda: dst.copy_(src)}),
    }
    out = {}
    for what, (moved, kernels) in runs.items():
        rates = {name: moved / (_timed(fn, iters) * 1e-3) / 1e9 for name, fn in kernels.items()}
        name = max(rates, key=rates.get)
        tried = ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
        out[what] = (rates[name], f"{name} over {HBM_BYTES >> 30} GiB ({tried} GB/s)")
    return out


def link_rates(iters: int = 5) -> dict[str, tuple[float, str]] | None:
    """GB/s per direction between GPU 0 and 1 through the copy engine: one way, and both ways at once (the rate
    each direction keeps while the other is busy), the best of several sizes. None with fewer than two GPUs."""
    import torch

    if torch.cuda.device_count() < 2:
        return None
    best = {"one_way": (0.0, 0), "both_ways": (0.0, 0)}
    for mb in LINK_SIZES_MB:
        n = mb << 20
        a0, b0 = (torch.empty(n, dtype=torch.uint8, device="cuda:0") for _ in range(2))
        a1, b1 = (torch.empty(n, dtype=torch.uint8, device="cuda:1") for _ in range(2))
        s0, s1 = torch.cuda.Stream("cuda:0"), torch.cuda.Stream("cuda:1")

        def one_way(b1=b1, a0=a0, s0=s0) -> None:
            with torch.cuda.stream(s0):
                b1.copy_(a0, non_blocking=True)
            s0.synchronize()

        def both_ways(b1=b1, a0=a0, b0=b0, a1=a1, s0=s0, s1=s1) -> None:
            with torch.cuda.stream(s0):
                b1.copy_(a0, non_blocking=True)
            with torch.cuda.stream(s1):
                b0.copy_(a1, non_blocking=True)
            s0.synchronize()
            s1.synchronize()

        for key, fn in (("one_way", one_way), ("both_ways", both_ways)):
            rate = n / (_wall_ms(fn, iters) * 1e-3) / 1e9
            if rate > best[key][0]:
                best[key] = (rate, mb)
        del a0, b0, a1, b1
    sizes = ", ".join(map(str, LINK_SIZES_MB))
    ways = {"one_way": "one direction", "both_ways": "both directions at once"}
    return {key: (rate, f"copy engine (cudaMemcpyPeerAsync) between GPU 0 and 1, {ways[key]}, best of {sizes} MB "
                        f"({mb} MB fastest)") for key, (rate, mb) in best.items()}


def _wall_ms(fn: Callable[[], None], iters: int) -> float:
    """Milliseconds of a call that synchronises its own streams (two devices: no one event pair times both)."""
    fn()
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def probe_gemm() -> float:
    """TFLOP/s of one 8192^3 bf16 GEMM: the probe measure() runs before and after, to see the rates hold."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / (_timed(lambda: a @ a, 5) * 1e-3) / 1e12
