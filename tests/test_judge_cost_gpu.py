"""What the judge costs a GPU run, at the decode shape m1 (one row: its inputs are a few kilobytes). A run that does
nothing (the null runs every timed evaluation interleaves: start event, every input unsealed by one kernel, end
events; the seed declares no side stream, so none is joined) costs at most 2 us more than an empty kernel between
two events (benchmarks/results/judge_fixed_cost-w2.md)."""

from __future__ import annotations

import statistics

import pytest
from conftest import WORKLOADS

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = [pytest.mark.gpu(1), pytest.mark.nvcc]
FIXED_COST_MS = 0.002


def empty_kernel_ms(iters: int = 200) -> float:
    """The median time CUDA events read around one empty kernel on a stream of its own, each pair run back to back
    behind a kernel that holds the stream while they are queued, as the runner's gate holds a run's: the host's
    launches stay out of it."""
    import torch

    stream, pairs = torch.cuda.Stream(0), []
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # cycles: tens of milliseconds, longer than queueing the pairs takes
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            torch.cuda._sleep(0)
            end.record(stream)
            pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs)


def test_a_null_run_costs_at_most_2_us_more_than_an_empty_kernel(tmp_path):
    spec = load_workload(WORKLOADS / "gemm_allreduce", 1)
    rec = evaluate(spec, spec.candidates["seed"], EvalOptions(device="cuda", shapes=["m1"], gpus=[0],
                                                               work_dir=tmp_path / "w"))
    assert rec.ok, rec.error
    null, empty = rec.shapes["m1"].timing.null_median_ms, empty_kernel_ms()
    assert null is not None and null <= empty + FIXED_COST_MS, f"null run {null} ms, empty kernel {empty} ms"
