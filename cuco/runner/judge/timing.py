"""Clocks the framework owns.

A candidate is timed by its rank's judge (judge/candidate.py), a process the candidate cannot reach:
- CPU: the judge's wall clock from the command that starts the run to the host's reply that it is done.
- GPU: every rank's stream waits behind a gate kernel spinning on a shared host page; once all ranks have
  queued their run, one store opens every gate (and, just before it, the keys to each rank's sealed inputs,
  which the runner's stream unseals into the candidate's buffers right after the start event, so that the
  inputs' arrival is part of every time). The host records CUDA events around the run (precise),
  and the judge's own clock runs from opening the gate to seeing the done flag the stream raises after the
  run and its snapshot (trusted). The events count only if they agree with the judge's clock
  (`cross_check`): a process that reports a time it did not take is rejected.
The bound's references (the best library's compute alone and the collective alone) are trusted code run in
a judge with no candidate at all; they are timed in-process here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# The judge's clock and the GPU's events disagree honestly by the judge's reaction time (polling a host page,
# a Python loop) and scheduling noise; a reported time must not need more than this to fit the judge's.
CLOCK_EVENT_EPS_MS = 0.02  # an event time longer than the judge's own by more than this is impossible
CLOCK_REL_SLACK = 0.2  # of the judge's median
CLOCK_ABS_SLACK_MS = 0.02
# How the bound's references are timed: part of their cache key, so that a change here measures them again.
REFERENCE_TIMING = ("events after a launch-covering spin; compute alone replayed as a CUDA graph, its inputs "
                    "written into its buffers first")
# The spin before a reference's start event: 2e6 clock cycles, 1 ms at the 2 GHz of an H100/H200 SM, far more than
# torch needs to launch a GEMM or a collective (tens of microseconds).
LAUNCH_COVER_CYCLES = 2_000_000


@dataclass
class ClockCheck:
    judge_median_ms: float
    event_median_ms: float
    null_median_ms: float  # the judge's clock around a run that does nothing: gate, inputs, snapshot, done flag
    unexplained_ms: float  # judge - runner overhead - events: time the candidate's report leaves out
    allowed_ms: float
    ok: bool
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cross_check(event_ms: list[float], judge_ms: list[float], null_ms: list[float]) -> ClockCheck:
    """Do the times the candidate's process reported fit what the judge saw, iteration by iteration? Only the
    judge's own readings make the allowance: the null runs' judge time (the inputs' delivery is in it and in the
    events alike, so an honest run leaves a little less than nothing unexplained)."""
    jm, em = statistics.median(judge_ms), statistics.median(event_ms)
    nm = statistics.median(null_ms) if null_ms else 0.0
    unexplained = jm - nm - em
    allowed = max(CLOCK_REL_SLACK * jm, CLOCK_ABS_SLACK_MS)
    longer = [i for i, (e, j) in enumerate(zip(event_ms, judge_ms)) if e > j + CLOCK_EVENT_EPS_MS]
    msg = ""
    if longer:
        i = longer[0]
        msg = (f"the candidate's process reported {event_ms[i]:.4f} ms for timed iteration {i}, longer than the "
               f"judge's own clock saw ({judge_ms[i]:.4f} ms): the reported times are not the runs'")
    elif unexplained > allowed:
        msg = (f"the candidate's process reported a median of {em:.4f} ms but the judge's clock saw {jm:.4f} ms "
               f"({nm:.4f} ms of it the runner's own overhead): {unexplained:.4f} ms unaccounted for, more than "
               f"the {allowed:.4f} ms allowed")
    return ClockCheck(jm, em, nm, unexplained, allowed, not msg, msg)


def graphed(run: Callable[[], None]) -> tuple[Callable[[], None], bool]:
    """The reference captured into a CUDA graph and replayed, or itself where it cannot be captured (a host sync,
    an operation graphs refuse). A compute reference of many small kernels (an MoE layer's hundreds of per-expert
    GEMMs at a few tokens each) takes longer for Python to launch than for the GPU to run, and a bound must count
    the GPU's work: replayed, it launches once."""
    import torch

    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            run()  # cuBLAS handles and workspaces exist before the capture
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    except Exception:  # noqa: BLE001  (any failure to capture: time it as it is)
        torch.cuda.synchronize()
        return run, False
    return graph.replay, True


def time_references_cuda(run: Callable[[], None], before: Callable[[], None], barrier: Callable[[], None],
                         stream, warmup: int, iters: int) -> list[float]:
    """CUDA events around trusted reference code, every rank started after a host barrier. The stream first
    spins for a while, so that the run's launches are all queued when its start event fires: a small GEMM takes
    less time on the GPU than torch takes to launch it, and the bound must not include that."""
    import torch

    for _ in range(warmup):
        before()
        torch.cuda.synchronize()
        barrier()
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        before()
        torch.cuda.synchronize()
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(LAUNCH_COVER_CYCLES)
        start.record(stream)
        run()
        end.record(stream)
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_references_cpu(run: Callable[[], None], before: Callable[[], None], barrier: Callable[[], None],
                        warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        before()
        barrier()
        run()
    times = []
    for _ in range(iters):
        before()
        barrier()
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return times
