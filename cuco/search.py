"""The front door of a search, for the command line and for scripts alike: the program it starts from, the knobs a
rules' rewrite offers where the workload ships no strategies, the slots that evaluate (this machine's GPUs or CPU
process groups, or a Ray cluster), the run directory; then the search, and what it ended with.

    search = prepare_search(load_workload(resolve_workload("gemm_allgather")), load_config(None))
    result = run_search(search)   # result.best, result.comparisons, result.exit_code; summary.json written

`cuco evolve` parses its flags into the configuration and prints around these two calls; nothing here prints."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cuco.errors import CucoError, ExitCode, NeedsGPU
from cuco.evolve.config import RunConfig
from cuco.evolve.database import Candidate, Database
from cuco.evolve.run import Event, Evolution, comparisons
from cuco.evolve.rundir import RunDir
from cuco.language import is_cuda, language_of
from cuco.machine import gpus_in_words, load_machine, resolve_device
from cuco.paths import absolute, atomic_write_json
from cuco.runner.results.comparison import Comparison
from cuco.workload.spec import StrategySpec, WorkloadSpec

Note = Callable[[str], None]  # a line for the person who started the search (how its design space was derived)


@dataclass
class Search:
    """A search ready to run: its workload (with derived strategies, where any), configuration, run directory and
    the evaluation loop over its slots."""

    spec: WorkloadSpec
    cfg: RunConfig
    run_dir: RunDir
    evolution: Evolution
    where: str  # the slots, in words: "2 slot(s) on cuda", "... on a Ray cluster (cuda)"

    @property
    def shape(self) -> str:
        return self.evolution.shape

    def close(self) -> None:
        self.evolution.db.close()

    def headline(self) -> str:
        return (f"{self.spec.name}, shape {self.shape}, {self.cfg.search.generations} evaluations, "
                f"{len(self.evolution.slots)} slot(s) {self.where}, proposer {self.cfg.search.proposer}; run directory "
                f"{self.run_dir}")


@dataclass
class SearchResult:
    """What a search ended with: read from its store, so a finished run read again gives the same."""

    run_dir: RunDir
    evaluations: int
    failures_by_level: dict[str, int]
    llm: dict[str, Any]
    stop_reason: str
    stop_fault: str | None  # "proposer", "runner" or "workload" where the search stopped on a failure
    start: Candidate | None  # the program it started from (the seed, or search.start)
    start_failure: str | None  # one line where that program failed
    best: Candidate | None
    comparisons: list[Comparison]  # the best against each rival, from the alternating rounds at the end
    rounds_error: str | None
    exit_code: ExitCode
    error: str | None  # one line saying why the exit code is not 0

    def summary(self) -> dict[str, Any]:
        """summary.json."""
        first, best = self.start, self.best
        return {
            "evaluations": self.evaluations, "failures_by_level": self.failures_by_level, "llm": self.llm,
            "stop_reason": self.stop_reason, "exit_code": int(self.exit_code),
            "start": {"id": first.id, "label": first.label, "ok": first.ok, "failed_level": first.failed_level,
                      "failure": self.start_failure} if first else None,
            "best": {"id": best.id, "label": best.label, "median_ms": best.median_ms, "bound_ms": best.bound_ms,
                     "efficiency": best.score} if best else None,
            "comparisons": [c.to_dict() for c in self.comparisons], "rounds_error": self.rounds_error,
        }


def _start_program(cfg: RunConfig, spec: WorkloadSpec) -> Path | None:
    """The program the search starts from: search.start, checked before anything is written into the run
    directory, else the workload's seed."""
    if not cfg.search.start:
        return spec.seed_path
    start = Path(cfg.search.start)
    if not start.is_file():
        raise CucoError("search.start", f"{start} does not exist")
    language_of(start, "search.start")
    return start


