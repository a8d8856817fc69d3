"""The CUDA programs shipped with the workloads built around communication (KV transfer, the MoE layer), each
correct at every shape on the GPUs. Every shipped program is built and checked on CPUs by test_cuda_checks.py;
the collectives' are verified on GPUs by test_fastpath_rewrite.py, the strategy kernels by
test_gpu_strategies.py."""

from __future__ import annotations

import pytest
from conftest import WORKLOADS, gpu_count

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

PROGRAMS = [(wl, name) for wl in ("kv_transfer", "moe_deepseek_v3")
            for name, path in sorted(load_workload(WORKLOADS / wl).candidates.items()) if path.suffix == ".cu"]
IDS = [f"{wl}/{name}" for wl, name in PROGRAMS]


@pytest.mark.gpu(1)
@pytest.mark.nvcc
@pytest.mark.parametrize("wl,name", PROGRAMS, ids=IDS)
def test_the_program_is_correct_on_gpus(wl, name, tmp_path):
    """Every shape, L3: at world 2 where two GPUs are present, else at world 1 (transfers to the rank itself)."""
    world = max(1, min(2, gpu_count()))
    spec = load_workload(WORKLOADS / wl, world)
    rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", max_level="L3", gpus=list(range(world)),
                                                            work_dir=tmp_path / "w"))
    assert rec.ok, rec.error
