"""Timing owned by the framework: every rank released at once, every candidate stream waited for.

GPU: each timed iteration is queued behind a gate kernel that spins on a host page shared by the
ranks of the node; once every rank has queued its work (host barrier), one store opens all gates
together. The start event follows the gate and every side stream waits on it, so host launch
overhead and rank skew stay out of the numbers, and the end is the latest of the streams' end
events. Inputs stay fixed, outputs are poisoned and L2 is flushed before each iteration (not timed).
CPU: host barrier, then wall clock around run() on each rank.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

GATE_TIMEOUT_NS = 30_000_000_000  # a gate left closed this long means the host never released it
PROBE_TIMEOUT_NS = 2_000_000_000  # first gated iteration: detects a cuco_run that blocks the host


class Gate:
    """A uint64 counter in a /dev/shm page, mapped into every rank's GPU address space."""

    def __init__(self, harness, path: str, rank: int, device: torch.device) -> None:
        self.harness, self.rank = harness, rank
        fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(fd, mmap.PAGESIZE)
        os.close(fd)
        self.host_ptr = _address_of(self.map)
        self.dev_ptr = harness.host_register(self.host_ptr, mmap.PAGESIZE)
        self.timed_out = torch.zeros(1, dtype=torch.int32, device=device)
        self.count = int.from_bytes(self.map[0:8], "little")

    def close(self) -> None:
        self.harness.host_unregister(self.host_ptr)

    def arm(self, stream: torch.cuda.Stream, timeout_ns: int) -> None:
        self.count += 1
        self.harness.gate(stream.cuda_stream, self.dev_ptr, self.count, timeout_ns, self.timed_out.data_ptr())

    def release(self) -> None:
        if self.rank == 0:
            self.map[0:8] = self.count.to_bytes(8, "little")

    def check_timed_out(self) -> bool:
        hit = bool(self.timed_out.item())
        self.timed_out.zero_()
        return hit


def _address_of(m: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


@dataclass
class TimingResult:
    times_ms: list[float]
    gated: bool
    note: str = ""


def time_cuda(run: Callable[[], None], before: Callable[[], None], barrier: Callable[[], None],
              any_rank: Callable[[bool], bool], stream: torch.cuda.Stream, side_streams: list[torch.cuda.Stream], gate: Gate | None,
              warmup: int, iters: int) -> TimingResult:
    streams = [stream, *side_streams]
    for _ in range(warmup):
        before()
        barrier()
        run()
        torch.cuda.synchronize()
    gated, note, times = gate is not None, "", []
    for i in range(iters):
        before()
        if gated:
            gate.arm(stream, PROBE_TIMEOUT_NS if i == 0 else GATE_TIMEOUT_NS)
        else:
            torch.cuda.synchronize()
            barrier()
        start = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for s in side_streams:
            s.wait_event(start)
        run()
        ends = []
        for s in streams:
            e = torch.cuda.Event(enable_timing=True)
            e.record(s)
            ends.append(e)
        if gated:
            barrier()
            gate.release()
        torch.cuda.synchronize()
        if gated and any_rank(gate.check_timed_out()):
            gated, note = False, "cuco_run blocks the host: timed without the start gate (launch overhead included)"
            continue
        times.append(max(start.elapsed_time(e) for e in ends))
    return TimingResult(times, gated, note)


def time_cpu(run: Callable[[], None], before: Callable[[], None], barrier: Callable[[], None],
             warmup: int, iters: int) -> TimingResult:
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
    return TimingResult(times, False, "CPU wall clock per rank after a host barrier")
