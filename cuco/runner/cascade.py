"""The evaluation cascade, one candidate at a time: L0 static → L1 build → L2 small → L3 full → L4 timing.

Each level's failure stops the cascade and is kept with its diagnostics in the record. The record is an
`EvalRecord` (cuco/runner/results/record.py), saved as plain JSON (one per evaluation) so that the search, the report
and a person read the same thing.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cuco.errors import CucoError
from cuco.language import language_of
from cuco.machine import fingerprint, gpus_in_words, load_machine
from cuco.paths import atomic_write_json
from cuco.runner.build.cuda_checks import check_and_build
from cuco.runner.build.nvcc import build_harness, first_error
from cuco.runner.build.static_checks import check_source
from cuco.runner.build.toolchain import find_toolchain
from cuco.runner.processes.job import Job, Stage
from cuco.runner.processes.launch import describe_exit, free_port, launch, make_gate_file
from cuco.runner.results.bounds import compute_bound, reference_timings
from cuco.runner.results.rank_report import CorrectnessStage, StageResult, TimingStage
from cuco.runner.results.record import Bound, Correctness, EvalRecord, ShapeResult, Timing
from cuco.runner.results.stats import slowest_rank, summarize
from cuco.workload.spec import WorkloadSpec

LEVELS = ["L0", "L1", "L2", "L3", "L4"]
# "Within noise" of the runner's floor (null_floor_ms). A program that does nothing times like the null runs: its
# median and theirs differ by noise alone, of the null runs' spread (sigma = 1.4826 * MAD, robust to the odd slow run
# of a busy machine), with a standard error of sqrt(pi / 2) * sigma * sqrt(1 / n_null + 1 / n) for two medians of
# n_null and n runs. Three of them let such a program escape about once in 700 (were the noise gaussian). On the CPU
# example (2 busy cores) the null runs' sigma was 3-35 us over 20 runs: the standard error stays under 20 us, where
# three sigmas of single runs would reach 0.1 ms, a third of an honest program's work on the smallest shape. The
# candidate's own spread does not widen it: a program slowed by a busy machine is not a program that did nothing.
# Where that margin is as long as the least time the work takes (the speed of light, or the library bound on the
# CPU), the null runs cannot tell work from none (a CPU under a test suite's load: null runs timed 1.4-2.5 ms against
# honest programs' 1.6-2.2) and the rule does not fire.
NULL_NOISE_SE = 3.0
# At least this much above the null median, whatever the spread. CPU: calling a Python run() that returns at once
# costs 5-25 us more than a null run (measured on the CPU example, null runs of 0.11-0.17 ms); honest programs there
# take 0.25 ms and more above it (a gloo collective alone). GPU: a candidate's launches wait behind the start gate, so
# one that launches nothing times like a null run; CUDA events tick in 0.5 us: four ticks.
NULL_NOISE_FLOOR_MS = {"cpu": 0.03, "cuda": 0.002}
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation
MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error, in sigma / sqrt(n)


@dataclass
class EvalOptions:
    device: str = "cpu"  # "cuda" or "cpu"
    shapes: list[str] | None = None  # full shapes for L3/L4 (default: all of the workload's)
    small_shapes: list[str] | None = None  # L2 (default: all small shapes)
    max_level: str = "L4"
    gpus: list[int] = field(default_factory=list)
    timeout_s: float | None = None
    warmup: int | None = None
    iters: int | None = None
    work_dir: Path | None = None
    name: str | None = None  # the workload's name for the candidate (default: its file's stem)
    on_step: Callable[[str], None] | None = None  # hears each step of rank 0's judge as it starts (a console's status)


# A judge's kind of failure (rank_report.py) as the record's fault: a crash and a wrong result are the candidate's too.
FAULTS = {"crash": "candidate", "verification": "candidate", "workload": "workload", "runner": "runner"}


def _fail(record: EvalRecord, level: str, error: str, diagnostics: str = "", fault: str = "candidate") -> EvalRecord:
    """`fault` says whose failure it is: the candidate's, the workload's (its reference, its bounds) or the
    runner's (cuco's own: a folder it could not use, a tool it lacks); only the first is the candidate's score."""
    record.ok, record.failed_level, record.error, record.diagnostics = False, level, error, diagnostics[-6000:]
    record.fault = fault
    record.level_reached = LEVELS[LEVELS.index(level) - 1] if level != "L0" else None
    return record


