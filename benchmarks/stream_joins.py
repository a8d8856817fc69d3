"""What the stream graph of a GPU run costs by itself (cuco/runner/processes/candidate_process.py run_gpu, without the
judge): an empty kernel between two events, a tiny kernel (the unsealing of a few kilobytes), then that kernel with
one and with two side streams gated behind it and joined back, their end events read as the run's. Each variant
queued behind a kernel that holds the stream (as the gate holds a run), 60 runs at a time (fewer launches than a
stream queues), the median, each variant measured twice in turn.

    python benchmarks/stream_joins.py

Writes benchmarks/results/stream_joins.json and .md (the previous pair moves to archive/).
"""

from __future__ import annotations

import statistics

import record
import torch

VARIANTS = ("empty", "tiny", "one side stream", "two side streams")
RUNS = 60
HOLD_CYCLES = 200_000_000  # about 0.1 s at Hopper's clocks: far longer than queueing the runs takes


def event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def measure(variant: str, main: torch.cuda.Stream, sides: list[torch.cuda.Stream], buf: torch.Tensor) -> float:
    """The median over RUNS of the latest end event after the start event, in microseconds."""
    joined = sides[: {"one side stream": 1, "two side streams": 2}.get(variant, 0)]
    runs = []
    with torch.cuda.stream(main):
        torch.cuda._sleep(HOLD_CYCLES)
        for _ in range(RUNS):
            start = event()
            start.record(main)
            if variant == "empty":
                torch.cuda._sleep(0)
            else:
                buf.add_(1.0)
            delivered = torch.cuda.Event()
            delivered.record(main)
            for s in joined:
                s.wait_event(delivered)
            ends = [event() for _ in range(1 + len(joined))]
            for e, s in zip(ends, [main, *joined]):
                e.record(s)
            for e in ends[1:]:
                main.wait_event(e)
            runs.append((start, ends))
    torch.cuda.synchronize()
    return statistics.median(max(start.elapsed_time(e) for e in ends) for start, ends in runs) * 1e3


def main() -> None:
    main_stream = torch.cuda.Stream(0)
    sides = [torch.cuda.Stream(0, priority=-100), torch.cuda.Stream(0)]  # as host.py makes them
    buf = torch.zeros(4096, device="cuda")
    measure("tiny", main_stream, sides, buf)  # the add kernel's module loads on its first launch
    got = {v: [] for v in VARIANTS}
    for _ in range(2):
        for v in VARIANTS:
            got[v].append(measure(v, main_stream, sides, buf))
    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name(0)}]}, world=1)
    lines = [f"# The stream graph of a GPU run, alone ({info['date'][:10]}, {info['device']}, commit {info['commit']})",
             "", f"`{info['command']}`", "", "| variant | us (two passes) | over an empty kernel, us |",
             "|---|---|---|"]
    empty = statistics.median(got["empty"])
    lines += [f"| {v} | {' '.join(f'{x:.2f}' for x in got[v])} | {statistics.median(got[v]) - empty:.2f} |"
              for v in VARIANTS]
    record.save(record.ROOT / "benchmarks" / "results", "stream_joins", info, {"us": got}, lines)


if __name__ == "__main__":
    main()
