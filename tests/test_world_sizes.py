"""Beyond two ranks: the runner at world sizes 4 and 8 (CPU ranks on gloo here; GPUs where a box has them)."""

from __future__ import annotations

import pytest
from conftest import GEMM_AG, ROOT
from faults.expectations import assert_caught

from cuco.evolve.strategy import materialize
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

CPU_EXAMPLE = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"


@pytest.mark.parametrize("world", [4, 8])
def test_cpu_example_seed_and_strategy_pass_at_world(world, tmp_path):
    spec = load_workload(CPU_EXAMPLE, world)
    strategy = spec.strategies["overlap"]
    point = strategy.points()[-1]
    src = tmp_path / "strategy.py"
    src.write_text(materialize(strategy, point))
    # At 8 ranks on a small machine each evaluation is slow: the strategy there, both at 4.
    for cand in (spec.seed_path, src) if world == 4 else (src,):
        rec = evaluate(spec, cand, EvalOptions(device="cpu", shapes=["tiny"], small_shapes=["odd"], warmup=1, iters=3,
                                                    work_dir=tmp_path / cand.stem))
        assert rec.ok, rec.error
        assert rec.world == world
        timing = rec.shapes["tiny"].timing
        assert len(timing.per_rank_ms) == world  # every rank timed; the slowest counts


def test_wrong_values_on_one_of_four_ranks_are_caught_and_named(tmp_path):
    spec = load_workload(GEMM_AG, 4)
    rec = evaluate(spec, ROOT / "tests" / "faults" / "wrong_rank1.py",
                   EvalOptions(device="cpu", shapes=["s256"], small_shapes=["s_odd"], work_dir=tmp_path))
    assert_caught("wrong_rank1", rec)
    assert "rank 2:" not in rec.error and "rank 3:" not in rec.error


def test_a_world_that_does_not_divide_a_shape_is_one_clear_error():
    from cuco.errors import CucoError

    with pytest.raises(CucoError,
                       match=r"buffers.a.shape at shape '8k', world 3: M / world = 8192 / 3 does not divide"):
        load_workload(GEMM_AG, 3)


SHIPPED = sorted(load_workload(GEMM_AG).candidates)


@pytest.mark.nvcc
@pytest.mark.parametrize("world", [pytest.param(w, marks=pytest.mark.gpu(w)) for w in (4, 8)])
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_candidates_are_correct_on_gpus_at_world(name, world, tmp_path):
    spec = load_workload(GEMM_AG, world)
    rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", max_level="L2", gpus=list(range(world)),
                                                            timeout_s=120, work_dir=tmp_path))
    assert rec.ok, rec.error