def evaluate(spec: WorkloadSpec, candidate: Path, opts: EvalOptions,
             baselines: dict[str, EvalRecord] | None = None) -> EvalRecord:
    """The cascade on one candidate; `baselines` (name -> record) give the speedups."""
    candidate = Path(candidate)
    text = candidate.read_text(errors="replace")
    language = language_of(candidate)
    record = EvalRecord(
        workload=spec.name, candidate=str(candidate), candidate_name=opts.name or candidate.stem, language=language,
        sha256=hashlib.sha256(text.encode()).hexdigest(), world=spec.world_size, device=opts.device,
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"), env=fingerprint())
    # L0
    report = check_source(candidate)
    if not report.ok:
        return _fail(record, "L0", "static checks failed: " + report.problems[0], "\n".join(report.problems))
    record.level_reached = "L0"
    if opts.max_level == "L0":
        return _done(record)
    # L1
    failed, library, harness = _level1(record, candidate, language, text, opts, spec.includes)
    if failed is not None:
        return failed
    record.level_reached = "L1"
    if opts.max_level == "L1":
        return _done(record)
    if language == "cuda" and opts.device != "cuda":
        record.incomplete = f"reached L1 (built); L2-{opts.max_level} need {gpus_in_words(spec.world_size)}"
        return _done(record)

    # L2..L4 in one launch: the candidate's setup cost is paid once per shape.
    small = opts.small_shapes if opts.small_shapes is not None else [s.name for s in spec.small_shapes]
    full = opts.shapes if opts.shapes is not None else [s.name for s in spec.shapes]
    stages = [Stage("L2", s) for s in small]
    if LEVELS.index(opts.max_level) >= 3:
        stages += [Stage("L3", s) for s in full]
    references: dict[str, dict[str, Any]] = {}
    if opts.max_level == "L4":
        try:  # the bound of every timed shape, before any GPU time is spent on a number it could not be held to
            for s in full:
                spec.check_bounds(spec.shape(s))
        except CucoError as exc:
            return _fail(record, "L4", str(exc), fault="workload")
        stages += [Stage("L4", s) for s in full]
        references, error = reference_timings(spec, full, opts.device, list(opts.gpus),
                                              opts.timeout_s or spec.timing.timeout_s)
        if error:
            record.bounds_error = error
    temporary = opts.work_dir is None
    try:  # absolute: the judges and the candidates' processes start in folders of their own
        work = Path(opts.work_dir or tempfile.mkdtemp(prefix="cuco-eval-")).absolute()
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _fail(record, stages[0].level if stages else "L2",
                     f"cuco cannot write the evaluation's folder {opts.work_dir or tempfile.gettempdir()}: "
                     f"{exc.strerror or exc}",
                     fault="runner")
    gate_file = make_gate_file(work) if opts.device == "cuda" and harness else None
    # The workload's NCCL settings, then those it declares for this candidate by name (workload.toml only: a
    # candidate cannot choose its own).
    env = {**spec.nccl_env, **spec.candidate_env.get(opts.name or "", {})}
    job = Job(workload_root=str(spec.root), world=spec.world_size, candidate=str(candidate.resolve()),
              language=language, device=opts.device, stages=stages, out_dir=str(work), host_port=free_port(),
              library=library, harness=harness, gate_file=gate_file, gpus=list(opts.gpus), warmup=opts.warmup,
              iters=opts.iters, env=env)
    if env:
        record.nccl_env = env
    if not temporary:
        record.work_dir = str(work)
    try:
        res = launch(job, opts.timeout_s or spec.timing.timeout_s, work / "job.json", opts.on_step)
        record.seconds = res.seconds
        return _interpret(spec, record, res, stages, opts, baselines, references)
    finally:
        if gate_file:
            Path(gate_file).unlink(missing_ok=True)
        if temporary:
            shutil.rmtree(work, ignore_errors=True)


def _level1(record: EvalRecord, candidate: Path, language: str, text: str, opts: EvalOptions,
            includes: tuple[Path, ...] = ()):
    """Build (CUDA: the checks of what the compiler sees, nvcc, the library's symbols) or compile (Python); on GPUs
    the runner's harness too, which every candidate's host needs. Returns (the failed record or None, the
    candidate's library, the harness)."""
    library = harness = None
    missing = find_toolchain().missing() if language == "cuda" or opts.device == "cuda" else []
    if missing:
        return _fail(record, "L1", "cuco cannot build CUDA programs on this machine: missing " + "; ".join(missing),
                     fault="runner"), None, None
    if language == "cuda":
        built, problems = check_and_build(candidate, includes=includes)
        record.build = {"cached": built.cached, "seconds": built.seconds}
        if problems:
            return _fail(record, "L1", "static checks of what the compiler sees failed: " + problems[0],
                         "\n".join(problems)), None, None
        if not built.ok:
            return _fail(record, "L1", "nvcc build failed: " + first_error(built.log), built.log), None, None
        library = str(built.library)
    else:
        try:
            compile(text.removeprefix("\ufeff"), str(candidate), "exec", dont_inherit=True)  # as the loader does
        except SyntaxError as exc:
            return _fail(record, "L1", f"Python syntax error: {candidate.name}:{exc.lineno}: {exc.msg}",
                         f"{exc.text or ''}"), None, None
    if opts.device == "cuda":
        hb = build_harness()
        if not hb.ok:
            why = "the runner's harness failed to build: " + first_error(hb.log)
            return _fail(record, "L1", why, hb.log, fault="runner"), None, None
        harness = str(hb.library)
    return None, library, harness


def _interpret(spec, record: EvalRecord, res, stages, opts, baselines, references) -> EvalRecord:
    per_rank = [o.report for o in res.ranks]
    done_stages = per_rank[0].stages if per_rank else []
    record.seed = per_rank[0].seed if per_rank else None
    record.sandbox = per_rank[0].sandbox if per_rank else ""
    # The level of the first stage no rank finished.
    finished = min(len(r.stages) for r in per_rank) if per_rank else 0
    current = stages[finished].level if finished < len(stages) else "L4"
    _collect(spec, record, done_stages, opts, baselines, references)
    if res.timed_out:
        where = "; ".join(f"rank {o.rank}: {o.last_step}" for o in res.ranks)
        limit = opts.timeout_s or spec.timing.timeout_s
        why = res.stalled or f"the evaluation's limit of {limit:.0f} s ran out"
        return _fail(record, current, f"timeout: killed every rank: {why} (hung; last steps: {where})", _logs(res))
    if res.crashed:
        cause = res.ranks[_cause_first(res)[0]].report.failure
        return _fail(record, current, _crash_message(res), _logs(res), FAULTS.get(cause, "candidate"))
    errors = [r for r in per_rank if r.error]
    if errors:
        return _fail(record, current, errors[0].error, _logs(res), FAULTS.get(errors[0].failure, "candidate"))
    # A rank passes only by its judge reporting every stage finished; an exit status alone means nothing.
    unfinished = [o.rank for o in res.ranks if not o.report.done or len(o.report.stages) < len(stages)]
    if unfinished:
        return _fail(record, current, f"ranks {unfinished} ended without their judge reporting every stage done",
                     _logs(res))
    record.level_reached = stages[-1].level if stages else record.level_reached
    problems, fault = _l4_problems(spec, record, opts)
    timed = sorted({st.shape for st in done_stages if isinstance(st, TimingStage)})
    if opts.device == "cpu" and timed and any("below the library bound" in p for p in problems):
        # The CPU has no ceilings: its limit is the library bound, measured once and cached, which a busy moment can
        # have made slow for good. Measured again, once, before a time is called impossible.
        references, error = reference_timings(spec, timed, opts.device, list(opts.gpus),
                                              opts.timeout_s or spec.timing.timeout_s, fresh=True)
        record.bounds_error = error or record.bounds_error
        _collect(spec, record, done_stages, opts, baselines, references)
        problems, fault = _l4_problems(spec, record, opts)
    if problems:
        return _fail(record, "L4", "; ".join(problems), fault=fault)
    return _done(record)


def _crash_message(res) -> str:
    """The first judge to report a failure names the cause; a judge that died itself is described by its exit."""
    parts = []
    order = _cause_first(res)
    for r in order:
        o = res.ranks[r]
        err = o.report.error
        parts.append(f"rank {r} at '{o.last_step}': {err}" if err else
                     f"rank {r}'s judge {describe_exit(o.returncode)} at '{o.last_step}'")
    others = [o.rank for o in res.ranks if o.returncode is None]
    if others:
        parts.append(f"ranks {others} stopped by the watchdog")
    whose = res.ranks[order[0]].report.failure
    prefix = {"candidate": "candidate error: ", "runner": "cuco's own failure: ", "workload": "workload error: "}
    return prefix.get(whose, "crash: ") + "; ".join(parts)


def _cause_first(res) -> list[int]:
    """A rank whose candidate died of a signal is the cause, whoever reported first; then a rank whose candidate
    raised: the runner's errors on the other ranks (a connection reset by the failed peer) are consequences, and
    which judge reports first is a race."""
    first = {"crash": 0, "candidate": 1}
    return sorted(res.crashed, key=lambda r: first.get(res.ranks[r].report.failure, 2))


def _l4_problems(spec, record: EvalRecord, opts) -> tuple[list[str], str]:
    """Verdicts that need every rank's numbers: the bound, the timed runs' outputs, the judge's clock; and whose
    failure they are (a missing bound is the workload's, everything else the candidate's)."""
    problems, fault = [], "candidate"
    slack = spec.timing.bound_slack if opts.device == "cuda" else spec.timing.cpu_bound_slack
    for name, shape_rec in record.shapes.items():
        t = shape_rec.timing
        if not t:
            continue
        bound = record.bound_ms(name)
        limit, what = physical_limit(shape_rec, bound, opts.device)
        if not bound:
            why = (shape_rec.bound and shape_rec.bound.library_refused) or record.bounds_error or \
                "the workload's reference defines neither compute_alone nor comm_alone"
            problems.append(f"shape {name}: no physical bound ({why}); a time without its bound is not reported")
            fault = "workload"
        elif limit and t.median_ms is not None and t.median_ms < limit * (1 - slack):
            problems.append(f"impossible: shape {name} median {t.median_ms:.4f} ms is below {what} {limit:.4f} ms "
                            f"by more than {slack:.0%}: work was skipped or the timing is broken")
        elif does_work(shape_rec.bound) and (floor := null_floor_ms(t, opts.device)) and t.median_ms < floor[0] \
                and floor[0] - floor[1] < (limit or bound):  # where the noise hides less than the work's least time
            problems.append(f"impossible: shape {name} median {t.median_ms:.4f} ms is within noise of a run that does "
                            f"nothing ({floor[1]:.4f} ms)")
        if t.final_output_errors:
            problems.append(f"shape {name}: a timed run's output is wrong: {t.final_output_errors[0]}")
        if t.clock_errors:
            problems.append(f"shape {name}: {t.clock_errors[0]}")
    return problems, fault


def physical_limit(shape_rec: ShapeResult, bound: float | None, device: str) -> tuple[float | None, str]:
    """What a time may not beat: the speed of light (the machine's ceilings, no library in it). On the CPU, which has
    no ceilings, the library bound stands in, with the slack its own noise needs; on a GPU whose ceilings were not
    measured (`cuco doctor`) nothing does: a time under the library's is a finding there, never a rejection, and the
    verification of every timed run is what stands between a skipped run and a score."""
    light = shape_rec.bound.speed_of_light_ms if shape_rec.bound else None
    if light:
        return light, "the speed of light"
    if device == "cpu":
        return bound, "the library bound (no speed of light measured here)"
    return None, ""


def does_work(bound: Bound | None) -> bool:
    """The workload's amounts for the shape (workload.toml's [bounds]) say a run has work to do."""
    return bool(bound) and any((v or 0) > 0 for v in (bound.flops, bound.hbm_bytes, bound.comm_bytes))


def null_floor_ms(t: Timing, device: str) -> tuple[float, float] | None:
    """(The time a median must reach not to be within noise of the runs that do nothing, their median): their
    median plus NULL_NOISE_SE standard errors of the difference of two medians of their spread, at least the device's
    NULL_NOISE_FLOOR_MS. None where either was not timed. Both the slowest rank per run, as the median is."""
    null = slowest_rank(t.null_per_rank_ms) if t.null_per_rank_ms else []
    n = len(slowest_rank(t.per_rank_ms)) if t.per_rank_ms else 0
    if not null or not n or t.median_ms is None:
        return None
    m0 = statistics.median(null)
    sigma = MAD_TO_SIGMA * statistics.median(abs(x - m0) for x in null)
    se = MEDIAN_SE * sigma * math.sqrt(1 / len(null) + 1 / n)
    return m0 + max(NULL_NOISE_SE * se, NULL_NOISE_FLOOR_MS.get(device, NULL_NOISE_FLOOR_MS["cuda"])), m0


def _collect(spec, record: EvalRecord, stages: list[StageResult], opts, baselines: dict[str, EvalRecord] | None,
             references) -> None:
    machine = load_machine()
    for st in stages:
        shape_rec = record.shapes.setdefault(st.shape, ShapeResult(params=spec.shape(st.shape).params))
        if isinstance(st, CorrectnessStage):
            shape_rec.correctness.append(Correctness(st.level, st.trials, st.max_norm_rel_err))
            continue
        assert isinstance(st, TimingStage), st
        judge = summarize(st.judge_per_rank_ms)
        t = Timing(**summarize(st.per_rank_ms), gated=st.gated, note=st.note, per_rank_ms=st.per_rank_ms,
                   verified_runs=st.verified_runs, final_output_errors=st.final_output_errors,
                   clock_errors=st.clock_errors, judge_median_ms=judge["median_ms"], clock=st.clock,
                   inputs_ms=max([v for v in st.inputs_per_rank_ms if v is not None], default=None),
                   null_median_ms=summarize(st.null_per_rank_ms)["median_ms"] if st.null_per_rank_ms else None,
                   null_per_rank_ms=st.null_per_rank_ms)
        shape_rec.timing = t
        extra = {}
        for key in ("compute_alone", "comm_alone"):
            times = references.get(st.shape, {}).get(f"{key}_per_rank_ms")
            if times:
                ref = summarize(times)
                extra[key], extra[f"{key}_min"] = ref["median_ms"], ref["min_ms"]
        shape_rec.references_ms = extra
        # A bound is what the hardware can do at best: the fastest measured iteration, not the typical one
        # (on a busy CPU a median can be several times that, and would reject honest candidates).
        b = Bound(**compute_bound(spec, spec.shape(st.shape), spec.world_size, opts.device,
                                  extra.get("compute_alone_min"), extra.get("comm_alone_min"), machine))
        shape_rec.bound = b
        if b.bound_ms and t.median_ms:
            shape_rec.efficiency = b.bound_ms / t.median_ms
            shape_rec.beats_library = t.median_ms < b.bound_ms
        if b.speed_of_light_ms and t.median_ms:
            shape_rec.sol_efficiency = b.speed_of_light_ms / t.median_ms
        if baselines:
            sp = {}
            for bname, brec in baselines.items():
                bt = brec.median_ms(st.shape)
                if bt and t.median_ms:
                    sp[bname] = bt / t.median_ms
            shape_rec.speedup = sp


def _logs(res) -> str:
    return "\n".join(f"--- rank {o.rank} ({'killed' if o.returncode is None else describe_exit(o.returncode)}; "
                     f"last step: {o.last_step}) ---\n{o.log_tail}" for o in res.ranks)


def _done(record: EvalRecord, note: str = "") -> EvalRecord:
    record.ok = True
    if note:
        record.note = note
    return record


def save_record(record: EvalRecord, path: Path) -> Path:
    """The record as JSON, in the layout every stored record has."""
    return atomic_write_json(path, record.to_dict(), indent=1)
