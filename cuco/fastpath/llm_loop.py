"""The fast path's LLM loop, for what the rules cannot rewrite (the CUCo paper's correctness-first agent).

Stage A adds the device-side infrastructure beside the host calls (symmetric buffers, the device
communicator, kernels) with the host collectives still in place; stage B replaces the host collectives.
Every try is built, run and verified by the runner; after a failure a judge call diagnoses it in a few
sentences for the next try. Every prompt, reply, program and verdict is kept in the work directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.fastpath.analyze import AnalysisError, analyze
from cuco.fastpath.rewrite import no_host_collective_left
from cuco.llm import LLMClient, LLMError
from cuco.program.directives import parse_directive
from cuco.program.edits import PatchError, fenced_program
from cuco.program.prompts import render, system_prompt
from cuco.runner.results.record import EvalRecord
from cuco.workload.spec import WorkloadSpec

STAGES = {
    "A": "Add the device-side infrastructure next to the host calls: make the buffers peers must reach "
         "symmetric windows, state the device communicator's requirements (cuco_dev_requirements) and add the "
         "kernels that will communicate, but keep every host NCCL collective in place and in use.",
    "B": "Replace every host NCCL collective by device-initiated communication through the infrastructure of "
         "stage A (LSA loads/stores through ncclGetLsaPointer between LSA barriers). No ncclAllGather, "
         "ncclReduceScatter, ncclAllReduce, ncclSend or ncclRecv may remain.",
}

Evaluator = Callable[[Path], EvalRecord]


class TransformFailed(RuntimeError):
    pass


@dataclass
class StageLog:
    stage: str
    tries: list[dict[str, Any]] = field(default_factory=list)


def _analysis_text(code: str) -> str:
    try:
        a = analyze(Path("program.cu"), code.encode())
    except AnalysisError as exc:
        return str(exc)
    return "\n".join(f"- line {o.line} {o.kind} {o.name}: reads {o.reads}, writes {o.writes}, stream {o.stream}"
                     for o in a.ops)


async def llm_transform(spec: WorkloadSpec, code: str, client: LLMClient, evaluate: Evaluator, work_dir: Path,
                        tries_per_stage: int = 3, machine: dict[str, Any] | None = None,
                        max_tokens: int = 16000) -> tuple[str, list[StageLog]]:
    work_dir.mkdir(parents=True, exist_ok=True)
    system = system_prompt(spec, spec.shapes[0].name, None, None, machine or {}, "", "cuda")
    logs = []
    for stage, goal in STAGES.items():
        log = StageLog(stage)
        logs.append(log)
        feedback = ""
        for n in range(1, tries_per_stage + 1):
            base = work_dir / f"stage{stage}-try{n}"
            prompt = render("transform", stage=stage, goal=goal, language="cuda", code=code.rstrip(),
                            analysis=_analysis_text(code), feedback=feedback)
            entry: dict[str, Any] = {"try": n}
            log.tries.append(entry)
            (base.with_suffix(".prompt.md")).write_text(prompt)
            try:
                reply = await client.complete(system, prompt, 0.3, max_tokens)
            except LLMError as exc:
                entry["error"] = str(exc)
                raise TransformFailed(f"stage {stage}: {exc}") from None
            base.with_suffix(".reply.md").write_text(reply.text)
            try:
                parse_directive(reply.text)
                new = fenced_program(reply.text)  # the fast path may change any line; L0 checks the contract
            except PatchError as exc:
                entry["error"] = f"unusable reply: {exc}"
                feedback = f"\n# Your previous reply could not be used\n{exc}\n"
                continue
            if stage == "B" and not no_host_collective_left(new):
                entry["error"] = "a host NCCL collective is still there"
                feedback = "\n# Your previous program still calls a host NCCL collective; stage B removes them all.\n"
                continue
            base.with_suffix(".cu").write_text(new)
            record = evaluate(base.with_suffix(".cu"))
            base.with_suffix(".record.json").write_text(json.dumps(record.to_dict(), indent=1))
            if record.ok:
                entry["ok"] = True
                code = new
                break
            entry["error"] = f"{record.failed_level}: {record.error}"
            try:
                verdict = await client.complete("You diagnose failed GPU programs briefly.", render(
                    "judge", language="cuda", code=new.rstrip(), error=entry["error"],
                    diagnostics=(record.diagnostics or "")[-3000:] or "none"), 0.2, 1024)
                entry["judge"] = verdict.text.strip()
            except LLMError as exc:
                entry["judge"] = f"(no diagnosis: {exc})"
            base.with_suffix(".judge.md").write_text(entry["judge"])
            feedback = (f"\n# Your previous program failed: {entry['error']}\n"
                        f"# A reviewer's diagnosis\n{entry['judge']}\n")
        else:
            (work_dir / "log.json").write_text(json.dumps([vars(x) for x in logs], indent=1))
            raise TransformFailed(f"stage {stage}: no correct program after {tries_per_stage} tries; last: "
                                  f"{log.tries[-1].get('error')}")
    (work_dir / "log.json").write_text(json.dumps([vars(x) for x in logs], indent=1))
    return code, logs
