"""One rank's judge, started by rank.py.

The judge owns everything a score is made of, in a process the candidate cannot reach: the seeds (drawn
by rank 0's judge and shared among the judges, never written anywhere the candidate can read), every
rank's inputs, the reference, the comparisons and the clock. The candidate runs in a host process of its
own (host.py) that this judge starts, confined, and drives over a channel; the two share only this
rank's buffers. Every run gets fresh inputs and poisoned outputs and scratch; of the timed runs, some
chosen at random (the host cannot tell which) are snapshotted at the end of the timed region and verified.
A run's inputs reach the candidate only once its clock runs: on the CPU the judge writes them after starting
its clock; on GPUs they wait in the shared staging area sealed (XOR with a keystream) and the key is written
to the gate page as the gate opens. Parameters (weights) are drawn once per shape and checked unchanged.
Judges agree on every verdict before going on, and a rank passes only by the judge writing `done`.
In bounds mode there is no host at all: the judges time the workload's reference compute and collective.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cuco.paths import atomic_write_json
from cuco.runner.buffers import BOUNCE, BOUNCE_BYTES, TORCH_DTYPES, Exchange, Layout, memfd_buffers
from cuco.runner.channel import ChannelClosed, RemoteError, Reply
from cuco.runner.harness import Harness
from cuco.runner.host_process import HostProcess
from cuco.runner.job import JUDGE_PORT_ENV, Job, Stage
from cuco.runner.l2 import L2Flush
from cuco.runner.launch import describe_exit
from cuco.runner.pages import key_offset
from cuco.runner.sandbox import judge_state, kill_descendants, remove_shm_files, state_changes
from cuco.runner.timing import cross_check, graphed, time_references_cpu, time_references_cuda
from cuco.runner.verify import Check, compare, poison, same
from cuco.workload.contract import RankView
from cuco.workload.reference import ReferenceMissing, load_reference
from cuco.workload.spec import READ_ROLES, load_workload

VERIFIED_RUNS = 2  # timed runs whose outputs are verified, chosen at random per shape
NULL_RUNS = 5  # runs that do nothing, timed by the judge: its own overhead, for the clock cross-check
HOST_START_S = 120.0  # the host's imports, process group and NCCL communicator


class StageFailed(Exception):
    """A verdict every rank agreed on: the candidate ran and was wrong."""


class CandidateFailed(Exception):
    """The candidate's process failed: its own error (kind "candidate"), a crash, or the runner's side under it."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Judge:
    def __init__(self, job: Job, rank: int, host: HostProcess | None) -> None:
        self.job, self.rank, self.world = job, rank, job.world
        self.host = host
        self.t0 = time.monotonic()
        self.out = Path(job.out_dir)
        self.progress = open(self.out / f"rank{rank}.progress", "a", buffering=1)
        self.spec = load_workload(Path(job.workload_root), job.world)
        try:
            self.ref = load_reference(self.spec)
        except ReferenceMissing as exc:
            raise CandidateFailed(str(exc), "workload") from None
        self.cuda = job.device == "cuda"
        self.device = torch.device("cuda", job.gpus[rank] if job.gpus else rank) if self.cuda else torch.device("cpu")
        self.proc = host.proc if host else None  # None once the host is stopped
        self.seq = 0  # runs asked of the host; the done flag carries it
        self.gate_count = 0
        self.gated = self.cuda
        self.sandbox = ""
        self.exchange: Exchange | None = None
        self.bufs: dict[str, torch.Tensor] | None = None
        self.parameters: dict[int, dict[str, torch.Tensor]] = {}  # every rank's, drawn once per shape
        self.pending: dict[str, torch.Tensor] = {}  # CPU: the next run's inputs, written once the clock runs
        self.harness = Harness(job.harness) if self.cuda and host else None

    # ---- plumbing -------------------------------------------------------------------------------
    def mark(self, what: str) -> None:
        """A step, with the seconds since the rank started: the launcher names the last one if the rank hangs."""
        self.progress.write(f"{time.monotonic() - self.t0:.3f}\t{what}\n")

    def barrier(self) -> None:
        dist.barrier(group=self.gloo)

    def any_rank(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.gloo)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, as JSON: nothing a judge receives is unpickled, so a process that pushed its way
        into the judges' group could at worst make the evaluation fail."""
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([data.numel()]), group=self.gloo)
        longest = int(max(sizes).item())
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: data.numel()] = data
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.gloo)
        return [json.loads(bytes(p[: int(n.item())].tolist())) for p, n in zip(parts, sizes)]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def init(self) -> None:
        self.mark("init: process group")
        store = dist.TCPStore("127.0.0.1", int(os.environ[JUDGE_PORT_ENV]), self.world, self.rank == 0,
                              timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world)
        self.gloo = dist.group.WORLD
        box = torch.tensor([random.SystemRandom().randrange(2**31) if self.rank == 0 else 0])
        dist.broadcast(box, src=0, group=self.gloo)
        self.seed = int(box.item())
        if self.cuda:
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
            self.l2 = L2Flush(self.device)
            self.key_dev = torch.zeros(1, dtype=torch.int64, device=self.device)  # the judge's copy of a run's key

    def run_key(self, seq: int, rank: int) -> int:
        """The 64-bit key that seals rank's inputs for run seq: from the judges' shared secret seed, so rank 0's
        judge can write every rank's key as it opens the gate."""
        digest = hashlib.blake2b(f"{self.seed}:{seq}:{rank}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def reveal_keys(self, ranks: range | list[int]) -> None:
        """The keys of the run now starting, into the gate page: from here the candidate can read its inputs."""
        for r in ranks:
            self.host.gate.write(self.run_key(self.seq, r), key_offset(r))

    # ---- the candidate's host -------------------------------------------------------------------
    def host_ready(self) -> None:
        self.mark("init: the candidate's process")
        self.sandbox = str(self.call("ready", timeout_s=HOST_START_S, where="start-up").data.get("sandbox", ""))[:300]
        self.state = judge_state()  # every thread of this judge exists by now

    def check_reach(self, where: str) -> None:
        """Fails the candidate if this judge's scheduling, affinity or limits changed: only a process beside it
        could have changed them, to slow its clock's reader or make it fail."""
        now = judge_state()
        changes = state_changes(self.state, now)
        if changes:
            raise CandidateFailed(f"{where}: this rank's judge was reached from outside: {changes[0]} (a candidate "
                                  f"may not change its judge's scheduling or limits)", "candidate")
        for tid, value in now.threads.items():  # threads started since: checked from now on
            self.state.threads.setdefault(tid, value)

    def _host_gone(self, where: str) -> CandidateFailed:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return CandidateFailed(f"the candidate's process stopped answering during {where}", "crash")
        if where == "start-up":  # nothing of the candidate's has been loaded yet: the runner's own failure
            return CandidateFailed(f"cuco's process for the candidate ended ({describe_exit(code)}) during start-up, "
                                   f"before loading it; its output is in {self.out / f'rank{self.rank}.log'}",
                                   "runner")
        if code < 0:
            return CandidateFailed(f"the candidate's process was {describe_exit(code)} during {where}", "crash")
        return CandidateFailed(f"the candidate's process exited with status {code} during {where}: a candidate may "
                               f"not end its process, and passes only by finishing every run", "candidate")

    def call(self, expect: str, where: str, timeout_s: float | None = None) -> Reply:
        """The host's next reply, which must be `expect`; any other outcome is the candidate's failure."""
        try:
            return self.host.chan.expect(expect, timeout_s)
        except ChannelClosed:
            raise self._host_gone(where) from None
        except RemoteError as exc:
            # The runner's code in the candidate's process fails on its own only before the candidate is loaded;
            # after that, the candidate shares the process and may have caused it.
            runner = exc.where == "framework" and where == "start-up"
            raise CandidateFailed(str(exc), "runner" if runner else "candidate") from None
        except (ValueError, TimeoutError) as exc:
            raise CandidateFailed(f"{where}: {exc}", "candidate") from None

    def send(self, kind: str, fds: list[int] | None = None, **fields: Any) -> None:
        try:
            self.host.chan.send(kind, fds=fds, where=fields.pop("where", kind), **fields)
        except ChannelClosed:
            raise self._host_gone(kind) from None

    def stop_host(self) -> None:
        """The host has nothing to keep once its last reply is in: it is killed with everything it started,
        detached or not, rather than waited for through its own exit."""
        if self.proc is None:
            return
        kill_descendants()
        remove_shm_files([self.proc.pid])
        self.proc = None
        shutil.rmtree(self.host.scratch, ignore_errors=True)

    # ---- inputs ---------------------------------------------------------------------------------
    def inputs_for(self, params: dict[str, int], seed: int,
                   ranks: range | list[int]) -> dict[int, dict[str, torch.Tensor]]:
        """Inputs of the given ranks, from per-rank seeds, so each judge computes its reference alone; the
        parameters are the shape's, drawn once (`draw_parameters`)."""
        out = {}
        for r in ranks:
            gen = torch.Generator(device=self.device).manual_seed(seed * 1_000_003 + r)
            out[r] = self.ref.make_inputs(params, self.world, r, gen, self.device)
            out[r].update(self.parameters.get(r, {}))
        return out

    def all_inputs(self, params: dict[str, int], seed: int) -> list[dict[str, torch.Tensor]]:
        by_rank = self.inputs_for(params, seed, range(self.world))
        return [by_rank[r] for r in range(self.world)]

    def outputs(self) -> list[str]:
        return [b.name for b in self.spec.buffers.values() if b.role == "output"]

    def inputs(self) -> list[str]:
        return [b.name for b in self.spec.buffers.values() if b.role == "input"]

    def read_only(self) -> list[str]:
        """The buffers a run must leave as the judge wrote them: inputs and parameters."""
        return [b.name for b in self.spec.buffers.values() if b.role in READ_ROLES]

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
            if lay.role == "input":
                area = self.exchange[f"stage:{lay.name}"]
                area.copy_(mine[lay.name])
                self.harness.crypt(stream, area.data_ptr(), area.data_ptr(), lay.nbytes, self.key_dev.data_ptr(), n)
        self.sync()
        # Every rank has finished its previous run before any rank's buffers are restaged: a peer may still be
        # reading this rank's symmetric buffers at the end of its run (a one-shot all-reduce loads them last).
        self.barrier()
        self.send("stage")
        self.call("staged", "staging inputs")

    def deliver(self) -> None:
        """CPU: the run's inputs into the candidate's buffers, once the clock runs."""
        for name, value in self.pending.items():
            self.bufs[name].copy_(value)
        self.pending = {}

    # ---- shapes ---------------------------------------------------------------------------------
    def open_shape(self, shape_name: str, seed: int) -> dict[str, int]:
        shape = self.spec.shape(shape_name)
        params, env = dict(shape.params), shape.env(self.world)
        self.layouts = [Layout(b.name, b.role, b.dtype, b.dims(env), b.symmetric) for b in self.spec.buffers.values()]
        self.mark(f"{shape_name}: setup")
        msg: dict[str, Any] = dict(buffers=[lay.to_json() for lay in self.layouts], params=params)
        fds: list[int] = []
        if self.cuda:
            self.exchange = Exchange.create(self.layouts, self.device)
            msg["exchange"] = self.exchange.handle()
        else:
            self.bufs, fds = memfd_buffers(self.layouts)
        self.send("setup", fds=fds, where=f"{shape_name}: setup", **msg)
        for fd in fds:
            os.close(fd)
        self.call("ok", f"{shape_name}: setup")
        self.draw_parameters(params, seed, shape_name)
        return params

    def draw_parameters(self, params: dict[str, int], seed: int, shape_name: str) -> None:
        """The shape's parameters, every rank's, drawn once (by reference.make_parameters where the workload has
        it, else from make_inputs) and loaded into the candidate's buffers (untimed)."""
        self.parameters = self.parameters_for(params, seed)
        for n, value in self.parameters.get(self.rank, {}).items():
            if not self.cuda:
                self.bufs[n].copy_(value.reshape(self.bufs[n].shape))
                continue
            for offset, chunk in self.chunks(value):
                self.exchange[BOUNCE][: chunk.numel()].copy_(chunk)
                self.sync()
                self.send("parameter_chunk", name=n, offset=offset, nbytes=chunk.numel(), load=True,
                          where=f"{shape_name}: parameters")
                self.call("ok", f"{shape_name}: parameters")

    def parameters_for(self, params: dict[str, int], seed: int) -> dict[int, dict[str, torch.Tensor]]:
        """Every rank's parameters, from reference.make_parameters where the workload has it (then make_inputs
        need not draw the weights on every run), else from make_inputs."""
        names = [b.name for b in self.spec.buffers.values() if b.role == "parameter"]
        if not names:
            return {}
        make = self.ref.make_parameters
        out = {}
        for r in range(self.world):
            gen = torch.Generator(device=self.device).manual_seed(seed * 1_000_003 + r)
            values = (make or self.ref.make_inputs)(params, self.world, r, gen, self.device)
            missing = [n for n in names if n not in values]
            if missing:
                fn = "make_parameters" if make else "make_inputs"
                raise CandidateFailed(f"reference.{fn} returned no {missing[0]!r}", "workload")
            out[r] = {n: values[n].to(TORCH_DTYPES[self.spec.buffers[n].dtype]).contiguous() for n in names}
            del values
        return out

    @staticmethod
    def chunks(value: torch.Tensor):
        """(byte offset, bytes) of a parameter, a bounce area's worth at a time."""
        flat = value.view(-1).view(torch.uint8)
        for offset in range(0, flat.numel(), BOUNCE_BYTES):
            yield offset, flat[offset:offset + BOUNCE_BYTES]

    def parameters_changed(self, where: str) -> list[str]:
        """This rank's parameters as the candidate left them, against what was drawn."""
        changed = []
        for n, value in self.parameters.get(self.rank, {}).items():
            if not self.cuda:
                check = same(n, self.bufs[n], value.reshape(self.bufs[n].shape), "parameter changed by the runs")
                changed += [] if check.ok else [check.message]
                continue
            for offset, chunk in self.chunks(value):
                self.send("parameter_chunk", name=n, offset=offset, nbytes=chunk.numel(), load=False, where=where)
                self.call("ok", where)
                if not torch.equal(self.exchange[BOUNCE][: chunk.numel()], chunk):
                    changed.append(f"{n}: parameter changed by the runs (bytes from {offset})")
                    break
        return changed

    def close_shape(self, shape_name: str) -> None:
        self.mark(f"{shape_name}: teardown")
        self.send("teardown", where=f"{shape_name}: teardown")
        self.call("ok", f"{shape_name}: teardown")
        self.exchange = self.bufs = None

    # ---- runs -----------------------------------------------------------------------------------
    def snapshot(self, role: str) -> dict[str, torch.Tensor]:
        # the parameters are checked apart (parameters_changed): the exchange holds no copy of them
        names = self.outputs() if role == "output" else self.read_only() if not self.cuda else self.inputs()
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
            self.send("run", seq=self.seq, gate=None, where=where)
            self.call("queued", where)
            self.call("finished", where)
        else:
            self.deliver()
            self.send("run", where=where)
            self.call("done", where)
        return self.snapshot("output"), self.snapshot("input")

    def run_timed(self, where: str, keep: bool, null: bool = False, probe: bool = False):
        """(judge's ms, the host's event ms or, on the CPU, the judge's own time to deliver the inputs, gate timed
        out, output snapshot if kept)."""
        self.check_reach(where)
        self.barrier()
        if not self.cuda:
            t0 = time.perf_counter()
            self.deliver()
            delivered_ms = (time.perf_counter() - t0) * 1e3
            self.send("run", where=where)
            self.call("done", where)
            ms = (time.perf_counter() - t0) * 1e3
            self.check_reach(where)
            return ms, delivered_ms, False, self.snapshot("output") if keep else None
        self.seq += 1
        gated = self.gated
        if gated:
            self.gate_count += 1
        t_sent = time.perf_counter()
        if not gated:  # the clock runs from here: the host may read its key
            self.reveal_keys([self.rank])
        self.send("run", seq=self.seq, gate=self.gate_count if gated else None, null=null, probe=probe, where=where)
        self.call("queued", where)
        t0 = t_sent
        if gated:
            self.barrier()
            if self.rank == 0:
                t0 = time.perf_counter()
                self.reveal_keys(range(self.world))
                self.host.gate.write(self.gate_count)
        self.wait_done(self.seq, where)
        t_end = time.perf_counter()
        snap = self.snapshot("output") if keep else None  # at once: a done flag raised early finds no outputs
        ms = (t_end - (self.gate_opened_at(t0) if gated else t0)) * 1e3
        fin = self.call("finished", where)
        self.check_reach(where)
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
        t = torch.tensor([t0], dtype=torch.float64)
        dist.broadcast(t, src=0, group=self.gloo)
        return float(t.item())

    def wait_done(self, seq: int, where: str) -> None:
        spins = 0
        while self.host.done.read() < seq:
            spins += 1
            if spins % 20000 == 0 and self.proc.poll() is not None:
                raise self._host_gone(where)

    def flush_l2(self) -> None:
        if self.cuda and self.spec.timing.l2_flush:
            self.l2.flush()
            self.sync()

    # ---- stages ---------------------------------------------------------------------------------
    def agree(self, checks: list[Check], what: str) -> None:
        mine = [c.message for c in checks if not c.ok]
        failures = [f"rank {r}: {m}" for r, ms in enumerate(self.gather(mine)) for m in ms]
        if failures:
            raise StageFailed(f"{what}: " + "; ".join(failures[:6]))

    def check_outputs(self, outs: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[Check]:
        return [self.compare(n, outs[n], expected[n]) for n in self.outputs()]

    def compare(self, name: str, out: torch.Tensor, ref: torch.Tensor) -> Check:
        tol = self.spec.tolerance_for(name)
        return compare(name, out, ref, tol.rtol, tol.atol, tol.norm_rtol, tol.atol_scale)

    def correctness(self, stage: Stage, params: dict[str, int], seed: int) -> dict[str, Any]:
        tol = self.spec.tolerance
        errors: list[float] = []
        for trial in range(self.spec.timing.trials):
            where = f"{stage.level} {stage.shape} trial {trial}"
            self.mark(f"{where}: run")
            inputs = self.all_inputs(params, seed + trial)
            mine = inputs[self.rank]
            self.load(mine)
            outs, after = self.run_untimed(f"{where}: run")
            checks = self.check_outputs(outs, self.ref.reference(params, self.world, self.rank, inputs))
            self.agree(checks, f"{where} (seed {seed + trial})")
            errors += [c.norm_rel_err or 0.0 for c in checks]
            self.mark(f"{where}: determinism run")
            self.load(mine)
            again, after2 = self.run_untimed(f"{where}: determinism run")
            if tol.determinism == "bitwise":
                checks = [same(n, again[n], outs[n], "two runs on the same inputs differ") for n in self.outputs()]
            else:
                checks = [self.compare(n, again[n], outs[n]) for n in self.outputs()]
            for a in (after, after2):
                checks += [same(k, a[k], mine[k].to(a[k].dtype).reshape(a[k].shape), "input changed by the run")
                           for k in a]
            checks += [Check(False, m) for m in self.parameters_changed(f"{where}: parameters")]
            self.agree(checks, where)
        return {"level": stage.level, "shape": stage.shape, "ok": True, "trials": self.spec.timing.trials,
                "max_norm_rel_err": max(errors) if errors else 0.0}

    def timing(self, stage: Stage, params: dict[str, int], seed: int) -> dict[str, Any]:
        t = self.spec.timing
        warmup = max(1, self.job.warmup if self.job.warmup is not None else t.warmup)
        iters = self.job.iters if self.job.iters is not None else t.iters
        chosen = set(random.Random(seed).sample(range(iters), min(VERIFIED_RUNS, iters)))  # the seed is secret
        judge_ms: list[float] = []
        event_ms: list[float] = []
        null_ms: list[float] = []
        null_event_ms: list[float] = []
        delivered_ms: list[float] = []  # CPU: the judge's own time to write each run's inputs
        kept: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        note = ""
        for i in range(warmup + iters):
            where = f"L4 {stage.shape}: " + (f"warm-up {i}" if i < warmup else f"timed run {i - warmup}")
            self.mark(where)
            self.load(self.inputs_for(params, seed + i, [self.rank])[self.rank])
            self.flush_l2()
            keep = i - warmup in chosen
            ms, ev, gate_timed_out, snap = self.run_timed(where, keep, probe=(i == 0 and self.gated))
            if i == 0 and self.cuda and self.any_rank(gate_timed_out):
                self.gated = False
                note = "cuco_run blocks the host: timed without the start gate (launch overhead included)"
            if i == 0 and self.cuda:
                null_ms, null_event_ms = self.null_runs(stage)
            if i < warmup:
                continue
            judge_ms.append(ms)
            (event_ms if self.cuda else delivered_ms).append(ev)
            if keep:
                kept[i - warmup] = (seed + i, snap)
        out: dict[str, Any] = {"level": "L4", "shape": stage.shape, "ok": True, "gated": self.gated, "note": note,
                               "verified_runs": sorted(kept), "judge_ms": judge_ms}
        if self.cuda:
            check = cross_check(event_ms, judge_ms, null_ms)
            out.update(per_rank_times=event_ms, clock=check.to_json())
        else:
            out.update(per_rank_times=judge_ms, clock=None)
        # What delivering the inputs inside the timed region costs by itself, for the record only (on GPUs the
        # candidate's process reports it): a run with nothing else (GPU), the judge's own copy (CPU).
        inputs = null_event_ms if self.cuda else delivered_ms
        out["inputs_per_rank_ms"] = self.gather(statistics.median(inputs) if inputs else None)
        out["final_output_errors"] = self.verify_kept(stage, params, kept)
        changed = self.parameters_changed(f"L4 {stage.shape}: parameters after the timed runs")
        out["final_output_errors"] += self.gather_failures([f"after the timed runs: {m}" for m in changed])
        clocks = self.gather(out["clock"])
        out["clock_errors"] = [f"rank {r}: {c['message']}" for r, c in enumerate(clocks) if c and not c["ok"]]
        out["per_rank_ms"] = self.gather(out.pop("per_rank_times"))
        out["judge_per_rank_ms"] = self.gather(out.pop("judge_ms"))
        return out

    def null_runs(self, stage: Stage) -> tuple[list[float], list[float]]:
        """Runs that do nothing but receive their inputs: the judge's clock around them (what the gate, the
        inputs, the snapshot and the done flag cost by themselves) and their events (the inputs alone)."""
        judge, events = [], []
        for n in range(NULL_RUNS):
            where = f"L4 {stage.shape}: runner overhead {n}"
            self.mark(where)
            self.flush_l2()
            ms, ev, _, _ = self.run_timed(where, keep=False, null=True)
            judge.append(ms)
            events.append(ev)
        return judge, events

    def verify_kept(self, stage: Stage, params: dict[str, int], kept) -> list[str]:
        """The snapshotted timed runs against the reference of their own inputs; failures of every rank."""
        mine = []
        for j, (seed, snap) in sorted(kept.items()):
            self.mark(f"L4 {stage.shape}: verifying timed run {j}")
            expected = self.ref.reference(params, self.world, self.rank, self.all_inputs(params, seed))
            mine += [f"timed run {j}: {c.message}" for c in self.check_outputs(snap, expected) if not c.ok]
        return self.gather_failures(mine)

    def gather_failures(self, mine: list[str]) -> list[str]:
        return [f"rank {r}: {m}" for r, ms in enumerate(self.gather(mine)) for m in ms]

    def run_stages(self) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        by_shape: dict[str, list[Stage]] = {}
        for st in self.job.stages:
            by_shape.setdefault(st.shape, []).append(st)
        self.host_ready()
        for n, (shape_name, stages) in enumerate(by_shape.items()):
            seed = self.seed + 7919 * (1 + n)
            params = self.open_shape(shape_name, seed + 53)  # below the timed runs' seeds, above the trials'
            for st in stages:
                if st.level in ("L2", "L3"):
                    results.append(self.correctness(st, params, seed))
                else:
                    results.append(self.timing(st, params, seed + 101))
                self.write_result(results, done=False)
            self.close_shape(shape_name)
        self.stop_host()
        return results

    # ---- bounds mode: the workload's own references, no candidate ---------------------------------
    def bounds(self) -> list[dict[str, Any]]:
        results = []
        for st in self.job.stages:
            shape = self.spec.shape(st.shape)
            params, env = dict(shape.params), shape.env(self.world)
            bufs = {b.name: torch.empty(b.dims(env), dtype=TORCH_DTYPES[b.dtype], device=self.device)
                    for b in self.spec.buffers.values()}
            self.parameters = self.parameters_for(params, self.seed)
            inputs = self.all_inputs(params, self.seed)
            for name in self.read_only():
                bufs[name].copy_(inputs[self.rank][name])
            res = {"level": "bounds", "shape": st.shape, "ok": True}
            res.update(self.reference_timings(params, inputs, bufs))
            results.append(res)
            self.write_result(results, done=False)
        return results

    def reference_timings(self, params, inputs, bufs) -> dict[str, Any]:
        """The bound's measured half: the workload's compute alone (best library), and its collective alone."""
        t = self.spec.timing
        out: dict[str, Any] = {}
        stream = torch.cuda.current_stream(self.device) if self.cuda else None

        staged = {n: inputs[self.rank][n].clone() for n in self.inputs()}

        def delivered(fn):
            """The compute as a candidate is timed: its inputs written into its buffers first."""
            def run() -> None:
                for name, value in staged.items():
                    bufs[name].copy_(value)
                fn()
            return run

        def before() -> None:
            for b in self.spec.buffers.values():
                if b.role in ("output", "scratch"):
                    poison(bufs[b.name])
            if self.cuda and t.l2_flush:
                self.l2.flush()

        for key in ("compute_alone", "comm_alone"):
            factory = getattr(self.ref, key)
            if factory is None:
                continue
            group = (dist.new_group(backend="nccl", device_id=self.device) if self.cuda else self.gloo) \
                if key == "comm_alone" else None  # type: ignore[call-arg]
            self.mark(f"bounds: timing {key}")
            fn = factory(RankView(params, self.world, self.rank, inputs, bufs, group))
            if key == "compute_alone":
                fn = delivered(fn)
            if self.cuda and key == "compute_alone":
                fn, out["compute_alone_graphed"] = graphed(fn)
            iters = max(10, min(t.iters, 30))
            times = time_references_cuda(fn, before, self.barrier, stream, t.warmup, iters) if self.cuda \
                else time_references_cpu(fn, before, self.barrier, t.warmup, iters)
            out[f"{key}_per_rank_ms"] = self.gather(times)
        return out

    # ---- result ---------------------------------------------------------------------------------
    def write_result(self, stages: list[dict[str, Any]], done: bool, **extra: Any) -> None:
        """The rank's result file. The seed goes in only once the candidate's process is gone: the run folder
        is readable to it."""
        data = {"rank": self.rank, "stages": stages, "error": None, "done": done, "sandbox": self.sandbox, **extra}
        if done:
            assert self.proc is None, "the seed is written only after the host has been stopped"
            data["seed"] = getattr(self, "seed", None)
        atomic_write_json(self.out / f"rank{self.rank}.json", data)


def run_judge(job: Job, rank: int, host: HostProcess | None) -> int:
    judge: Judge | None = None
    try:
        judge = Judge(job, rank, host)
        judge.init()
        stages = judge.bounds() if job.mode == "bounds" else judge.run_stages()
        judge.write_result(stages, done=True)
        dist.destroy_process_group()
        return 0
    except StageFailed as exc:
        judge.stop_host()
        judge.write_result(_partial(judge), done=True, error=str(exc), kind="verification")
        return 0
    except Exception as exc:  # the judge reports every failure as data; the candidate's come as CandidateFailed
        kind = exc.kind if isinstance(exc, CandidateFailed) else _raised_in_reference(exc, job) or "runner"
        error = str(exc) if isinstance(exc, CandidateFailed) else f"{type(exc).__name__}: {exc}"
        if kind == "workload" and not isinstance(exc, CandidateFailed):
            error = f"the workload's reference.py raised {error}"
        data = {"error": error, "kind": kind, "traceback": traceback.format_exc(limit=8)}
        if judge is not None:
            judge.stop_host()
            judge.write_result(_partial(judge), done=True, **data)
        else:
            kill_descendants()
            atomic_write_json(Path(job.out_dir) / f"rank{rank}.json",
                              {"rank": rank, "stages": [], "done": True, **data})
        sys.stderr.write(data["traceback"])
        return 3


def _signed(key: int) -> int:
    """A 64-bit key as the int64 torch stores."""
    return key - (1 << 64) if key >= 1 << 63 else key


def _raised_in_reference(exc: BaseException, job: Job) -> str | None:
    """"workload" when the exception came out of the workload's reference.py (the user's half of the contract),
    so that its author is told, and neither the candidate nor cuco is blamed."""
    reference = str(Path(job.workload_root, "reference.py").resolve())
    frames = traceback.extract_tb(exc.__traceback__)
    return "workload" if any(str(Path(f.filename).resolve()) == reference for f in frames) else None


def _partial(judge: Judge) -> list[dict[str, Any]]:
    path = judge.out / f"rank{judge.rank}.json"
    return json.loads(path.read_text())["stages"] if path.is_file() else []

