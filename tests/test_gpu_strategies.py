"""On GPUs: the GEMM+AllGather strategy kernel is correct at every design point it accepts."""

from __future__ import annotations

import pytest

from conftest import GEMM_AG
from cuco.evolve.strategy import accepted_points, materialize, prebuild
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = [pytest.mark.gpu(2), pytest.mark.nvcc]

SPEC = load_workload(GEMM_AG)
POINTS = accepted_points(SPEC.strategies["ag_gemm"])


@pytest.fixture(scope="module", autouse=True)
def _prebuild(tmp_path_factory):
    """Compile every point at once: each test then pays only for its run."""
    prebuild(SPEC.strategies["ag_gemm"], tmp_path_factory.mktemp("points"))


@pytest.mark.parametrize("point", POINTS, ids=[p.label() for p in POINTS])
def test_strategy_point_is_correct(point, tmp_path):
    src = tmp_path / "candidate.cu"
    src.write_text(materialize(SPEC.strategies["ag_gemm"], point))
    rec = evaluate(SPEC, src, EvalOptions(device="cuda", max_level="L2", small_shapes=["s256", "s_odd"], gpus=[0, 1],
                                          timeout_s=60, work_dir=tmp_path / "w"))
    assert rec["ok"], rec["error"]
