"""The judge of the bound's measured half: the workload's own reference compute and collective (compute_alone,
comm_alone), each timed alone in judges with no candidate process beside them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cuco.runner.judge.base import Judge
from cuco.runner.judge.group import HOST, TIMEOUT_S
from cuco.runner.judge.timing import graphed, time_references_cpu, time_references_cuda
from cuco.runner.judge.verify import poison
from cuco.runner.processes.buffers import TORCH_DTYPES
from cuco.runner.results.rank_report import BoundsStage, StageResult
from cuco.workload.contract import RankView

REFERENCE_ITERS = (10, 30)  # the fewest and most timed iterations of a reference, within the workload's iters


class BoundsJudge(Judge):
    def stages(self) -> list[StageResult]:
        results: list[StageResult] = []
        for st in self.job.stages:
            shape = self.spec.shape(st.shape)
            params, env = dict(shape.params), shape.env(self.world)
            self.open_parameters(params, self.seed)
            bufs = {b.name: self.own[b.name].view(b.dims(env)) if b.role == "parameter" else
                    torch.empty(b.dims(env), dtype=TORCH_DTYPES[b.dtype], device=self.device)
                    for b in self.spec.buffers.values()}
            inputs = self.all_inputs(params, self.seed)
            for name in self.inputs():
                bufs[name].copy_(inputs[self.rank][name])
            results.append(self.time_references(st.shape, params, inputs, bufs))
            self.write_report(results, done=False)
        return results

    def time_references(self, shape: str, params: dict[str, int], inputs: list[dict[str, torch.Tensor]],
                        bufs: dict[str, torch.Tensor]) -> BoundsStage:
        """The workload's compute alone (best library), and its collective alone, every rank's times."""
        out = BoundsStage(shape)
        staged = {n: inputs[self.rank][n].clone() for n in self.inputs()}

        def delivered(fn: Callable[[], Any]) -> Callable[[], None]:
            """The compute as a candidate is timed: its inputs written into its buffers first."""
            def run() -> None:
                for name, value in staged.items():
                    bufs[name].copy_(value)
                fn()
            return run

        if self.ref.compute_alone is not None:
            self.mark("bounds: timing compute_alone")
            fn = delivered(self.ref.compute_alone(RankView(params, self.world, self.rank, inputs, bufs)))
            if self.cuda:
                fn, out.compute_alone_graphed = graphed(fn)
            out.compute_alone_per_rank_ms = self.gather(self.time(fn, bufs))
        if self.ref.comm_alone is not None:
            group = self.comm_group()
            self.mark("bounds: timing comm_alone")
            fn = self.ref.comm_alone(RankView(params, self.world, self.rank, inputs, bufs, group))
            out.comm_alone_per_rank_ms = self.gather(self.time(fn, bufs))
        return out

    def comm_group(self) -> dist.ProcessGroup:
        """The torch.distributed group the workload's collective runs in (NCCL on GPUs, gloo on CPUs), made on first
        use. Only these judges run here, no candidate; the port of its store, which rank 0 lets the system pick,
        reaches the other judges over their authenticated group."""
        if not dist.is_initialized():
            store = dist.TCPStore(HOST, 0, self.world, True, timeout=timedelta(seconds=TIMEOUT_S),
                                  wait_for_workers=False) if self.rank == 0 else None
            port = self.group.broadcast(store.port if store is not None else None)
            if store is None:
                store = dist.TCPStore(HOST, port, self.world, False, timeout=timedelta(seconds=TIMEOUT_S))
            dist.init_process_group("nccl" if self.cuda else "gloo", store=store, rank=self.rank,
                                    world_size=self.world, device_id=self.device if self.cuda else None)
        return dist.group.WORLD

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        super().close()

    def time(self, fn: Callable[[], Any], bufs: dict[str, torch.Tensor]) -> list[float]:
        t = self.spec.timing

        def before() -> None:
            for name in self.names("output", "scratch"):
                poison(bufs[name])
            if self.cuda and t.l2_flush:
                self.l2.flush()

        iters = max(REFERENCE_ITERS[0], min(t.iters, REFERENCE_ITERS[1]))
        if self.cuda:
            return time_references_cuda(fn, before, self.barrier, torch.cuda.current_stream(self.device), t.warmup,
                                        iters)
        return time_references_cpu(fn, before, self.barrier, t.warmup, iters)
