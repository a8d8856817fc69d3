"""On GPUs: the shipped CUDA candidates pass, and planted CUDA faults are caught at their level."""

from __future__ import annotations

import time

import pytest
from conftest import GEMM_AG, ROOT
from faults.expectations import assert_caught

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

TEMPLATE = ROOT / "tests" / "faults" / "gpu_faults.cu.in"
GPU_FAULTS = ["no_compile", "deadlock", "crash_rank1", "wrong_rank1", "partial_output", "nan_output", "skips_work"]
DEADLOCK_LIMIT_S = 30.0

pytestmark = [pytest.mark.gpu(2), pytest.mark.nvcc]


def _opts(**kw) -> EvalOptions:
    base = dict(device="cuda", shapes=["s256"], small_shapes=["s_odd"], warmup=2, iters=10, gpus=[0, 1])
    base.update(kw)
    return EvalOptions(**base)


def fault_source(name: str, directory) -> object:
    path = directory / f"{name}.cu"
    path.write_text(f"#define CUCO_FAULT_{name.upper()}\n" + TEMPLATE.read_text())
    return path


@pytest.mark.parametrize("name", GPU_FAULTS)
def test_planted_cuda_fault_is_caught(name, tmp_path):
    spec = load_workload(GEMM_AG)
    t0 = time.monotonic()
    rec = evaluate(spec, fault_source(name, tmp_path), _opts(timeout_s=DEADLOCK_LIMIT_S, work_dir=tmp_path / "w"))
    elapsed = time.monotonic() - t0
    assert_caught(name, rec)
    if name == "deadlock":
        assert elapsed < DEADLOCK_LIMIT_S + 30


def test_a_hung_candidate_is_stopped_seconds_after_its_last_progress(tmp_path):
    """The deadlock again, under the workload's own limit (300 s): its first run's step limit stops it."""
    from cuco.runner.processes.progress import FIRST_RUN_LIMIT_S

    t0 = time.monotonic()
    rec = evaluate(load_workload(GEMM_AG), fault_source("deadlock", tmp_path), _opts(work_dir=tmp_path / "w"))
    assert not rec.ok and rec.fault == "candidate" and "marked no progress" in rec.error, rec.error
    assert time.monotonic() - t0 < FIRST_RUN_LIMIT_S + 45


def test_fault_template_without_fault_is_correct(tmp_path):
    spec = load_workload(GEMM_AG)
    path = tmp_path / "clean.cu"
    path.write_text(TEMPLATE.read_text())
    rec = evaluate(spec, path, _opts(work_dir=tmp_path / "w"))
    assert rec.ok, rec.error


@pytest.mark.parametrize("name", ["seed", "host_two_stream", "device_lsa", "torch_async_tp", "torch_host"])
def test_shipped_candidates_correct_on_small_shapes(name, tmp_path):
    spec = load_workload(GEMM_AG)
    rec = evaluate(spec, spec.candidates[name], _opts(max_level="L2", small_shapes=["s256", "s_odd"],
                                                      work_dir=tmp_path))
    assert rec.ok, rec.error
    assert rec.level_reached == "L2"
