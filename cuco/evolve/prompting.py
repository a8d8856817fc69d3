"""Prompts are data: templates under evolve/prompts/ and notes under designspace/notes/, filled here.

A template placeholder with no value is an error, never an empty hole in a prompt sent to a model.
"""

from __future__ import annotations

from importlib import resources
from string import Template
from typing import Any

from cuco.designspace.dimensions import DIMENSIONS
from cuco.evolve.database import Candidate
from cuco.workload.spec import WorkloadSpec

KINDS = ("diff", "rewrite", "crossover")
TEMPLATES = ("system", "diff", "rewrite", "crossover", "retry", "inspiration", "meta", "transform", "judge")


def render(name: str, **values: Any) -> str:
    text = resources.files("cuco.evolve").joinpath("prompts", f"{name}.txt").read_text()
    try:
        return Template(text).substitute(values)
    except KeyError as exc:
        raise ValueError(f"prompt template {name}.txt: no value for placeholder ${exc.args[0]}") from None


def _note(name: str) -> str:
    return resources.files("cuco.designspace").joinpath("notes", f"{name}.md").read_text().strip()


def buffers_text(spec: WorkloadSpec) -> str:
    return "\n".join(f"- {b.name}: {b.role}, {b.dtype}, shape [{', '.join(map(str, b.shape))}]"
                     + (", symmetric" if b.symmetric else "") for b in spec.buffers.values())


def notes(backends: list[str]) -> str:
    root = resources.files("cuco.designspace").joinpath("notes")
    parts = [root.joinpath(f"{b}.md").read_text().strip() for b in backends + ["strategy"]
             if root.joinpath(f"{b}.md").is_file()]
    return "\n\n".join(parts)


def machine_line(m: dict[str, Any]) -> str:
    gpus = m.get("gpus") or []
    bits = [f"{len(gpus)}x {gpus[0]['name']} ({gpus[0]['sm_count']} SMs)" if gpus else "no GPU (CPU ranks)"]
    if m.get("links"):
        bits.append(f"links {m['links']}")
    if m.get("peer_bw_gbps"):
        bits.append(f"peer link {m['peer_bw_gbps']:.0f} GB/s per direction (measured)")
    if m.get("gemm_bf16_tflops"):
        bits.append(f"bf16 GEMM {m['gemm_bf16_tflops']:.0f} TFLOP/s (measured)")
    return "; ".join(bits)


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


def system_prompt(spec: WorkloadSpec, shape: str, bound: float | None, best: float | None, machine: dict[str, Any],
                  recommendations: str, language: str) -> str:
    params = spec.shape(shape).params
    backends = sorted({v for s in spec.strategies.values() for v in s.accepts["backend"]}) or ["nccl_host"]
    return render("system", workload=spec.name, description=spec.description, world=spec.world_size, shape=shape,
                  shape_params=", ".join(f"{k}={v}" for k, v in params.items()),
                  bound=f"{bound:.4f}" if bound else "unknown", best=f"{best:.4f}" if best else "unknown",
                  stream_names="ctx->stream and ctx->sideStreams[0..nSideStreams)" if language == "cuda"
                  else "ctx.stream and ctx.side_streams",
                  dimensions="; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in DIMENSIONS.items()),
                  notes=notes(backends), machine=machine_line(machine), buffers=buffers_text(spec),
                  workload_notes=spec.notes.strip() or "none",
                  contract=_note("contract_cuda" if language == "cuda" else "contract_python"),
                  recommendations=recommendations or "none yet")


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


def retry_prompt(error: str) -> str:
    return render("retry", error=error)



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
    lang = "cuda" if seed_path.suffix == ".cu" else "python"
    parent = _unevaluated(1, seed_path.read_text(), lang, "nccl_host/deferred/global/cta/1")
    others = [_unevaluated(i + 2, p.read_text(), lang, None)
              for i, (name, p) in enumerate(sorted(spec.candidates.items())) if p != seed_path and p.suffix == seed_path.suffix]
    system = system_prompt(spec, shape, None, None, machine, "", lang)
    return {kind: f"# System\n\n{system}\n\n# User\n\n{user_prompt(kind, parent, others[:2])}" for kind in KINDS}