def _derived_knobs(spec: WorkloadSpec, cfg: RunConfig, start: Path | None, note: Note):
    """The knobs of the rules' rewrite that the directive proposer searches and an LLM starts from: on a workload
    without [strategies], of its seed; with search.space = knobs, of the start program, whatever the workload ships.
    None where the workload's strategies are searched (or, for an LLM, where the rules cannot rewrite the seed: it
    then starts from the seed alone)."""
    asked = cfg.search.space == "knobs"
    if spec.strategies and not asked:
        return None
    from cuco.fastpath.analyze import AnalysisError, analyze

    directive = cfg.search.proposer == "directive"
    program = start if asked else spec.seed_path  # a search.start was checked by _start_program
    try:
        if program is None or not is_cuda(program):
            raise CucoError(str(program or spec.source), "is not a CUDA program to derive knobs from")
        knobs = knobs_of(spec, analyze(program))
    except (AnalysisError, CucoError) as exc:
        if asked:
            raise CucoError("search.space", f"knobs: the rules' rewrite of the start program gives none: {exc}") \
                from None
        if directive:
            raise CucoError(str(spec.source), f"ships no strategy kernels ([strategies] in workload.toml), and its "
                                              f"seed gives the directive proposer nothing to search: {exc}") from None
        note(f"no [strategies] in {spec.source.name} and no knobs from its seed ({exc}): the LLM starts from the "
             "seed alone")
        return None
    how = (f"the directive proposer searches the {knobs.points()} design points" if directive else
           "the LLM starts from the seed and from every issuer and placement of the design points")
    why = "search.space = knobs" if asked else f"no [strategies] in {spec.source.name}"
    note(f"{why}: {how} derived from the rules' rewrite of {program.name} (cuco transform {spec.root} --source "
         f"{program} --explain lists them)")
    return knobs


def knobs_of(spec: WorkloadSpec, analysis):
    """The knobs the rules' rewrite of the analysed program offers a search (cuco/fastpath/knobs.py)."""
    from cuco.fastpath.knobs import derive
    from cuco.fastpath.rewrite import RewriteError

    try:
        return derive(analysis, spec)
    except RewriteError as exc:
        raise CucoError(analysis.path, f"the rules cannot rewrite it, so it has no knobs: {exc}") from None


def _with_knobs(spec: WorkloadSpec, knobs, cfg: RunConfig,
               directory: Path) -> tuple[WorkloadSpec, list[tuple[StrategySpec, Any]]]:
    """The workload with the derived knobs as its strategies (written into DIRECTORY), and the design points an LLM
    search starts from beside the seed (none for the directive proposer, which searches them all)."""
    if knobs is None:
        return spec, []
    spec = replace(spec, strategies=knobs.strategies(directory, spec))
    if cfg.search.proposer == "directive":
        return spec, []
    first = knobs.start_strategy(spec.strategies)
    return spec, [(first, p) for p in first.points()]


def _slots_for(cfg: RunConfig, spec: WorkloadSpec, shape: str, note: Note):
    """Where the search's evaluations run: (device, slots, evaluator, how to say it). Local: this machine's
    disjoint GPU groups or CPU process groups; ray: tasks on the cluster (cuco/cluster)."""
    if cfg.search.backend == "ray":
        from cuco.cluster.ray_slots import RayBackend

        cluster = RayBackend.connect(cfg.ray.address, cfg.eval.device, spec.world_size, cfg.ray.retries)
        return cluster.device, cluster.slots(cfg.search.slots), cluster.evaluator(cfg, shape), \
            f"on a Ray cluster ({cluster.device})"
    from cuco.evolve.slots import local_evaluator, make_slots
    from cuco.machine import ensure_bound_facts

    dev = resolve_device(cfg.eval.device, spec.world_size, "eval.device")
    if dev == "cuda":
        ensure_bound_facts(note)  # the bound needs the peer links' rate: measured once if `cuco doctor` has not
    try:
        slots = make_slots(dev, spec.world_size, cfg.search.slots)
    except ValueError as exc:
        raise CucoError("search.slots", str(exc)) from None
    return dev, slots, local_evaluator(dev, cfg.eval, shape), f"on {dev}"


def _default_run_dir(spec: WorkloadSpec, shape: str) -> Path:
    return absolute(Path("cuco-runs") / f"{spec.name}-{shape}")


