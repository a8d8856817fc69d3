"""The judge of a candidate: it starts nothing itself (rank.py started the candidate's process beside it) and drives
that process through the stages, over a channel (process_link.py).

Every run gets fresh inputs and poisoned outputs and scratch; every timed run is snapshotted at the end of its timed
region and verified, untimed, against the reference of its own inputs (on GPUs right after it, on the CPU after the
last). A run's inputs reach the candidate only once its clock runs: on the CPU the judge writes them after starting
its clock; on GPUs they wait in the shared staging area sealed (XOR with a keystream) and the key is written to the
gate page as the gate opens.
Parameters (weights) are drawn once per shape into memory the candidate's process maps; the references read the
judge's private copy of them, and keyed digests check the shared ones unchanged after every run the judge checks.
Runs that do nothing, timed like the candidate's, measure the runner's own floor. Judges agree on every verdict
before going on, and a rank passes only by the judge writing `done`.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

from cuco.runner.judge.base import CandidateFailed, Judge, StageFailed
from cuco.runner.judge.keyed import derive, digest
from cuco.runner.judge.process_link import ProcessLink
from cuco.runner.judge.timing import cross_check
from cuco.runner.judge.verify import Check, compare, poison, same
from cuco.runner.processes.buffers import Exchange, Layout, SharedRegion, exchange_bytes, memfd_buffers
from cuco.runner.processes.candidate_handle import CandidateHandle
from cuco.runner.processes.harness import Harness
from cuco.runner.processes.job import Job
from cuco.runner.processes.pages import key_offset
from cuco.runner.processes.progress import SETUP_LIMIT_S, STARTUP_LIMIT_S
from cuco.runner.results.rank_report import CorrectnessStage, StageResult, TimingStage
from cuco.workload.spec import DELIVERED

# Runs that do nothing, timed like the candidate's (the runner's floor, for the clock cross-check and the impossible
# rule): at least this many per shape, and one per timed run where there are more, spread between the timed runs so
# that a machine busier at one moment than another moves both alike.
NULL_RUNS = 5


class CandidateJudge(Judge):
    def __init__(self, job: Job, rank: int, host: CandidateHandle) -> None:
        super().__init__(job, rank)
        self.link = ProcessLink(host, self.out, rank)
        self.seq = 0  # runs asked of the host; the done flag carries it
        self.gate_count = 0
        self.gated = self.cuda
        self.exchange: Exchange | None = None
        self.bufs: dict[str, torch.Tensor] | None = None
        self.regions: list[SharedRegion] = []  # GPU: everything the host maps, and nothing else of the judge's
        self.digests: dict[str, int] = {}  # of this rank's parameters as drawn
        self.pending: dict[str, torch.Tensor] = {}  # CPU: the next run's inputs, written once the clock runs
        self.harness = Harness(job.harness) if self.cuda else None

    def init(self) -> None:
        super().init()
        if self.cuda:
            self.key_dev = torch.zeros(1, dtype=torch.int64, device=self.device)  # the judge's copy of a run's key

    def stop(self) -> None:
        self.link.stop()

    def write_report(self, stages: list[StageResult], done: bool, **failure: Any) -> None:
        assert not done or self.link.proc is None, "the seed is written only after the host has been stopped"
        super().write_report(stages, done, **failure)

    def stages(self) -> list[StageResult]:
        results: list[StageResult] = []
        by_shape: dict[str, list] = {}
        for st in self.job.stages:
            by_shape.setdefault(st.shape, []).append(st)
        self.mark("init: the candidate's process", STARTUP_LIMIT_S)
        self.sandbox = self.link.ready()
        for n, (shape_name, stages) in enumerate(by_shape.items()):
            seed = self.seed + 7919 * (1 + n)
            params = self.open_shape(shape_name, seed + 53)  # below the timed runs' seeds, above the trials'
            for st in stages:
                if st.level in ("L2", "L3"):
                    results.append(self.correctness(st.level, st.shape, params, seed))
                else:
                    results.append(self.timing(st.shape, params, seed + 101))
                self.write_report(results, done=False)
            self.close_shape(shape_name)
        self.stop()
        return results

    # ---- keys -----------------------------------------------------------------------------------
    def run_key(self, seq: int, rank: int) -> int:
        """The 64-bit key that seals rank's inputs for run seq: from the judges' shared secret seed, so rank 0's
        judge can write every rank's key as it opens the gate."""
        return derive(self.seed, "key", seq, rank)

    def reveal_keys(self, ranks: range | list[int]) -> None:
        """The keys of the run now starting, into the gate page: from here the candidate can read its inputs."""
        for r in ranks:
            self.link.gate.write(self.run_key(self.seq, r), key_offset(r))

    # ---- inputs ---------------------------------------------------------------------------------
    def load(self, mine: dict[str, torch.Tensor]) -> None:
        """Outputs and scratch poisoned, and this rank's next inputs made ready without being readable by the
        candidate: kept by the judge (CPU), or staged sealed with the next run's key (GPU). Untimed."""
        for name in self.inputs():
            if name not in mine:
                raise CandidateFailed(f"reference.make_inputs returned no {name!r}", "workload")
        if not self.cuda:
            for lay in self.layouts:
                if lay.role in ("output", "scratch"):
                    poison(self.bufs[lay.name])
            self.pending = {name: mine[name] for name in self.inputs()}
            return
        self.key_dev.fill_(_signed(self.run_key(self.seq + 1, self.rank)))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        for n, lay in enumerate(self.layouts):
            if lay.role in DELIVERED:
                area = self.exchange[f"stage:{lay.name}"]
                area.copy_(mine[lay.name])
                self.harness.crypt(stream, area.data_ptr(), area.data_ptr(), lay.nbytes, self.key_dev.data_ptr(), n)
        self.sync()
        # Every rank has finished its previous run before any rank's buffers are restaged: a peer may still be
        # reading this rank's symmetric buffers at the end of its run (a one-shot all-reduce loads them last).
        self.barrier()
        self.link.send("stage")
        self.link.call("staged", "staging inputs")

    def deliver(self) -> None:
        """CPU: the run's inputs into the candidate's buffers, once the clock runs."""
        for name, value in self.pending.items():
            self.bufs[name].copy_(value)
        self.pending = {}

    # ---- shapes ---------------------------------------------------------------------------------
    def open_shape(self, shape_name: str, seed: int) -> dict[str, int]:
        """The shape's buffers shared with the host, its parameters drawn into them, and the host's setup. The
        references read a private copy of the parameters (`private`, as drawn), which no other process maps: it
        costs their memory once more in the judge for the shape's duration (on GPUs beside the shared regions; the
        MoE layer's 22.5 GB per GPU at world 1 become 45 GB), so that a candidate changing its weights while the
        judge checks moves no reference."""
        shape = self.spec.shape(shape_name)
        params, env = dict(shape.params), shape.env(self.world)
        self.layouts = [Layout(b.name, b.role, b.dtype, b.dims(env), b.symmetric) for b in self.spec.buffers.values()]
        self.mark(f"{shape_name}: setup", SETUP_LIMIT_S)
        self.new_shape()
        msg: dict[str, Any] = dict(buffers=[lay.to_json() for lay in self.layouts], params=params)
        fds: list[int] = []
        if self.cuda:
            # Device memory of the judge's that the host maps through descriptors (buffers.SharedRegion): the
            # exchange and the parameters, and nothing else of the judge's beside them.
            self.open_parameters(params, seed)
            self.regions = [SharedRegion.create(self.harness, exchange_bytes(self.layouts), self.device)]
            self.exchange = Exchange(self.regions[0], self.layouts)
            for n, t in self.private.items():
                self.regions.append(SharedRegion.create(self.harness, t.nbytes, self.device))
                self.own[n] = self.regions[-1].tensor[: t.nbytes].view(t.dtype).view(t.shape)
                self.own[n].copy_(t)
            self.sync()
            msg["exchange"] = self.regions[0].nbytes
            msg["parameters"] = {n: r.nbytes for n, r in zip(self.own, self.regions[1:])}
            fds = [r.handoff() for r in self.regions]
        else:
            self.bufs, fds = memfd_buffers(self.layouts)
            self.open_parameters(params, seed)
            for n, t in self.own.items():
                self.bufs[n].copy_(t.reshape(self.bufs[n].shape))
            self.private = {n: t.reshape(self.bufs[n].shape) for n, t in self.own.items()}  # as drawn: the judge's
            self.own = {n: self.bufs[n] for n in self.own}
        self.digests = self.parameter_digests()
        self.link.send("setup", fds=fds, where=f"{shape_name}: setup", **msg)
        for fd in fds:
            os.close(fd)
        self.link.call("ok", f"{shape_name}: setup")
        return params

    def parameter_digests(self) -> dict[str, int]:
        """This rank's parameters' digests, under a key of the secret's (keyed.digest)."""
        key = derive(self.seed, "digest", self.parameter_seed)
        return {n: digest(t, key) for n, t in self.own.items()}

    def parameters_changed(self) -> list[str]:
        """This rank's parameters that differ from what was drawn."""
        now = self.parameter_digests()
        return [f"{n}: parameter changed by the runs" for n in self.own if now[n] != self.digests[n]]

    def close_shape(self, shape_name: str) -> None:
        self.mark(f"{shape_name}: teardown", SETUP_LIMIT_S)
        self.link.send("teardown", where=f"{shape_name}: teardown")
        self.link.call("ok", f"{shape_name}: teardown")
        self.exchange = self.bufs = None
        self.own, self.private = {}, {}
        if self.cuda:  # the host has let go of the shared memory: back to the device
            for region in self.regions:
                region.close()
            self.regions = []
            torch.cuda.empty_cache()

    # ---- runs -----------------------------------------------------------------------------------
    def snapshot(self, role: str) -> dict[str, torch.Tensor]:
        # inputs: those checked unchanged (an inout buffer is verified instead); parameters: by digest
        names = self.outputs() if role == "output" else self.names("input")
        if self.cuda:
            key = "out" if role == "output" else "inputs_after"
            return {n: self.exchange[f"{key}:{n}"].clone() for n in names}
        return {n: self.bufs[n].clone() for n in names}

    def run_untimed(self, where: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """One run for a correctness check: the outputs and the inputs as the run left them."""
        self.barrier()
        if self.cuda:
            self.seq += 1
            self.reveal_keys([self.rank])
            self.link.send("run", seq=self.seq, gate=None, where=where)
            self.link.call("queued", where)
            self.link.call("finished", where)
        else:
            self.deliver()
            self.link.send("run", where=where)
            self.link.call("done", where)
        return self.snapshot("output"), self.snapshot("input")

    def run_timed(self, where: str, keep: bool, null: bool = False, probe: bool = False):
        """(judge's ms, the host's event ms or, on the CPU, the judge's own time to deliver the inputs, gate timed
        out, output snapshot if kept)."""
        self.link.check_reach(where)
        self.barrier()
        if not self.cuda:  # a null run is timed the same way: its inputs delivered, the host replying at once
            t0 = time.perf_counter()
            self.deliver()
            delivered_ms = (time.perf_counter() - t0) * 1e3
            self.link.send("run", null=null, where=where)
            self.link.call("done", where)
            ms = (time.perf_counter() - t0) * 1e3
            snap = self.snapshot("output") if keep else None  # the moment the host says it is done
            self.link.check_reach(where)
            return ms, delivered_ms, False, snap
        self.seq += 1
        gated = self.gated
        if gated:
            self.gate_count += 1
        t_sent = time.perf_counter()
        if not gated:  # the clock runs from here: the host may read its key
            self.reveal_keys([self.rank])
        self.link.send("run", seq=self.seq, gate=self.gate_count if gated else None, null=null, probe=probe,
                       where=where)
        self.link.call("queued", where)
        t0 = t_sent
        if gated:
            self.barrier()
            if self.rank == 0:
                t0 = time.perf_counter()
                self.reveal_keys(range(self.world))
                self.link.gate.write(self.gate_count)
        self.link.wait_done(self.seq, where)
        t_end = time.perf_counter()
        snap = self.snapshot("output") if keep else None  # at once: a done flag raised early finds no outputs
        ms = (t_end - (self.gate_opened_at(t0) if gated else t0)) * 1e3
        fin = self.link.call("finished", where)
        self.link.check_reach(where)
        try:
            event_ms = fin.floats("ms")[0]
        except (ValueError, IndexError) as exc:
            raise CandidateFailed(f"{where}: {exc}", "candidate") from None
        return ms, event_ms, bool(fin.data.get("gate_timed_out")), snap

    def gate_opened_at(self, t0: float) -> float:
        """Rank 0's clock reading as it opened the gate, on every rank. Each judge leaves the barrier at its own
        moment, and a rank whose judge left late would start its clock after its GPU had started. perf_counter is
        CLOCK_MONOTONIC, one clock for every process of the node the evaluation runs on."""
        if self.world == 1:
            return t0
        return float(self.group.broadcast(t0))

    # ---- verdicts -------------------------------------------------------------------------------
    def agree(self, checks: list[Check], what: str) -> None:
        failures = self.gather_failures([c.message for c in checks if not c.ok])
        if failures:
            raise StageFailed(f"{what}: " + "; ".join(failures[:6]))

    def check_outputs(self, outs: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[Check]:
        return [self.compare(n, outs[n], expected[n]) for n in self.outputs()]

    def compare(self, name: str, out: torch.Tensor, ref: torch.Tensor) -> Check:
        tol = self.spec.tolerance_for(name)
        return compare(name, out, ref, tol.rtol, tol.atol, tol.norm_rtol, tol.atol_scale)

    def correctness(self, level: str, shape: str, params: dict[str, int], seed: int) -> CorrectnessStage:
        """Seeded trials, each run twice on the same inputs: outputs against the reference, the two runs against
        each other, inputs and parameters as the judge wrote them."""
        tol = self.spec.tolerance
        errors: list[float] = []
        for trial in range(self.spec.timing.trials):
            where = f"{level} {shape} trial {trial}"
            self.mark_run(f"{where}: run")
            inputs = self.all_inputs(params, seed + trial)
            mine = inputs[self.rank]
            self.load(mine)
            outs, after = self.run_untimed(f"{where}: run")
            # The reference reads this rank's parameters where the candidate could write them: checked before it
            # and after it (below, after the determinism run).
            checks = [Check(False, m) for m in self.parameters_changed()]
            checks += self.check_outputs(outs, self.ref.reference(params, self.world, self.rank, inputs))
            self.agree(checks, f"{where} (seed {seed + trial})")
            errors += [c.norm_rel_err or 0.0 for c in checks]
            self.mark_run(f"{where}: determinism run")
            self.load(mine)
            again, after2 = self.run_untimed(f"{where}: determinism run")
            if tol.determinism == "bitwise":
                checks = [same(n, again[n], outs[n], "two runs on the same inputs differ") for n in self.outputs()]
            else:
                checks = [self.compare(n, again[n], outs[n]) for n in self.outputs()]
            for a in (after, after2):
                checks += [same(k, a[k], mine[k].to(a[k].dtype).reshape(a[k].shape), "input changed by the run")
                           for k in a]
            checks += [Check(False, m) for m in self.parameters_changed()]
            self.agree(checks, where)
        return CorrectnessStage(level, shape, self.spec.timing.trials, max(errors) if errors else 0.0)

    def timing(self, shape: str, params: dict[str, int], seed: int) -> TimingStage:
        """Warm-up, then the timed runs, every one verified against the reference of its own inputs and the
        parameters checked after it; between the timed runs, null runs timed the same way (null_runs). Only the
        warm-up goes unchecked. On GPUs each run is verified right after it (untimed: the clock has stopped), so that
        the judge holds one output snapshot at a time (outputs of 128 MB, 30 runs); on the CPU its snapshot is kept
        and all are verified after the last run: outputs are small there, and a reference computed between two runs
        would evict from the caches what the runs before it found there (a run of the CPU example's 512 shape took
        up to twice as long). GPU runs start from a flushed L2 either way."""
        t = self.spec.timing
        warmup = max(1, self.job.warmup if self.job.warmup is not None else t.warmup)
        iters = self.job.iters if self.job.iters is not None else t.iters
        nulls = max(NULL_RUNS, iters)
        judge_ms: list[float] = []
        reported_ms: list[float] = []  # the host's events (GPU), or the judge's own time to write the inputs (CPU)
        null_ms: list[float] = []  # the judge's clock around runs that do nothing
        null_event_ms: list[float] = []  # their events (GPU), or the judge's time to write their inputs (CPU)
        failed: dict[int, list[str]] = {}  # timed run -> this rank's failures
        kept: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}  # timed run -> (its seed, its output snapshot)
        note = ""
        for i in range(warmup + iters):
            j = i - warmup
            where = f"L4 {shape}: " + (f"warm-up {i}" if j < 0 else f"timed run {j}")
            self.mark_run(where)
            mine = self.inputs_for(params, seed + i, [self.rank])[self.rank]
            self.load(mine)
            self.flush_l2()
            ms, ev, gate_timed_out, snap = self.run_timed(where, keep=j >= 0, probe=(i == 0 and self.gated))
            if i == 0 and self.cuda and self.any_rank(gate_timed_out):
                self.gated = False
                note = "cuco_run blocks the host: timed without the start gate (launch overhead included)"
            if j < 0:
                continue
            judge_ms.append(ms)
            reported_ms.append(ev)
            kept[j] = (seed + i, snap)
            del snap
            if self.cuda:
                self.verify_kept(shape, params, kept, failed)
            if changed := self.parameters_changed():
                failed.setdefault(j, []).extend(f"after timed run {j}: {m}" for m in changed)
            more = -(-nulls * (j + 1) // iters) - len(null_ms)  # ceil: spread evenly, all of them by the last run
            nm, ne = self.null_runs(shape, mine, len(null_ms), more)
            null_ms += nm
            null_event_ms += ne
        self.verify_kept(shape, params, kept, failed)
        clock = cross_check(reported_ms, judge_ms, null_ms).to_json() if self.cuda else None
        # What delivering the inputs inside the timed region costs by itself, for the record only (on GPUs the
        # candidate's process reports it): a run with nothing else (GPU), the judge's own copy (CPU).
        inputs = null_event_ms if self.cuda else reported_ms
        return TimingStage(
            shape=shape, gated=self.gated, note=note, verified_runs=list(range(iters)),
            per_rank_ms=self.gather(reported_ms if self.cuda else judge_ms), judge_per_rank_ms=self.gather(judge_ms),
            inputs_per_rank_ms=self.gather(statistics.median(inputs) if inputs else None),
            final_output_errors=self.gather_failures(_failures(failed, iters)), clock=clock,
            clock_errors=[f"rank {r}: {c['message']}" for r, c in enumerate(self.gather(clock)) if c and not c["ok"]],
            # by the clock the candidate's times are read from: events (GPU), the judge's (CPU)
            null_per_rank_ms=self.gather(null_event_ms if self.cuda else null_ms))

    def null_runs(self, shape: str, mine: dict[str, torch.Tensor], first: int,
                  count: int) -> tuple[list[float], list[float]]:
        """Runs that do nothing but receive their inputs (the last timed run's again), timed exactly like the
        candidate's: the judge's clock around them (what the gate, the inputs, the snapshot and the done flag, or
        the messages, cost by themselves), and their events (GPU) or the judge's time to write the inputs (CPU)."""
        judge, events = [], []
        for n in range(first, first + count):
            where = f"L4 {shape}: runner overhead {n}"
            self.mark_run(where)
            if not self.cuda:  # GPU: the staged inputs are unsealed again (under another run's key: garbage, as good)
                self.load(mine)
            self.flush_l2()
            ms, ev, _, _ = self.run_timed(where, keep=False, null=True)
            judge.append(ms)
            events.append(ev)
        return judge, events

    def verify_kept(self, shape: str, params: dict[str, int], kept: dict[int, tuple[int, dict[str, torch.Tensor]]],
                    failed: dict[int, list[str]]) -> None:
        """The kept snapshots against the reference of their own runs' inputs, drawn again from their seeds (this
        rank's parameters from the judge's private copy), each dropped once checked; failures into `failed`."""
        for j, (seed, snap) in sorted(kept.items()):
            self.mark_run(f"L4 {shape}: verifying timed run {j}")
            expected = self.ref.reference(params, self.world, self.rank, self.all_inputs(params, seed))
            wrong = [f"timed run {j}: {c.message}" for c in self.check_outputs(snap, expected) if not c.ok]
            if wrong:
                failed[j] = wrong + failed.get(j, [])
            del kept[j]


def _failures(failed: dict[int, list[str]], iters: int) -> list[str]:
    """A rank's failures of its timed runs: the first failed run's in full, and which others failed."""
    if not failed:
        return []
    first = min(failed)
    more = [f"{len(failed)} of {iters} timed runs failed: {sorted(failed)}"] if len(failed) > 1 else []
    return failed[first] + more


def _signed(key: int) -> int:
    """A 64-bit key as the int64 torch stores."""
    return key - (1 << 64) if key >= 1 << 63 else key
