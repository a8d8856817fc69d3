"""Prompts are data: templates under program/templates/ and notes under designspace/notes/, filled here.

What every prompt about a program says (the workload, the machine, the contract, the design space) lives
here, shared by the search and the fast path; what only the search asks (parents, inspirations, history)
lives in cuco/evolve/prompting.py. A template placeholder with no value is an error, never an empty hole
in a prompt sent to a model.
"""

from __future__ import annotations

from importlib import resources
from string import Template
from typing import Any

from cuco.designspace.dimensions import DIMENSIONS
from cuco.workload.spec import WorkloadSpec

TEMPLATES = ("system", "diff", "rewrite", "crossover", "retry", "inspiration", "meta", "transform", "judge")


def render(name: str, **values: Any) -> str:
    text = resources.files("cuco.program").joinpath("templates", f"{name}.txt").read_text()
    try:
        return Template(text).substitute(values)
    except KeyError as exc:
        raise ValueError(f"prompt template {name}.txt: no value for placeholder ${exc.args[0]}") from None


def note(name: str) -> str:
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
                  contract=note("contract_cuda" if language == "cuda" else "contract_python"),
                  recommendations=recommendations or "none yet")


def retry_prompt(error: str) -> str:
    return render("retry", error=error)
