"""What one rank's judge reports (its rankN.json): the stages it finished, then its verdict.

The judge writes it after every stage and the launcher reads it back; both sides use these classes, so a field
the cascade reads is a field the judge wrote. The file is plain JSON, and reading it fills what it lacks, so a
judge that died early (or a file cut short) still reads as a report of fewer stages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class CorrectnessStage:
    """An L2 or L3 stage on one shape: every trial passed (a failure ends the evaluation instead)."""

    level: str
    shape: str
    trials: int
    max_norm_rel_err: float


@dataclass
class TimingStage:
    """The L4 stage on one shape: every rank's times and the judges' verdicts on them, gathered on every rank."""

    shape: str
    gated: bool  # the runs started behind the start gate (GPU); False: launch overhead is in the times
    note: str
    verified_runs: list[int]  # the timed runs whose outputs were checked: every one
    per_rank_ms: list[list[float]]  # every rank's times: CUDA events that fit the judge's clock (GPU), its clock (CPU)
    judge_per_rank_ms: list[list[float]]  # every rank's judge clock
    inputs_per_rank_ms: list[float | None]  # every rank's median cost of receiving its inputs inside the clock
    final_output_errors: list[str]  # wrong outputs of timed runs, parameters changed after one
    clock_errors: list[str]  # ranks whose reported times do not fit their judge's clock
    clock: dict[str, Any] | None = None  # this rank's cross-check of the two clocks (GPU)
    # every rank's runs that do nothing, by the clock per_rank_ms is read from: the runner's own floor
    null_per_rank_ms: list[list[float]] | None = None
    level: str = "L4"


@dataclass
class BoundsStage:
    """The workload's reference halves on one shape, timed in judges with no candidate."""

    shape: str
    compute_alone_per_rank_ms: list[list[float]] | None = None
    comm_alone_per_rank_ms: list[list[float]] | None = None
    compute_alone_graphed: bool | None = None  # replayed as a CUDA graph (GPU)
    level: str = "bounds"

    def times(self) -> dict[str, Any]:
        """What the references' cache stores of it."""
        return {k: v for k, v in asdict(self).items() if k not in ("shape", "level") and v is not None}


StageResult = CorrectnessStage | TimingStage | BoundsStage


def stage_from_json(data: dict[str, Any]) -> StageResult:
    level = data.get("level")
    cls = TimingStage if level == "L4" else BoundsStage if level == "bounds" else CorrectnessStage
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class RankReport:
    """A rank's whole report. `done` is written last: a rank passes only by its judge saying so."""

    rank: int
    stages: list[StageResult] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    failure: str | None = None  # whose failure the error is: "candidate", "crash", "workload", "runner", "verification"
    traceback: str | None = None
    sandbox: str = ""  # how the candidate's process was confined
    seed: int | None = None  # written once the candidate's process is gone

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankReport:
        known = {f.name for f in fields(cls)}
        report = cls(**{k: v for k, v in data.items() if k in known and k != "stages"})
        report.stages = [stage_from_json(s) for s in data.get("stages") or []]
        return report
