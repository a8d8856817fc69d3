"""The configuration of one `cuco evolve` run: run.toml, then --set overrides, validated, written to the run."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuco.errors import CucoError
from cuco.llm.config import LLMConfig
from cuco.paths import absolute
from cuco.runner.results.comparison import MAX_ROUNDS, MIN_ROUNDS
from cuco.tomlconfig import Section, field_types, load_dataclass, parse_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class SearchConfig:
    generations: int = 40
    """Evaluations in all, the seed's included; a resumed run counts the finished ones."""
    seed: int = 0
    """Seeds every proposal: the same seed and the same results give the same proposals."""
    shape: str = ""
    """The shape the search optimises (default: the workload's first)."""
    start: str = ""
    """A program to start from instead of the workload's seed (for example cuco transform's output); a relative
    path is read from run.toml's folder, or from the current one in --set."""
    proposer: str = "directive"
    """Where proposals come from: directive (no LLM) or llm (configured in [llm])."""
    space: str = "auto"
    """What the directive proposer searches: auto (the workload's strategy kernels, else the knobs of the rules'
    rewrite of its seed) or knobs (the knobs of the rules' rewrite of the start program, even where the workload
    ships strategy kernels: a program of your own on a built-in workload's buffers)."""
    islands: int = 2
    """Independent sub-populations; parents are chosen within an island."""
    migration_interval: int = 10
    """Every this many evaluations, each island's best is shared with the next island."""
    selection: str = "power_law"
    """Parent selection: power_law, weighted or hill_climbing."""
    power_law_alpha: float = 1.0
    """power_law: rank r is chosen with weight (r + 1) ** -alpha."""
    weighted_temperature: float = 0.1
    """weighted: softmax temperature over scores (efficiency)."""
    explore_fraction: float = 0.4
    """The first fraction of the evaluations explores (wide steps); the rest exploits (neighbours)."""
    inspirations: int = 3
    """How many archive and top-k candidates a proposal sees."""
    novelty: str = "auto"
    """Near-duplicate rejection of LLM proposals by code embeddings: auto (local model if installed), local,
    openai (the provider's embeddings), off. Exact duplicates are always rejected."""
    novelty_threshold: float = 0.98
    """Cosine similarity at or above which a proposal aiming at the same design point as an earlier candidate
    is a near duplicate of it (all-MiniLM-L6-v2 puts a renamed variable at about 0.98, a new chunking at 0.91)."""
    embedding_model: str = "text-embedding-3-small"
    """novelty = openai: the embeddings model."""
    slots: int = 0
    """Evaluations in parallel (0: as many disjoint GPU groups as the machine, or the Ray cluster, has; CPU: cores
    / world)."""
    backend: str = "local"
    """Where evaluations run: local (this machine) or ray (tasks on a Ray cluster, see [ray])."""
    rounds: int = 5
    """When the search ends, the best program is timed against the start program and the strongest baseline in
    this many alternating rounds (one evaluation of each per round), which say whether it is faster or within noise
    (cuco.runner.results.comparison); 0 for none, else 2 to 10."""


@dataclass
class EvalConfig:
    """How candidates are evaluated; shared by eval, baseline, evolve and transform, so one candidate is timed
    the same way by each. Unset values are the workload's [timing]."""

    device: str = "auto"
    """auto, cuda or cpu."""
    warmup: int | None = None
    """Warm-up iterations before timing each candidate (default: the workload's timing.warmup)."""
    iters: int | None = None
    """Timed iterations per candidate (default: the workload's timing.iters)."""
    timeout_s: float | None = None
    """Watchdog limit for one candidate's evaluation (default: the workload's timing.timeout_s)."""

    def check(self, where: str) -> None:
        if self.device not in ("auto", "cuda", "cpu"):
            raise CucoError(where, f"eval.device: expected auto, cuda or cpu, got {self.device!r}")
        if (self.iters is not None and self.iters < 1) or (self.warmup is not None and self.warmup < 0):
            raise CucoError(where, "eval.iters must be >= 1 and eval.warmup >= 0")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise CucoError(where, f"eval.timeout_s: must be positive, got {self.timeout_s}")


