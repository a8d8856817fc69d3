"""One evolutionary search, as a list of named steps: open the store, seed, then propose, evaluate and
record until the requested number of evaluations has finished. Restarted on the same run directory it
resumes: finished evaluations are kept and counted, one cut off by a kill is evaluated again."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.designspace import DesignPoint, Directive
from cuco.errors import CucoError
from cuco.evolve.config import RunConfig
from cuco.evolve.database import Candidate, Database
from cuco.evolve.embedding import make_embedder
from cuco.evolve.novelty import code_hash
from cuco.evolve.proposers import PROPOSERS, Proposal, ProposalContext, ProposalFailed, SearchStopped, point_key
from cuco.evolve.proposers import directive as _directive  # noqa: F401  (registers the proposer)
from cuco.evolve.proposers import llm as _llm  # noqa: F401  (registers the proposer)
from cuco.evolve.rundir import RunDir
from cuco.evolve.selection import hill_climbing, power_law, weighted
from cuco.evolve.slots import Slot
from cuco.evolve.strategy import directive_for, materialize
from cuco.language import file_name, is_cuda, language_of
from cuco.paths import atomic_write_text
from cuco.runner.results.comparison import Comparison, compare, pending
from cuco.runner.results.record import EvalRecord
from cuco.workload.spec import StrategySpec, WorkloadSpec

# The seed is host-driven: NCCL collectives from the host, then compute.
SEED_POINT = DesignPoint("nccl_host", "deferred", "global", "cta", 1)
START_LABEL = "start: "  # the label of a search.start program: this, then its file's name
NOVELTY_RETRIES = 20
# Evaluations in a row that cuco itself failed (not the candidates) before a search that has a passing program
# stops; one is enough while nothing has passed. A lost port is retried by the launcher already, so a runner
# failure that reaches the search is rarely transient.
RUNNER_FAULTS_TO_STOP = 3

# (workload, program, slot, work dir, the workload's name for the program: its NCCL settings) -> its record
Evaluator = Callable[[WorkloadSpec, Path, Slot, Path, str | None], EvalRecord]


def strongest_baseline(db: Database) -> tuple[str, float] | None:
    """The fastest baseline measured in this run: the seed (candidate #1 when the search started from it) and the
    workload's other baselines (measure_baselines), as (name, median ms); None before any was timed."""
    times = {name: b["median_ms"] for name, b in (db.get_meta("baselines") or {}).items() if b.get("median_ms")}
    seed = db.seed()
    if seed is not None and seed.label == SEED_POINT.label() and seed.median_ms and "seed" not in times:
        times["seed"] = seed.median_ms
    return min(times.items(), key=lambda kv: kv[1]) if times else None


def comparisons(db: Database) -> tuple[list[Comparison], str | None]:
    """The best against each rival, from the rounds of the search's end (Evolution.time_rounds), and why they could
    not all be made (a program that failed in a round), if so. Nothing before every round has run."""
    state = db.get_meta("rounds")
    if not state or any(len(ms) < state["rounds"] for ms in state["ms"].values()):
        return [], state["error"] if state else None
    names, ms = state["names"], state["ms"]
    return [compare(names["best"], ms["best"], names[k], ms[k]) for k in names if k != "best"], state["error"]


def score_of(record: EvalRecord, shape: str, run_bound: float | None) -> tuple[float | None, float | None,
                                                                            float | None]:
    """(score, median ms, bound ms). The score is the run's bound over this time: one fixed bound for every
    candidate (the first one measured), so that ranking follows time alone and not each evaluation's
    re-measured bound; it reads as efficiency. Higher is better."""
    median, bound = record.median_ms(shape), record.bound_ms(shape)
    if not record.ok or not median:
        return None, median, bound
    ref = run_bound or bound
    return (ref / median if ref else 1.0 / median), median, bound


@dataclass
class Event:
    kind: str  # "start" | "done" | "reject" | "baseline" | "stopped"
    candidate: Candidate | None = None
    text: str = ""


def _label(d: Directive) -> str | None:
    """A candidate's design point as the search shows it: the point, and the strategy kernel compiled at it (the name
    of a derived strategy carries its CTA count)."""
    if d.point is None:
        return None
    return d.point.label() + (f" in {d.strategy}" if d.strategy else "")


@dataclass
class Evolution:
    spec: WorkloadSpec
    cfg: RunConfig
    run_dir: RunDir | Path  # a Path is taken as RunDir(path)
    slots: list[Slot]
    evaluator: Evaluator
    device: str
    on_event: Callable[[Event, Evolution], None] = lambda e, ev: None
    machine: dict[str, Any] = field(default_factory=dict)
    # Design points evaluated first, beside the seed (an LLM search on the knobs of a rewrite starts from them)
    starts: list[tuple[StrategySpec, DesignPoint]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.run_dir = RunDir.of(self.run_dir)
        self.run_dir.root.mkdir(parents=True, exist_ok=True)
        self.db = self.run_dir.open()
        self.shape = self.cfg.search.shape or self.spec.shapes[0].name
        self.spec.shape(self.shape)
        try:
            factory = PROPOSERS[self.cfg.search.proposer]
        except KeyError:
            raise CucoError("search.proposer", f"unknown proposer {self.cfg.search.proposer!r} "
                                               f"(known: {', '.join(PROPOSERS)})") from None
        try:
            self.proposer = factory(self.spec, self.machine, cfg=self.cfg, db=self.db, shape=self.shape,
                                    run_dir=self.run_dir.root)
        except ValueError as exc:
            raise CucoError(f"search.proposer {self.cfg.search.proposer}", str(exc)) from None
        self.exhausted = False
        self.stop_reason = ""
        self.stop_fault: str | None = None  # why a stop is a failure: "proposer", "runner" or "workload"
        self.runner_faults = 0  # consecutive evaluations that failed through no fault of the candidate
        self.embedder = None
        if getattr(self.proposer, "near_duplicates", False):  # design points of strategies are distinct already
            s = self.cfg.search
            try:
                self.embedder = make_embedder(s.novelty, s.embedding_model, self.cfg.llm.base_url,
                                              self.cfg.llm.api_key_env)
            except ValueError as exc:
                raise CucoError("search.novelty", str(exc)) from None
        self.started_at = time.monotonic()

    # ---- steps ----------------------------------------------------------------------------------
    def open(self) -> int:
        """Check the run directory belongs to this workload and shape; put cut-off evaluations back."""
        known = self.db.get_meta("run")
        here = {"workload": self.spec.name, "shape": self.shape, "world": self.spec.world_size, "device": self.device}
        if known and known != here:
            raise CucoError(str(self.run_dir), f"belongs to another run ({known}); this one is {here}")
        self.db.set_meta("run", here)
        self.db.set_meta("config", json.loads(self.cfg.to_json()))
        self.run_dir.config.write_text(self.cfg.to_json())
        return self.db.requeue_unfinished()

    def seed(self) -> None:
        if self.db.count() > 0:
            return
        start = self.cfg.search.start
        path = Path(start) if start else self.spec.seed_path
        if path is None:
            raise CucoError(str(self.spec.source), "[candidates] has no 'seed': evolution needs a starting program")
        if not path.is_file():
            raise CucoError("search.start", f"{path} does not exist")
        code = path.read_text()
        lang = language_of(path, "search.start" if start else str(self.spec.source))
        # The seed is host-driven; another starting program states no design point of its own, and is labelled
        # by its name (the summary and the report name the best by its label).
        d = Directive(None, f"started from {path}") if start else Directive(SEED_POINT, "the host-driven seed")
        self.db.add(code=code, code_hash=code_hash(code, lang), language=lang, parent_id=None, island=0,
                    generation=0, proposer="seed", phase="seed", directive=d.to_json(),
                    label=f"{START_LABEL}{path.name}" if start else SEED_POINT.label())
        for strategy, point in self.starts:
            code, lang = materialize(strategy, point), language_of(strategy.path)
            d = directive_for(strategy, point, "a starting point: a design point of the rules' rewrite")
            self.db.add(code=code, code_hash=code_hash(code, lang), language=lang, parent_id=None, island=0,
                        generation=0, proposer="knobs", phase="seed", directive=d.to_json(), label=_label(d))

    def phase(self, k: int) -> str:
        return "explore" if k < self.cfg.search.explore_fraction * self.cfg.search.generations else "exploit"

    def select_parent(self, island: int, rng: random.Random) -> Candidate:
        ranked = self.db.scored(island) or self.db.scored()
        if not ranked:
            return self.db.all()[0]  # nothing correct yet: start from the seed
        s = self.cfg.search
        if s.selection == "power_law":
            return power_law(ranked, rng, s.power_law_alpha)
        if s.selection == "weighted":
            return weighted(ranked, rng, [c.score for c in ranked], s.weighted_temperature)
        return hill_climbing(ranked, rng)

    async def propose(self) -> Candidate | None:
        """The next proposal, stored as pending (novel code only), or None when the search must stop."""
        k = self.db.count()
        rng = random.Random(f"{self.cfg.search.seed}:{k}")
        island = k % self.cfg.search.islands
        parent = self.select_parent(island, rng)
        inspirations = [c for c in self.db.archive() if c.id != parent.id][: self.cfg.search.inspirations]
        tried = {point_key(d.strategy, d.point.label())
                 for d in (Directive.from_json(c.directive) for c in self.db.all() if c.directive) if d.point}
        for _ in range(NOVELTY_RETRIES):
            ctx = ProposalContext(parent, inspirations, self.phase(k), rng, tried, self.db.best())
            try:
                prop: Proposal = await self.proposer.propose(ctx)
            except ProposalFailed as exc:
                self.on_event(Event("reject", None, str(exc)), self)
                continue
            except SearchStopped as exc:
                self.exhausted, self.stop_reason = True, str(exc)
                self.stop_fault = "proposer" if exc.failed else None
                return None
            h = code_hash(prop.code, prop.language)
            if self.db.has_code(h):
                self.on_event(Event("reject", None, f"duplicate of an earlier candidate: {prop.note}"), self)
                tried.add(point_key(prop.directive.strategy, prop.directive.point.label()) if prop.directive.point
                          else h)
                continue
            label = _label(prop.directive)
            vec = await self.embedder.embed(prop.code) if self.embedder else None
            if vec is not None:
                # Near duplicate: almost the same code aiming at the same design point. A small edit that
                # states another point (a chunk count, say) is a new candidate, however similar its text.
                sim, other = self.db.nearest(vec, self.embedder.name)
                if sim >= self.cfg.search.novelty_threshold and self.db.get(other).label == label:
                    self.on_event(Event("reject", None, f"near duplicate of #{other} (similarity {sim:.3f}, same "
                                                        f"design point): {prop.note}"), self)
                    continue
            cid = self.db.add(code=prop.code, code_hash=h, language=prop.language, parent_id=parent.id,
                              island=island, generation=parent.generation + 1, proposer=self.proposer.name,
                              phase=self.phase(k), directive=prop.directive.to_json(), label=label)
            if prop.call_ids:
                self.db.link_calls(cid, list(prop.call_ids))
            if vec is not None:
                self.db.add_embedding(cid, self.embedder.name, vec)
            return self.db.get(cid)
        self.exhausted, self.stop_reason = True, f"{NOVELTY_RETRIES} proposals in a row were rejected"
        return None

    async def next_candidate(self) -> Candidate | None:
        if self.stop_fault in ("runner", "workload"):  # pending ones stay pending for a resumed run
            return None
        pending = self.db.pending()
        if pending:
            return pending[0]
        if self.db.count() >= self.cfg.search.generations or self.exhausted:
            return None
        return await self.propose()

    def evaluate(self, cand: Candidate, slot: Slot) -> EvalRecord:
        return self.evaluate_program(cand.code, cand.language, slot, self.run_dir.evaluation(cand.id), None)

    async def measure_baselines(self, slot: Slot) -> None:
        """The workload's baselines at the search's shape, each once per run (kept in the store, so a resumed run
        times only those it lacks): the best is reported against the strongest program measured in the same run,
        not against a number from another day. The seed, when the search started from it, is candidate #1."""
        known = self.db.get_meta("baselines") or {}
        for name in self.spec.baselines:
            path = self.spec.candidates.get(name)
            if name in known or path is None or (path == self.spec.seed_path and not self.cfg.search.start):
                continue
            if self.device == "cpu" and is_cuda(path):
                continue
            work = self.run_dir.baseline(name) / f"attempt-{time.time_ns()}"
            record = await asyncio.to_thread(self.evaluator, self.spec, path, slot, work, name)
            median = record.median_ms(self.shape) if record.ok else None
            known[name] = {"median_ms": median, "error": None if median else record.error}
            self.db.set_meta("baselines", known)
            self.on_event(Event("baseline", None, f"{name} {median:.4f} ms" if median else
                                f"{name} failed: {record.error}"), self)

    def rivals(self, best: Candidate) -> dict[str, tuple[str, Path | str, str, str | None]]:
        """What the best is timed against in the rounds: the program the search started from and the strongest
        other baseline measured in this run, as key -> (name a person reads, file or code, its language, the
        workload's name for it)."""
        out: dict[str, tuple[str, Path | str, str, str | None]] = {}
        start = self.db.seed()
        if start is not None and start.ok and start.id != best.id:
            name = "the seed" if start.label == SEED_POINT.label() else f"the start program ({start.label})"
            out["start"] = (name, start.code, start.language, None)
        timed = {n: b["median_ms"] for n, b in (self.db.get_meta("baselines") or {}).items() if b.get("median_ms")}
        if timed:
            name = min(timed, key=timed.__getitem__)
            out[f"baseline:{name}"] = (name, self.spec.candidates[name], "", name)
        return out

    async def time_rounds(self, slot: Slot) -> None:
        """The best against its rivals in alternating rounds (cuco.runner.results.comparison): the search ranked every
        candidate by one evaluation, and the best is the fastest of many noisy draws. Each round's times are stored
        as they come, so a resumed run goes on from the last (the one that failed included); a best that changed
        starts over."""
        rounds, best = self.cfg.search.rounds, self.db.best()
        if not rounds or best is None or not (rivals := self.rivals(best)):
            return
        names = {"best": f"the best (#{best.id})", **{k: v[0] for k, v in rivals.items()}}
        state = self.db.get_meta("rounds") or {}
        if (state.get("best"), state.get("rounds"), state.get("names")) != (best.id, rounds, names):
            state = {"best": best.id, "rounds": rounds, "names": names, "ms": {k: [] for k in names}, "error": None}
        state["error"] = None  # a resumed run tries again what failed before (a lost port, a flaky program)
        programs = {"best": (best.code, best.language, None), **{k: v[1:] for k, v in rivals.items()}}
        for i, key in pending(list(names), rounds, state["ms"]):
            program, language, workload_name = programs[key]
            record = await asyncio.to_thread(self.evaluate_program, program, language, slot,
                                             self.run_dir.rounds(key), workload_name)
            median = record.median_ms(self.shape) if record.ok else None
            if median is None:
                state["error"] = f"round {i + 1}: {names[key]} failed: {record.error}"
            else:
                state["ms"][key].append(median)
            self.db.set_meta("rounds", state)
            self.on_event(Event("round", None, f"{i + 1}/{rounds}: {names[key]} " +
                                (f"{median:.4f} ms" if median else "failed")), self)
            if median is None:
                break

    def evaluate_program(self, program: Path | str, language: str, slot: Slot, folder: Path,
                         workload_name: str | None) -> EvalRecord:
        """One evaluation of a file, or of code written into FOLDER first; its attempts go in FOLDER."""
        if isinstance(program, str):
            path = folder / file_name("candidate", language)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(program)
            except OSError as exc:
                return EvalRecord(workload=self.spec.name, candidate=str(path), candidate_name=path.stem,
                                  language=language, world=self.spec.world_size, device=self.device, failed_level="L0",
                                  fault="runner", error=f"cuco cannot write the candidate into {folder}: "
                                                        f"{exc.strerror or exc}")
            program = path
        return self.evaluator(self.spec, program, slot, folder / f"attempt-{time.time_ns()}", workload_name)

    def record(self, cand: Candidate, record: EvalRecord, seconds: float) -> None:
        run_bound = self.db.get_meta("bound_ms")
        score, median, bound = score_of(record, self.shape, run_bound)
        if run_bound is None and bound:
            self.db.set_meta("bound_ms", bound)
        self.db.finish(cand.id, record, score, median, bound, seconds)
        done = self.db.count("done")
        if done % max(1, self.cfg.search.migration_interval) == 0 and self.cfg.search.islands > 1:
            for i in range(self.cfg.search.islands):
                best = self.db.best(i)
                if best:
                    self.db.migrate_into(best.id, (i + 1) % self.cfg.search.islands)
        best = self.db.best()
        if best and best.id == cand.id:
            self.write_best(best, record)
        self.watch_faults(cand, record, best is not None)

    def watch_faults(self, cand: Candidate, record: EvalRecord, passed_any: bool) -> None:
        """Stop when cuco itself, or the workload, fails evaluations instead of the candidates: every later one
        would fail the same way, and the budget would go to nothing."""
        if record.fault not in ("runner", "workload"):
            self.runner_faults = 0
            return
        self.runner_faults += 1
        if self.runner_faults >= (RUNNER_FAULTS_TO_STOP if passed_any else 1):
            self.exhausted, self.stop_fault = True, record.fault
            self.stop_reason = f"evaluation #{cand.id}: {record.error}"

    def write_best(self, best: Candidate, record: EvalRecord) -> None:
        d = self.run_dir.best
        d.mkdir(exist_ok=True)
        program = file_name("candidate", best.language)
        for old in d.glob("candidate.*"):
            if old.name != program:
                old.unlink()
        for name, text in ((program, best.code), ("record.json", json.dumps(record.to_dict(), indent=1)),
                           ("candidate.json", json.dumps({"id": best.id, "label": best.label, "score": best.score,
                                                          "median_ms": best.median_ms, "bound_ms": best.bound_ms,
                                                          "directive": json.loads(best.directive or "null")}))):
            atomic_write_text(d / name, text)

    # ---- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        self.open()
        self.seed()
        if self.embedder:  # the seed's, and any a resumed run lacks
            for c in self.db.missing_embeddings(self.embedder.name):
                self.db.add_embedding(c.id, self.embedder.name, await self.embedder.embed(c.code))
        lock = asyncio.Lock()

        async def slot_worker(slot: Slot) -> None:
            while True:
                async with lock:
                    cand = await self.next_candidate()
                    if cand is None:
                        return
                    self.db.start(cand.id)
                    self.on_event(Event("start", cand), self)
                t0 = time.monotonic()
                record = await asyncio.to_thread(self.evaluate, cand, slot)
                async with lock:
                    self.record(cand, record, time.monotonic() - t0)
                    self.on_event(Event("done", self.db.get(cand.id)), self)

        await asyncio.gather(*(slot_worker(s) for s in self.slots))
        if not self.stop_fault:  # a search cuco or the workload stopped would only fail them too
            await self.measure_baselines(self.slots[0])
            await self.time_rounds(self.slots[0])
        if self.exhausted:
            self.on_event(Event("stopped", None, self.stop_reason), self)
