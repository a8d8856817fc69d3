"""The fast path end to end, as a library: analysis → rules (or the LLM loop where they stop) → evolve blocks →
re-analysis → nvcc build → verification on GPUs. The `cuco transform` command only prints what this returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.errors import CucoError
from cuco.fastpath.analyze import Analysis
from cuco.fastpath.annotate import annotate
from cuco.fastpath.llm_loop import StageLog, TransformFailed, llm_transform
from cuco.fastpath.rewrite import RewriteError, no_host_collective_left, rewrite
from cuco.llm import LLMClient
from cuco.program.blocks import evolve_blocks
from cuco.runner.build.nvcc import BuildResult, build, first_error
from cuco.runner.build.toolchain import find_toolchain
from cuco.runner.results.record import EvalRecord
from cuco.workload.spec import WorkloadSpec

Evaluator = Callable[[Path], EvalRecord]  # a program file -> its evaluation record (verified at L3)


class TransformError(CucoError):
    """The fast path stopped: the rules could not rewrite (and no LLM was allowed), or its output is unusable."""


@dataclass
class LLMFallback:
    """Where the rules stop, an LLM writes the program in two stages, each verified by EVALUATE."""

    client: LLMClient
    evaluate: Evaluator
    tries: int = 3
    machine: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 16000


@dataclass
class TransformResult:
    analysis: Analysis
    target: Path
    code: str
    evolve_blocks: int
    build: BuildResult
    rewrites: list[str] = field(default_factory=list)  # what the rules replaced; empty when the LLM wrote it
    rules_stopped: str | None = None  # why the rules could not rewrite, when the LLM loop did
    llm_stages: list[StageLog] = field(default_factory=list)
    record: EvalRecord | None = None  # the verification on GPUs; None where there are none


def transform(spec: WorkloadSpec, analysis: Analysis, target: Path, llm: LLMFallback | None = None,
              verify: Evaluator | None = None) -> TransformResult:
    """Build the analysed program as it is (its own errors, its own line numbers), rewrite it into TARGET, build
    that and, given VERIFY, run it at L3."""
    source = Path(analysis.path)
    if source.is_file() and not find_toolchain().missing():  # without nvcc the rewritten build says what is missing
        given = build(source, includes=spec.includes)
        if not given.ok:
            raise TransformError(str(source), "the program does not build as it is, so it is not rewritten: "
                                 + first_error(given.log))
    if target.is_dir():
        raise CucoError(str(target), "a folder: --out names the file the rewritten program goes to")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CucoError(str(target.parent), f"cannot make the folder (--out): {exc.strerror or exc}") from None
    rewrites, stopped, stages = [], None, []
    try:
        rw = rewrite(analysis, spec)
        code, rewrites = rw.code, rw.replaced
    except RewriteError as exc:
        if llm is None:
            raise TransformError(analysis.path, str(exc)) from None
        stopped = str(exc)
        try:
            code, stages = asyncio.run(llm_transform(spec, analysis.source.decode(), llm.client, llm.evaluate,
                                                     target.parent / "llm", llm.tries, llm.machine, llm.max_tokens))
        except TransformFailed as failed:
            raise TransformError(str(target.parent / "llm"), str(failed)) from None
    code = annotate(code)
    try:
        target.write_text(code)
    except OSError as exc:
        raise CucoError(str(target), f"cannot write the rewritten program (--out): {exc.strerror or exc}") from None
    if not no_host_collective_left(code):
        raise TransformError(str(target), "re-analysis still finds a host NCCL call")
    built = build(target, includes=spec.includes)
    if not built.ok:
        raise TransformError(str(target), "the rewritten program does not build: " + first_error(built.log))
    return TransformResult(analysis, target, code, len(evolve_blocks(code)), built, rewrites, stopped, stages,
                           verify(target) if verify is not None else None)