@dataclass
class RayConfig:
    """The Ray cluster evaluations run on when search.backend is ray (pip install "cuco-codesign[ray]")."""

    address: str = ""
    """The cluster to join: host:port of its head, auto for the one `ray start` made this machine part of (or
    RAY_ADDRESS), empty to start one on this machine."""
    retries: int = 1
    """Times an evaluation whose node dies is run again on another node before it is recorded as failed."""


@dataclass
class RunConfig:
    search: SearchConfig = field(default_factory=SearchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def check(self, where: str) -> None:
        s = self.search
        if s.generations < 1:
            raise CucoError(where, f"search.generations: must be at least 1, got {s.generations}")
        if s.islands < 1:
            raise CucoError(where, f"search.islands: must be at least 1, got {s.islands}")
        if s.selection not in ("power_law", "weighted", "hill_climbing"):
            raise CucoError(where, "search.selection: expected power_law, weighted or hill_climbing, got "
                                   f"{s.selection!r}")
        if s.novelty not in ("auto", "local", "openai", "off"):
            raise CucoError(where, f"search.novelty: expected auto, local, openai or off, got {s.novelty!r}")
        if s.backend not in ("local", "ray"):
            raise CucoError(where, f"search.backend: expected local or ray, got {s.backend!r}")
        if s.space not in ("auto", "knobs"):
            raise CucoError(where, f"search.space: expected auto or knobs, got {s.space!r}")
        if s.rounds != 0 and not MIN_ROUNDS <= s.rounds <= MAX_ROUNDS:
            raise CucoError(where, f"search.rounds: expected 0 (none) or {MIN_ROUNDS} to {MAX_ROUNDS}, got {s.rounds}")
        if self.ray.retries < 0:
            raise CucoError(where, f"ray.retries: must be >= 0, got {self.ray.retries}")
        if not 0.0 <= s.explore_fraction <= 1.0:
            raise CucoError(where, f"search.explore_fraction: must be within [0, 1], got {s.explore_fraction}")
        if self.llm.budget_usd < 0 or self.llm.patch_retries < 0 or self.llm.max_tokens < 1:
            raise CucoError(where, "llm.budget_usd and llm.patch_retries must be >= 0, llm.max_tokens >= 1")
        self.eval.check(where)


SECTIONS = ("search", "eval", "llm", "ray")


def load_config(path: Path | None) -> RunConfig:
    if path is None:
        return RunConfig()
    path = Path(path)
    if not path.is_file():
        raise CucoError(str(path), "config file does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CucoError(str(path), f"not valid TOML: {exc}") from None
    top = Section(data, path, "")
    cfg = RunConfig(search=load_dataclass(SearchConfig, top.table("search")),
                    eval=load_dataclass(EvalConfig, top.table("eval")),
                    llm=load_dataclass(LLMConfig, top.table("llm")),
                    ray=load_dataclass(RayConfig, top.table("ray")))
    for model, price in cfg.llm.pricing.items():
        if len(price) != 2:
            raise CucoError(str(path), f"llm.pricing.{model}: expected [input, output] dollars per million tokens")
    top.done()
    if cfg.search.start:  # a path in a configuration file is read from the file's folder
        cfg.search.start = str(absolute(path.parent / cfg.search.start))
    cfg.check(str(path))
    return cfg


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """--set search.islands=3: the value coerced to the field's type; unknown keys are errors."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not sep or not name:
            raise CucoError("--set", f"expected SECTION.KEY=VALUE, got {item!r}")
        target = getattr(cfg, section, None) if section in SECTIONS else None
        known = field_types(type(target)) if target is not None else {}
        if name not in known:
            raise CucoError("--set", f"unknown key {key!r}")
        try:
            setattr(target, name, parse_text(raw, known[name]))
        except TypeError as exc:
            raise CucoError("--set", f"{key}: {exc}") from None
        if (section, name) == ("search", "start") and cfg.search.start:
            cfg.search.start = str(absolute(cfg.search.start))
    cfg.check("--set")
    return cfg