def prepare_search(spec: WorkloadSpec, cfg: RunConfig, run_dir: Path | None = None,
                   note: Note = lambda line: None) -> Search:
    """Everything a search needs, checked before its run directory is written: a bad start program, shape, slot
    count or device is refused with nothing created. An existing run directory of the same search is resumed."""
    shape = cfg.search.shape or spec.shapes[0].name
    spec.check_bounds(spec.shape(shape))
    start = _start_program(cfg, spec)
    knobs = _derived_knobs(spec, cfg, start, note)
    dev, slots, evaluator, where = _slots_for(cfg, spec, shape, note)
    if dev == "cpu" and start is not None and is_cuda(start):
        raise NeedsGPU(spec.name, f"its programs are CUDA and this machine has no {gpus_in_words(spec.world_size)} "
                                  "to run them: a search here could only build them (cuco eval does that)")
    rd = RunDir(absolute(run_dir) if run_dir else _default_run_dir(spec, shape)).create()
    spec, starts = _with_knobs(spec, knobs, cfg, rd.derived)
    evolution = Evolution(spec, cfg, rd, slots, evaluator, dev, machine=load_machine(), starts=starts)
    return Search(spec, cfg, rd, evolution, where)


def run_search(search: Search, on_event: Callable[[Event, Evolution], None] | None = None) -> SearchResult:
    """Run it to its end (KeyboardInterrupt passes through: every finished evaluation is kept, and the same search
    resumes), write summary.json, and return what it ended with. The store stays open for a table of the run
    (cuco.report.live.summary_table) until search.close()."""
    evo = search.evolution
    if on_event is not None:
        evo.on_event = on_event
    asyncio.run(evo.run())
    result = _result(search.run_dir, evo.db, evo.stop_reason, evo.stop_fault)
    atomic_write_json(search.run_dir.summary, result.summary(), indent=1)
    return result


def result_of(run_dir: RunDir | Path) -> SearchResult:
    """What the search in RUN_DIR ended with, read from its store (read-only: a copied run reads too). Why a search
    stopped early is not in the store: summary.json keeps it."""
    rd = RunDir.of(run_dir)
    db = rd.readable().open(readonly=True)
    try:
        return _result(rd, db, "", None)
    finally:
        db.close()


def _result(rd: RunDir, db: Database, stop_reason: str, stop_fault: str | None) -> SearchResult:
    best, first = db.best(), db.seed()
    measured, rounds_error = comparisons(db)
    code, error = _verdict(stop_reason, stop_fault, best, db.count("done"))
    return SearchResult(rd, db.count("done"), db.failures_by_level(), db.llm_totals(), stop_reason, stop_fault, first,
                        _start_failure(first), best, measured, rounds_error, code, error)


def _start_failure(seed: Candidate | None) -> str | None:
    """One line saying that the program the search started from (the seed, or search.start) failed, and why; None
    where it passed or was not evaluated. A search that found passing programs all the same still exits 0."""
    if seed is None or seed.status != "done" or seed.ok:
        return None
    lines = (seed.error or "").strip().splitlines()
    why = lines[0] if lines else "no error recorded"
    return f"the start program #{seed.id} ({seed.label or '-'}) failed at {seed.failed_level or '?'}: {why}"


def _verdict(stop_reason: str, fault: str | None, best: Candidate | None, done: int) -> tuple[ExitCode, str | None]:
    """0 only for a search that ended with a passing program and was not stopped by a failure; each other ending
    with the line that says why."""
    if fault in ("runner", "workload"):
        who = "cuco" if fault == "runner" else "the workload"
        return (ExitCode.CUCO if fault == "runner" else ExitCode.BAD_INPUT,
                f"the search stopped: {who} failed, not the candidates: {stop_reason}")
    if fault == "proposer":
        return ExitCode.FAILED, f"the search stopped: its proposer failed: {stop_reason}"
    if best is None:
        return ExitCode.FAILED, (f"no candidate passed ({done} evaluated; each one's error is in the table above and "
                                 "in cuco report)")
    return ExitCode.OK, None
