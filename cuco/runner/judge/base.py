"""What every judge does: join the judges' own process group, share the secret seed, draw every rank's inputs and
parameters from it, and write its rank's report.

A judge holds its own rank's parameters once per shape (`own`; the candidate's judge shares that memory with the
candidate's process, and keeps a private copy for its references, `private`) and draws another rank's afresh for
each reference that needs them: weights are most of an MoE layer's memory (benchmarks/results/judge_memory.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from cuco.paths import atomic_write_json
from cuco.runner.judge.group import JudgeGroup
from cuco.runner.judge.keyed import generator, new_secret
from cuco.runner.judge.l2 import L2Flush
from cuco.runner.processes.buffers import TORCH_DTYPES
from cuco.runner.processes.job import JUDGE_PORT_ENV, Job, read_token
from cuco.runner.processes.progress import (
    FIRST_RUN_LIMIT_S,
    JIT_FIRST_RUN_LIMIT_S,
    RUN_FLOOR_S,
    RUN_MULTIPLE,
    STARTUP_LIMIT_S,
    line,
)
from cuco.runner.results.rank_report import RankReport, StageResult
from cuco.workload.reference import ReferenceMissing, load_reference
from cuco.workload.spec import DELIVERED, VERIFIED, load_workload


class StageFailed(Exception):
    """A verdict every rank agreed on: the candidate ran and was wrong."""


class CandidateFailed(Exception):
    """The candidate's process failed: its own error (failure "candidate"), a crash, or the runner's side under it;
    or the workload's reference did (failure "workload")."""

    def __init__(self, message: str, failure: str) -> None:
        super().__init__(message)
        self.failure = failure


