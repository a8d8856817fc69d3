"""The fast path's LLM loop against the fake provider: stage A, stage B, a try that does not compile (real
nvcc), a try that deadlocks, the judge's diagnosis fed to the next try, and everything kept on disk. On two
GPUs the deadlocking try runs through the real runner, which must kill the hung ranks; on the CPU, where CUDA
cannot run, a Python program that hangs the same way stands in for it, run for real on two CPU ranks."""

from __future__ import annotations

import asyncio

import pytest
from conftest import GEMM_AG, ROOT
from fake_llm import FakeLLM, Step

from cuco.fastpath.llm_loop import TransformFailed, llm_transform
from cuco.fastpath.rewrite import no_host_collective_left, rewrite
from cuco.llm import make_client
from cuco.llm.config import LLMConfig
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = pytest.mark.nvcc
SPEC = load_workload(GEMM_AG)
SEED = SPEC.seed_path.read_text()
DIRECTIVE = ('<directive>{"point": {"backend": "lsa", "placement": "deferred", "sync": "global", "issuer": "cta", '
             '"chunks": 1}, "text": "device all-gather through LSA windows, then the GEMM"}</directive>')
STAGE_A = SEED.replace('#include "cuco.h"', '#include "cuco.h"\n#include "cuco_collectives.cuh"') + (
    "\nCUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {\n"
    "  cuco::coll_requirements(reqs);\n}\n")
STAGE_A_BROKEN = STAGE_A.replace("coll_requirements(reqs)", "coll_requirementz(reqs)")
STAGE_B = rewrite(SPEC.seed_path, SPEC).code
STAGE_B_HANGS = STAGE_B.replace("#include \"cuco.h\"", "#include \"cuco.h\"\n// hangs: rank 1 skips the barrier")


def reply(code: str) -> Step:
    return Step(f"Here is the program.\n\n{DIRECTIVE}\n\n```cuda\n{code}```\n")


# Rank 0 waits in a barrier that rank 1 never enters: tests/faults/deadlock.py. Any limit gives a timeout; a
# short one keeps the suite fast.
CPU_HANG = ROOT / "tests" / "faults" / "deadlock.py"
CPU_HANG_LIMIT_S = 5.0


def run_to_l2(path, program, limit_s, **device):
    """`program` run for the try at `path` up to L2 on one small shape, killed after `limit_s`."""
    return evaluate(SPEC, program, EvalOptions(max_level="L2", small_shapes=["s_odd"], timeout_s=limit_s,
                                               work_dir=path.with_suffix(".work"), **device))


def evaluator(path):
    """Real L0 and nvcc build on this machine; the try marked as hanging runs as CPU_HANG on two CPU ranks."""
    if "hangs:" in path.read_text():
        return run_to_l2(path, CPU_HANG, CPU_HANG_LIMIT_S, device="cpu")
    return evaluate(SPEC, path, EvalOptions(device="cpu"))


# Rank 1 never launches the all-gather, so rank 0 waits at its LSA barrier for ever.
STAGE_B_DEADLOCKS = STAGE_B.replace("CUCO_CUDA(ctx, cuco::allGather(",
                                    "if (ctx->rank == 0) CUCO_CUDA(ctx, cuco::allGather(")
HANG_LIMIT_S = 30.0


def gpu_evaluator(path):
    return run_to_l2(path, path, HANG_LIMIT_S, device="cuda", gpus=[0, 1])


@pytest.mark.parametrize("where", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu(2))])
def test_stages_retries_and_judge(where, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    hangs, evaluate_try = (STAGE_B_HANGS, evaluator) if where == "cpu" else (STAGE_B_DEADLOCKS, gpu_evaluator)
    assert hangs != STAGE_B
    script = [reply(STAGE_A_BROKEN), Step("`cuco::coll_requirementz` does not exist: call coll_requirements."),
              reply(STAGE_A), reply(hangs),
              Step("Rank 1 never reaches the LSA barrier: every rank must launch the all-gather kernel."),
              reply(STAGE_B)]
    with FakeLLM(script, repeat_last=False) as fake:
        client = make_client(LLMConfig(base_url=fake.url, model="fake-model", max_retries=0))
        code, logs = asyncio.run(llm_transform(SPEC, SEED, client, evaluate_try, tmp_path))
    assert no_host_collective_left(code) and code == STAGE_B
    a, b = logs
    assert [t.get("ok", False) for t in a.tries] == [False, True]
    assert "L1" in a.tries[0]["error"] and "coll_requirementz" in a.tries[0]["judge"]
    assert [t.get("ok", False) for t in b.tries] == [False, True] and "timeout" in b.tries[0]["error"]
    assert "killed every rank" in b.tries[0]["error"]
    prompts = [r["body"]["messages"][0]["content"] for r in fake.requests]
    assert "coll_requirementz` does not exist" in prompts[2]  # the judge's diagnosis reached the next try
    assert "never reaches the LSA barrier" in prompts[5]
    for name in ("stageA-try1.prompt.md", "stageA-try1.reply.md", "stageA-try1.judge.md", "stageB-try2.cu",
                 "stageB-try2.record.json", "log.json"):
        assert (tmp_path / name).is_file(), name


def test_stage_b_must_remove_host_collectives(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    with FakeLLM([reply(STAGE_A), reply(STAGE_A)]) as fake:  # stage B keeps answering with stage A's program
        client = make_client(LLMConfig(base_url=fake.url, model="fake-model", max_retries=0))
        with pytest.raises(TransformFailed, match="stage B: no correct program after 2 tries"):
            asyncio.run(llm_transform(SPEC, SEED, client, evaluator, tmp_path, tries_per_stage=2))


def test_cli_hands_what_the_rules_cannot_do_to_the_llm(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    seed = tmp_path / "seed_choice.cu"  # the receive buffer chosen by a condition: the rules cannot place it
    seed.write_text(SEED.replace("ncclAllGather(a->ptr, aFull->ptr,",
                                 "ncclAllGather(a->ptr, ctx->nRanks > 1 ? aFull->ptr : a->ptr,"))
    with FakeLLM([reply(STAGE_A), reply(STAGE_B)], repeat_last=False) as fake:
        cfg = tmp_path / "run.toml"
        cfg.write_text(f'[llm]\nprovider = "openai_compatible"\nmodel = "coder"\nbase_url = "{fake.url}/v1"\n'
                       'max_retries = 0\n')
        out = tmp_path / "t.cu"
        proc = subprocess.run([sys.executable, "-m", "cuco", "transform", "gemm_allgather", "--source", str(seed),
                               "--llm", "--config", str(cfg), "--out", str(out), "--device", "cpu"], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 4, proc.stdout + proc.stderr  # written and built; verifying it needs 2 GPUs
    assert "the rules stop here" in proc.stdout and "stage B: correct after 1 tries" in proc.stdout
    assert out.read_text() == STAGE_B and (tmp_path / "llm" / "log.json").is_file()
