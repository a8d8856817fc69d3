"""The search's prompts: a parent with its result, inspirations, and the history a meta step distils.

Built on cuco/program/prompts.py, which holds what every prompt about a program says.
"""

from __future__ import annotations

from typing import Any

from cuco.evolve.database import Candidate
from cuco.language import language_of
from cuco.program.prompts import render, system_prompt
from cuco.workload.spec import WorkloadSpec

KINDS = ("diff", "rewrite", "crossover")


def _point(c: Candidate) -> str:
    return c.label or "none stated"


def result_text(c: Candidate) -> str:
    if c.status != "done":
        return "not evaluated yet"
    if not c.ok:
        diag = (c.diagnostics or "").strip()[-1500:]
        return f"failed at {c.failed_level}: {c.error}" + (f"\nDiagnostics (tail):\n{diag}" if diag else "")
    eff = f", {c.bound_ms / c.median_ms:.2f} of the bound" if c.bound_ms and c.median_ms else ""
    return f"correct; {c.median_ms:.4f} ms (bound {c.bound_ms or 0:.4f} ms{eff})"


def user_prompt(kind: str, parent: Candidate, inspirations: list[Candidate]) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}")
    lang = "cuda" if parent.language == "cuda" else "python"
    ins = "\n".join(render("inspiration", id=c.id, point=_point(c), outcome=result_text(c), language=lang,
                           code=c.code.rstrip()) for c in inspirations) or "none yet"
    return render(kind, parent_id=parent.id, parent_point=_point(parent), language=lang,
                  parent_code=parent.code.rstrip(), parent_result=result_text(parent), inspirations=ins)


def meta_prompt(spec: WorkloadSpec, shape: str, bound: float | None, done: list[Candidate]) -> str:
    lines = []
    for c in done:
        outcome = f"correct, {c.median_ms:.4f} ms" if c.ok and c.median_ms else f"failed at {c.failed_level}: " \
            f"{(c.error or '').splitlines()[0][:200] if c.error else 'no reason'}"
        lines.append(f"- #{c.id} {c.label or 'no design point'} ({c.proposer}): {outcome}")
    params = spec.shape(shape).params
    return render("meta", workload=spec.name, shape=shape, world=spec.world_size,
                  shape_params=", ".join(f"{k}={v}" for k, v in params.items()),
                  bound=f"{bound:.4f}" if bound else "unknown", history="\n".join(lines) or "none")


def recommendations_from(reply: str, limit: int = 5) -> list[str]:
    return [line.strip()[2:].strip() for line in reply.splitlines() if line.strip().startswith("- ")][:limit]


def _unevaluated(cid: int, code: str, language: str, label: str | None) -> Candidate:
    return Candidate(id=cid, proposal_index=cid, code=code, code_hash="", language=language, parent_id=None, island=0,
                     generation=0, proposer="shipped", phase="seed", directive=None, label=label, status="pending",
                     ok=None, level_reached=None, failed_level=None, score=None, median_ms=None, bound_ms=None,
                     error=None, diagnostics=None, record=None, created_at="", started_at=None, finished_at=None,
                     eval_seconds=None)


def example_prompts(spec: WorkloadSpec, shape: str, machine: dict[str, Any]) -> dict[str, str]:
    """The first prompt of each kind a run would send: the seed as parent, the shipped candidates as others."""
    seed_path = spec.seed_path
    if seed_path is None:
        raise ValueError(f"{spec.name} has no seed candidate")
    lang = language_of(seed_path)
    parent = _unevaluated(1, seed_path.read_text(), lang, "nccl_host/deferred/global/cta/1")
    others = [_unevaluated(i + 2, p.read_text(), lang, None)
              for i, (name, p) in enumerate(sorted(spec.candidates.items()))
              if p != seed_path and language_of(p) == lang]
    system = system_prompt(spec, shape, None, None, machine, "", lang)
    return {kind: f"# System\n\n{system}\n\n# User\n\n{user_prompt(kind, parent, others[:2])}" for kind in KINDS}
