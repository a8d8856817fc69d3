"""On GPUs: the GEMM+AllGather strategy kernel is correct at every design point it accepts. At world 2 where two GPUs
are present, else at world 1 (each point's code runs, its transfers only to itself)."""

from __future__ import annotations

import pytest

from conftest import GEMM_AG, gpu_count
from cuco.evolve.strategy import accepted_points, materialize, prebuild
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = [pytest.mark.gpu(1), pytest.mark.nvcc]
WORLD = max(1, min(2, gpu_count()))

SPEC = load_workload(GEMM_AG, WORLD)
POINTS = accepted_points(SPEC.strategies["ag_gemm"])


@pytest.fixture(scope="module", autouse=True)
def _prebuild(tmp_path_factory):
    """Compile every point at once: each test then pays only for its run."""
    prebuild(SPEC.strategies["ag_gemm"], tmp_path_factory.mktemp("points"))


@pytest.mark.parametrize("point", POINTS, ids=[p.label() for p in POINTS])
def test_strategy_point_is_correct(point, tmp_path):
    src = tmp_path / "candidate.cu"
    src.write_text(materialize(SPEC.strategies["ag_gemm"], point))
    rec = evaluate(SPEC, src, EvalOptions(device="cuda", max_level="L2", small_shapes=["s256", "s_odd"],
                                          gpus=list(range(WORLD)), timeout_s=60, work_dir=tmp_path / "w"))
    assert rec.ok, rec.error
