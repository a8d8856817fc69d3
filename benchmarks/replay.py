"""How the one-GPU benchmarks time a kernel, the same way in every script: CUDA-graph replays where the work
captures (the GPU's time, not Python's launches, as the judge's start gate times a candidate), each after an L2
flush, CUDA events around each, the median taken."""

from __future__ import annotations

import statistics
from collections.abc import Callable

SPIN_CYCLES = 2_000_000  # about 1 ms at Hopper clocks: work that does not capture has its launches queued first


def median_ms(fn: Callable[[], object], flush: Callable[[], None], reps: int = 50, warmup: int = 0,
              graph: bool = True) -> tuple[float, bool]:
    """Median ms of `reps` runs of fn, each after flush(): replays of a CUDA graph of fn where it captures (graph
    and capture succeeded: the second value), else fn itself behind a spin, launches and all."""
    import torch

    from cuco.runner.judge.timing import graphed

    if graph:
        run, captured = graphed(fn)  # fn runs once before the capture: compiled and warm
    else:
        fn()
        run, captured = fn, False
    for _ in range(warmup):
        run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        flush()
        if not captured:
            torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), captured


def graph_median_ms(fn: Callable[[], object], flush: Callable[[], None], reps: int = 50) -> float:
    """median_ms of work that must capture: a benchmark that compares kernels times none of them with launches."""
    ms, captured = median_ms(fn, flush, reps)
    if not captured:
        raise RuntimeError("could not be captured in a CUDA graph")
    return ms
