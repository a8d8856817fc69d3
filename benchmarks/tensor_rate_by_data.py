"""How the bf16 GEMM rate moves with the data multiplied: the tensor ceiling a speed of light divides by must be
the rate of the easiest data a workload could bring, since the clocks rise as the switching falls.

    python benchmarks/tensor_rate_by_data.py        # one GPU; prints one line per shape and data
"""

from __future__ import annotations

import torch

SHAPES = ((8192, 8192, 8192), (4096, 8192, 8192))


def rate(a: torch.Tensor, b: torch.Tensor, iters: int = 20) -> float:
    """TFLOP/s of torch.matmul (cuBLAS): the best of `iters` event-timed calls after three warm-up calls."""
    c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / (best * 1e-3) / 1e12


def main() -> None:
    for m, k, n in SHAPES:
        data = {"randn": lambda *s: torch.randn(*s, device="cuda"),
                "randn/k^0.25": lambda *s, k=k: torch.randn(*s, device="cuda") / k**0.25,  # the GEMM workloads'
                "rand 0..1": lambda *s: torch.rand(*s, device="cuda"),
                "zeros": lambda *s: torch.zeros(*s, device="cuda")}
        for name, make in data.items():
            a, b = make(m, k).bfloat16(), make(k, n).bfloat16()
            print(f"{m}x{k}x{n} {name:14s} {rate(a, b):6.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
