"""Planted faults as Python candidates, run for real on 2 CPU ranks (gloo): each caught at its level."""

from __future__ import annotations

import time

import pytest
from conftest import GEMM_AG, ROOT
from faults.expectations import FAULTS, assert_caught

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

FAULT_DIR = ROOT / "tests" / "faults"
DEADLOCK_LIMIT_S = 20.0


def _opts(**kw) -> EvalOptions:
    base = dict(device="cpu", shapes=["s256"], small_shapes=["s_odd"], warmup=1, iters=5)
    base.update(kw)
    return EvalOptions(**base)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_planted_fault_is_caught(name, tmp_path):
    spec = load_workload(GEMM_AG)
    t0 = time.monotonic()
    rec = evaluate(spec, FAULT_DIR / f"{name}.py", _opts(timeout_s=DEADLOCK_LIMIT_S, work_dir=tmp_path))
    elapsed = time.monotonic() - t0
    assert_caught(name, rec)
    if name == "deadlock":
        # Every rank killed within the limit (plus start-up and the kill itself).
        assert elapsed < DEADLOCK_LIMIT_S + 15
        assert "rank 0:" in rec.error and "rank 1:" in rec.error


# The work on its first call; on every later one, a wait for a message no rank sends.
WAITS_FOR_A_MESSAGE = """
import torch
import torch.distributed as dist
calls = [0]
def run(ctx):
    calls[0] += 1
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    if calls[0] > 1:
        dist.recv(c, src=(ctx.rank + 1) % ctx.world, group=ctx.group)
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
"""


def test_a_candidate_that_hangs_is_stopped_seconds_after_its_last_progress(tmp_path):
    """Not at the end of the evaluation's whole limit (the workload's 300 s): its run step's limit after it."""
    from cuco.runner.processes.progress import RUN_FLOOR_S

    src = tmp_path / "waits_for_a_message.py"
    src.write_text(WAITS_FOR_A_MESSAGE)
    t0 = time.monotonic()
    rec = evaluate(load_workload(GEMM_AG), src, _opts(max_level="L2", work_dir=tmp_path / "w"))
    elapsed = time.monotonic() - t0
    assert not rec.ok and rec.failed_level == "L2" and rec.fault == "candidate", rec.error
    assert f"marked no progress for {RUN_FLOOR_S:.0f} s in 'L2 s_odd trial 0: determinism run'" in rec.error
    assert elapsed < RUN_FLOOR_S + 20, elapsed


def test_host_driven_python_candidate_passes_on_two_cpu_ranks(tmp_path):
    spec = load_workload(GEMM_AG)
    rec = evaluate(spec, spec.candidates["torch_host"], _opts(small_shapes=["s256", "s_odd"], work_dir=tmp_path))
    assert rec.ok, rec.error
    assert rec.level_reached == "L4"
    s = rec.shapes["s256"]
    assert [c.level for c in s.correctness] == ["L2", "L3"]
    assert rec.shapes["s_odd"].correctness[0].level == "L2"
    t = s.timing
    assert len(t.per_rank_ms) == 2 and all(len(r) == 5 for r in t.per_rank_ms)
    assert t.median_ms >= max(min(r) for r in t.per_rank_ms)  # the slowest rank counts
    assert s.bound.bound_ms > 0 and 0 < s.efficiency
    assert s.correctness[0].max_norm_rel_err < 0.01


def test_fresh_inputs_every_evaluation(tmp_path):
    spec = load_workload(GEMM_AG)
    seeds = {evaluate(spec, spec.candidates["torch_host"], _opts(max_level="L2", work_dir=tmp_path / str(i))).seed
             for i in range(2)}
    assert len(seeds) == 2


def test_candidate_exception_is_reported_as_its_error(tmp_path):
    src = tmp_path / "raises.py"
    src.write_text("def run(ctx):\n    if ctx.rank == 1:\n        raise ValueError('bad tile size 7')\n")
    rec = evaluate(load_workload(GEMM_AG), src, _opts(work_dir=tmp_path / "w"))
    assert not rec.ok and rec.failed_level == "L2"
    assert rec.error.startswith("candidate error: rank 1") and "ValueError: bad tile size 7" in rec.error