class Judge:
    """One rank's judge, of either kind; `stages` is the kind's work."""

    sandbox = ""  # how the candidate's process is confined; a judge without one has none

    def __init__(self, job: Job, rank: int) -> None:
        # Read before anything runs here (the workload's reference.py is loaded below), after the candidate's
        # process was forked off (rank.py), which so never holds it.
        self.token = read_token()
        self.job, self.rank, self.world = job, rank, job.world
        self.t0 = time.monotonic()
        self.out = Path(job.out_dir)
        self.progress = open(self.out / f"rank{rank}.progress", "a", buffering=1)
        self.longest_run_s, self.run_started = 0.0, None  # of the shape's run steps (mark)
        self.spec = load_workload(Path(job.workload_root), job.world)
        try:
            self.ref = load_reference(self.spec)
        except ReferenceMissing as exc:
            raise CandidateFailed(str(exc), "workload") from None
        self.cuda = job.device == "cuda"
        self.device = torch.device("cuda", job.gpus[rank] if job.gpus else rank) if self.cuda else torch.device("cpu")
        self.own: dict[str, torch.Tensor] = {}  # this rank's parameters, drawn once per shape (open_parameters)
        self.private: dict[str, torch.Tensor] = {}  # the same values, what references read: no other process maps them
        self.parameter_seed = 0
        self.seed: int | None = None
        self.reported: list[StageResult] = []  # the stages of the last report written

    def stages(self) -> list[StageResult]:
        raise NotImplementedError

    def stop(self) -> None:
        """Ends whatever the judge started beside itself, before its final report."""

    # ---- the judges' group ----------------------------------------------------------------------
    def mark(self, what: str, limit_s: float | None = None, run: bool = False) -> None:
        """A step, with the seconds since the rank started and how long it may take (none: the evaluation's own
        limit): the launcher stops every rank when one takes longer than that to mark its next step, and names the
        step it hung in (progress.py). A run step's limit follows the shape's longest run step so far."""
        now = time.monotonic()
        if self.run_started is not None:
            self.longest_run_s = max(self.longest_run_s, now - self.run_started)
        self.run_started = now if run else None
        if run and self.longest_run_s:
            limit_s = max(RUN_FLOOR_S, RUN_MULTIPLE * self.longest_run_s)
        elif run:
            limit_s = FIRST_RUN_LIMIT_S if self.job.language == "cuda" else JIT_FIRST_RUN_LIMIT_S
        self.progress.write(line(now - self.t0, what, limit_s))

    def mark_run(self, what: str) -> None:
        self.mark(what, run=True)

    def new_shape(self) -> None:
        """The next run step is the shape's first."""
        self.longest_run_s, self.run_started = 0.0, None

    def init(self) -> None:
        self.mark("init: process group", STARTUP_LIMIT_S)
        self.group = JudgeGroup(self.rank, self.world, int(os.environ[JUDGE_PORT_ENV]), self.token)
        self.token = ""
        self.seed = int(self.group.broadcast(new_secret() if self.rank == 0 else None))
        if self.cuda:
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
            self.l2 = L2Flush(self.device)

    def barrier(self) -> None:
        self.group.barrier()

    def any_rank(self, flag: bool) -> bool:
        return self.group.any(flag)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, as JSON over the judges' authenticated group (group.py): nothing a judge receives is
        unpickled."""
        return self.group.all_gather(obj)

    def gather_failures(self, mine: list[str]) -> list[str]:
        return [f"rank {r}: {m}" for r, ms in enumerate(self.gather(mine)) for m in ms]

    def close(self) -> None:
        """Leaves the judges' group, once the final report is written."""
        self.group.close()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def flush_l2(self) -> None:
        if self.cuda and self.spec.timing.l2_flush:
            self.l2.flush()
            self.sync()

    # ---- buffers, inputs and parameters ---------------------------------------------------------
    def names(self, *roles: str) -> list[str]:
        return [b.name for b in self.spec.buffers.values() if b.role in roles]

    def outputs(self) -> list[str]:
        """The buffers verified against the reference: outputs, and inputs the run updates in place."""
        return self.names(*VERIFIED)

    def inputs(self) -> list[str]:
        """The buffers given fresh for every run: inputs, and those the run updates in place."""
        return self.names(*DELIVERED)

    def inputs_for(self, params: dict[str, int], seed: int,
                   ranks: range | list[int]) -> dict[int, dict[str, torch.Tensor]]:
        """Inputs of the given ranks, from per-rank seeds, so each judge computes its reference alone, and their
        parameters: this rank's private copy (never the memory a candidate's process maps), another rank's drawn
        again (dropped with the inputs)."""
        out = {}
        for r in ranks:
            out[r] = self.ref.make_inputs(params, self.world, r, generator(self.device, "inputs", seed, r), self.device)
            out[r].update(self.private if r == self.rank else self.draw_parameters(params, r))
        return out

    def all_inputs(self, params: dict[str, int], seed: int) -> list[dict[str, torch.Tensor]]:
        by_rank = self.inputs_for(params, seed, range(self.world))
        return [by_rank[r] for r in range(self.world)]

    def open_parameters(self, params: dict[str, int], seed: int) -> None:
        """This rank's parameters for the shape: `private` as drawn, and `own` naming the same tensors until a judge
        replaces them with the copies it shares."""
        self.parameter_seed = seed
        self.private = self.draw_parameters(params, self.rank)
        self.own = dict(self.private)

    def draw_parameters(self, params: dict[str, int], rank: int) -> dict[str, torch.Tensor]:
        """rank's parameters, from reference.make_parameters where the workload has it (then make_inputs need not
        draw the weights on every run), else from make_inputs. Each in a storage of its own (it may be shared)."""
        names = self.names("parameter")
        if not names:
            return {}
        make = self.ref.make_parameters or self.ref.make_inputs
        gen = generator(self.device, "parameters", self.parameter_seed, rank)
        values = make(params, self.world, rank, gen, self.device)
        missing = [n for n in names if n not in values]
        if missing:
            fn = "make_parameters" if self.ref.make_parameters else "make_inputs"
            raise CandidateFailed(f"reference.{fn} returned no {missing[0]!r}", "workload")
        out = {}
        for n in names:
            t = values.pop(n).to(TORCH_DTYPES[self.spec.buffers[n].dtype]).contiguous()
            out[n] = t if t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes else t.clone()
        return out

    # ---- the report -----------------------------------------------------------------------------
    def write_report(self, stages: list[StageResult], done: bool, **failure: Any) -> None:
        """The rank's report file. The seed goes in only when done, once nothing of the candidate's is left: the
        run folder is readable to it."""
        self.reported = list(stages)
        report = RankReport(self.rank, self.reported, done, sandbox=self.sandbox,
                            seed=self.seed if done else None, **failure)
        atomic_write_json(self.out / f"rank{self.rank}.json", report.to_json())
