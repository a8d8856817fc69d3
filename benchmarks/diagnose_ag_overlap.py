"""Where the 8192^3 GEMM+AllGather overlap loses time, measured piece by piece.

One process, two GPUs, torch only (copy engine through cudaMemcpyPeerAsync). For rank 0 of world 2 it times:
the full GEMM [8192,8192]x[8192,4096]; the two half-row GEMMs back to back and on two streams; the 64 MB
shard copy pulled from GPU 1 and pushed by GPU 1, each with the other direction running too; and a half
GEMM overlapped with each copy. If half GEMM + overlap is far above the half GEMM alone, the copy slows the
GEMM; if the two halves are far above the full GEMM, splitting costs.

    python benchmarks/diagnose_ag_overlap.py [--m 8192 --k 8192 --n 8192]

It prints its table; the recorded one, with what it showed, is benchmarks/results/diagnose_ag_overlap.md.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def timed(fn, streams, iters: int = 20) -> float:
    """Median ms from an event on the first stream (GPU 0) until every stream is done: the others join the
    first through events, since timing events cannot be compared across devices."""
    out = []
    for _ in range(iters + 3):
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(streams[0])
        for s in streams[1:]:
            s.wait_event(start)
        fn()
        for s in streams[1:]:
            done = torch.cuda.Event()
            done.record(s)
            streams[0].wait_event(done)
        end.record(streams[0])
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        out.append(start.elapsed_time(end))
    return statistics.median(out[3:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    a = ap.parse_args()
    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    m, k, n = a.m, a.k, a.n // 2
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    A = torch.randn(m, k, device=d0, dtype=torch.bfloat16)
    B = torch.randn(k, n, device=d0, dtype=torch.bfloat16)
    C = torch.empty(m, n, device=d0, dtype=torch.bfloat16)
    shard1 = torch.randn(m // 2, k, device=d1, dtype=torch.bfloat16)  # GPU 1's shard of A
    shard0 = A[: m // 2]
    recv0 = torch.empty(m // 2, k, device=d0, dtype=torch.bfloat16)
    recv1 = torch.empty(m // 2, k, device=d1, dtype=torch.bfloat16)
    main0, side0 = torch.cuda.Stream(d0), torch.cuda.Stream(d0, priority=-100)
    side1 = torch.cuda.Stream(d1, priority=-100)
    half = m // 2

    def gemm_full():
        with torch.cuda.stream(main0):
            torch.matmul(A, B, out=C)

    def gemm_halves():
        with torch.cuda.stream(main0):
            torch.matmul(A[:half], B, out=C[:half])
            torch.matmul(A[half:], B, out=C[half:])

    def pull_both():  # each GPU reads the other's shard (the strategy's CE pull)
        with torch.cuda.stream(side0):
            recv0.copy_(shard1, non_blocking=True)
        with torch.cuda.stream(side1):
            recv1.copy_(shard0, non_blocking=True)

    def push_both():  # each GPU's stream writes its own shard into the other
        with torch.cuda.stream(side1):
            recv0.copy_(shard1, non_blocking=True)
        with torch.cuda.stream(side0):
            recv1.copy_(shard0, non_blocking=True)

    def overlap(copy):
        def run():
            copy()
            with torch.cuda.stream(main0):
                torch.matmul(A[:half], B, out=C[:half])
        return run

    side_gemm = torch.cuda.Stream(d0)

    def gemm_halves_two_streams():  # the second half fills SMs as the first one's tail frees them
        with torch.cuda.stream(main0):
            torch.matmul(A[:half], B, out=C[:half])
        with torch.cuda.stream(side_gemm):
            torch.matmul(A[half:], B, out=C[half:])

    def half_gemm():
        with torch.cuda.stream(main0):
            torch.matmul(A[:half], B, out=C[:half])

    rows = [
        ("GEMM, all rows", timed(gemm_full, [main0])),
        ("two half GEMMs", timed(gemm_halves, [main0])),
        ("two half GEMMs on two streams", timed(gemm_halves_two_streams, [main0, side_gemm])),
        ("one half GEMM", timed(half_gemm, [main0])),
        ("pull 64 MB both ways", timed(pull_both, [side0, side1])),
        ("push 64 MB both ways", timed(push_both, [side0, side1])),
        ("half GEMM + pull", timed(overlap(pull_both), [main0, side0, side1])),
        ("half GEMM + push", timed(overlap(push_both), [main0, side0, side1])),
    ]
    print(f"| M={a.m} K={a.k} N={a.n} (rank 0 of 2) | ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.4f} |")


if __name__ == "__main__":
    main()
