"""The evaluation record, typed: what the cascade found for one candidate.

The cascade fills an `EvalRecord`; everything that reads it (the search, the store, the reports, the CLI) uses
attributes, so that a misspelt key fails where it is written and not as a silent `None` far away. On disk the
record is plain JSON (`to_dict`), the same layout in record files, baselines files and the search's SQLite store;
`from_dict` ignores keys it does not know and fills the ones it lacks, so a record from another version of cuco
loads, and a person or a script reads the file without cuco.

Some keys are absent from the JSON rather than null until the level that sets them has run (a shape's `timing`
before L4, the record's `seconds` before the launch); the `_OMIT` sets of each class name those, so that
`to_dict` writes exactly what the cascade's dict held.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


def _plain(obj: Any, omit: frozenset[str]) -> dict[str, Any]:
    """A dataclass's fields as a dict in declaration order (the JSON's key order), nested records converted,
    leaving out the fields of `omit` that are None: those the cascade's dict did not hold yet."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is None and f.name in omit:
            continue
        out[f.name] = v.to_dict() if hasattr(v, "to_dict") else v
    return out


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls`: a record from a newer or older tree may hold others."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (data or {}).items() if k in names}


@dataclass
class Correctness:
    """One L2 or L3 stage's verdict on a shape: how many seeded trials passed and their worst error."""
    level: str = ""
    trials: int = 0
    max_norm_rel_err: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _plain(self, frozenset())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Correctness:
        return cls(**_known(cls, data))


@dataclass
class Timing:
    """A shape's L4 times (milliseconds, the slowest rank per iteration, as `stats.summarize` gives them) and the
    judge's verdicts on the timed runs. With no iteration timed, summarize gives only the median (None) and the
    count, hence the percentiles' omission when None."""
    _OMIT: ClassVar[frozenset[str]] = frozenset({"p10_ms", "p90_ms", "min_ms", "max_ms", "spread_pct",
                                                 "per_rank_median_ms", "inputs_ms", "null_median_ms",
                                                 "null_per_rank_ms"})
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    spread_pct: float | None = None
    iters: int = 0
    per_rank_median_ms: list[float | None] | None = None
    gated: bool | None = None
    note: str | None = None
    per_rank_ms: list[list[float]] = field(default_factory=list)
    verified_runs: list[int] = field(default_factory=list)
    final_output_errors: list[str] = field(default_factory=list)
    clock_errors: list[str] = field(default_factory=list)
    judge_median_ms: float | None = None
    clock: dict[str, Any] | None = None
    # Of median_ms, what writing the run's inputs into the candidate's buffers costs alone (the slowest rank's
    # median): they arrive inside the timed region, so that no candidate sees them before its clock runs.
    inputs_ms: float | None = None
    # The runner's own floor: runs that do nothing but receive their inputs, timed like the candidate's (the slowest
    # rank per run, its median; every rank's times): a median within noise of it did no work (cascade.null_floor_ms).
    null_median_ms: float | None = None
    null_per_rank_ms: list[list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _plain(self, self._OMIT)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        return cls(**_known(cls, data))


@dataclass
class Bound:
    """The bounds of a shape (`bounds.compute_bound`). `bound_ms`, the library bound: the larger of the compute
    alone (the workload's library version, timed) and the communication alone, plus the communication that can
    only follow the compute. `speed_of_light_ms`: the same from the machine's ceilings alone (flops, HBM bytes and
    link bytes at the rates `cuco doctor` measured), with no library in it."""
    # serial_comm_ms: only workloads with such communication; hbm_ms and speed_of_light_ms: only on GPUs whose
    # ceilings `cuco doctor` measured
    _OMIT: ClassVar[frozenset[str]] = frozenset({"serial_comm_ms", "hbm_bytes", "inputs_bytes", "hbm_ms",
                                                 "speed_of_light_ms", "library_refused"})
    compute_ms: float | None = None
    compute_floor_ms: float | None = None
    comm_ms: float | None = None
    comm_source: str = ""
    comm_bytes: float | None = None
    flops: float | None = None
    serial_comm_ms: float | None = None
    bound_ms: float | None = None
    hbm_bytes: float | None = None
    inputs_bytes: float | None = None  # a run's fresh inputs, written inside its time: 2x this in hbm_ms
    hbm_ms: float | None = None
    speed_of_light_ms: float | None = None  # from the machine's ceilings alone (cuco.runner.bounds.speed_of_light)
    library_refused: str | None = None  # why the library bound was dropped: it came out under the speed of light

    def to_dict(self) -> dict[str, Any]:
        return _plain(self, self._OMIT)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bound:
        return cls(**_known(cls, data))


@dataclass
class ShapeResult:
    """Everything measured on one shape. `speedup` is None where no baselines were given, {} where they were but
    none was timed on this shape: the JSON tells the two apart by the key's presence."""
    params: dict[str, Any] = field(default_factory=dict)
    correctness: list[Correctness] = field(default_factory=list)
    timing: Timing | None = None
    references_ms: dict[str, float] = field(default_factory=dict)
    bound: Bound | None = None
    efficiency: float | None = None
    speedup: dict[str, float] | None = None
    sol_efficiency: float | None = None  # speed of light / median
    # A median below the library bound: a finding (the search exists to find it), never a rejection; only the speed
    # of light makes a time impossible.
    beats_library: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out = _plain(self, frozenset({"timing", "bound", "efficiency", "speedup", "sol_efficiency", "beats_library"}))
        out["correctness"] = [c.to_dict() for c in self.correctness]
        if not self.correctness:  # set by the first L2/L3 stage, absent from a shape only timed
            del out["correctness"]
        if self.timing is None and not self.references_ms:  # set with the timing
            del out["references_ms"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShapeResult:
        kw = _known(cls, data)
        kw["correctness"] = [Correctness.from_dict(c) for c in kw.get("correctness") or []]
        kw["timing"] = Timing.from_dict(kw["timing"]) if kw.get("timing") else None
        kw["bound"] = Bound.from_dict(kw["bound"]) if kw.get("bound") else None
        kw["references_ms"] = dict(kw.get("references_ms") or {})
        return cls(**kw)


@dataclass
class EvalRecord:
    """One candidate's evaluation: who, where, how far the cascade got and why it stopped, and per shape what
    was measured. The optional fields after `env` are set by the levels that ran (`build` by a CUDA L1, `seed`,
    `sandbox` and `seconds` by the launch, `note` by a pass with a caveat) and absent from the JSON before."""
    _OMIT: ClassVar[frozenset[str]] = frozenset({"build", "bounds_error", "nccl_env", "work_dir", "seconds",
                                                 "seed", "sandbox", "note", "node", "fault", "incomplete"})
    workload: str = ""
    candidate: str = ""
    candidate_name: str = ""
    language: str = ""  # "cuda" or "python"
    sha256: str = ""
    world: int = 0
    device: str = ""
    started: str = ""
    ok: bool = False
    level_reached: str | None = None
    failed_level: str | None = None
    error: str | None = None
    fault: str | None = None  # whose failure: "candidate", "workload" (its reference or bounds) or "runner" (cuco's)
    incomplete: str | None = None  # passed what ran, but this machine could not run every level asked for: why
    diagnostics: str = ""
    shapes: dict[str, ShapeResult] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] | None = None
    bounds_error: str | None = None
    nccl_env: dict[str, str] | None = None
    work_dir: str | None = None
    seconds: float | None = None
    seed: int | None = None
    sandbox: str | None = None
    note: str | None = None
    node: dict[str, Any] | None = None  # on a cluster: the host, Ray node and GPUs that evaluated it

    def to_dict(self) -> dict[str, Any]:
        """Today's JSON layout, key for key. The judge's seed may be null once the launch ran (no rank
        reported), so it is written whenever the sandbox, read from the same report, is."""
        omit = self._OMIT - {"seed"} if self.sandbox is not None else self._OMIT
        out = _plain(self, omit)
        out["shapes"] = {name: s.to_dict() for name, s in self.shapes.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalRecord:
        """Tolerant: unknown keys are ignored and missing ones take their defaults, so older records load (their
        language under its former key, `kind`)."""
        if "language" not in data and "kind" in data:
            data = {**data, "language": data["kind"]}
        kw = _known(cls, data)
        kw["shapes"] = {name: ShapeResult.from_dict(s) for name, s in (kw.get("shapes") or {}).items()}
        return cls(**kw)

    # ---- what the consumers ask of a record ----------------------------------------------------------
    def shape(self, name: str) -> ShapeResult | None:
        return self.shapes.get(name)

    def timing(self, name: str) -> Timing | None:
        """The shape's L4 timing, None where the shape was not timed (or not run)."""
        s = self.shapes.get(name)
        return s.timing if s else None

    def median_ms(self, name: str) -> float | None:
        """The shape's median time (slowest rank), the number a search ranks by."""
        t = self.timing(name)
        return t.median_ms if t else None

    def bound_ms(self, name: str) -> float | None:
        """The shape's physical bound, None where it was not computed."""
        s = self.shapes.get(name)
        return s.bound.bound_ms if s and s.bound else None
