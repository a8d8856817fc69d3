"""On GPUs: every strategy kernel of every built-in workload is correct, and its results bitwise deterministic run to
run (the judge's determinism check), at every design point it accepts, on the workload's small and odd shapes
(CUDA strategies, and Python ones that move data between GPUs themselves). At
world 2 where two GPUs are present, else at world 1 (each point's code runs, its transfers only to itself)."""

from __future__ import annotations

import pytest
from conftest import WORKLOADS, gpu_count

from cuco.evolve.strategy import materialize, prebuild
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = [pytest.mark.gpu(1), pytest.mark.nvcc]
WORLD = max(1, min(2, gpu_count()))

SPECS = {p.parent.name: load_workload(p.parent, WORLD) for p in sorted(WORKLOADS.glob("*/workload.toml"))}
GPU_BACKENDS = {"lsa", "ce", "gin"}  # a Python strategy with one of these moves data between GPUs itself
POINTS_PER_GROUP = 12  # a worker's share of a strategy: compiled together, evaluated one after another
# Every point to run, and its group: its strategy and the dozen of that strategy's points it falls in.
CASES, GROUPS = [], []
for wl, spec in SPECS.items():
    for name, strategy in spec.strategies.items():
        if strategy.path.suffix == ".cu" or GPU_BACKENDS & set(strategy.accepts["backend"]):
            for j, point in enumerate(strategy.points()):
                CASES.append((wl, name, point))
                GROUPS.append(f"{wl}-{name}-{j // POINTS_PER_GROUP}")


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """Compiles a group of a strategy's points at once (nvcc in parallel) the first time one of them is run: each
    test then pays only for its run, and a selection (-k) compiles only the groups it runs. With --dist loadgroup
    a group's points run on one xdist worker, so each group is compiled once."""
    done: set[str] = set()

    def build(group: str) -> None:
        if group not in done:
            cases = [case for case, g in zip(CASES, GROUPS) if g == group]
            wl, name, _ = cases[0]
            prebuild(SPECS[wl].strategies[name], tmp_path_factory.mktemp(group), points=[p for _, _, p in cases])
            done.add(group)

    return build


@pytest.mark.parametrize("wl,name,point,group", [pytest.param(*case, group, marks=pytest.mark.xdist_group(group))
                                                 for case, group in zip(CASES, GROUPS)],
                         ids=[f"{wl}-{name}-{p.label()}" for wl, name, p in CASES])
def test_strategy_point_is_correct(wl, name, point, group, tmp_path, prebuilt):
    prebuilt(group)
    spec = SPECS[wl]
    src = tmp_path / f"candidate{spec.strategies[name].path.suffix}"
    src.write_text(materialize(spec.strategies[name], point))
    rec = evaluate(spec, src, EvalOptions(device="cuda", max_level="L2",
                                          small_shapes=[s.name for s in spec.small_shapes],
                                          gpus=list(range(WORLD)), timeout_s=60, work_dir=tmp_path / "w"))
    assert rec.ok, rec.error


NEEDS_TOO_MUCH = """#include "cuco.h"
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) {{ {needs} }}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {{ CUCO_FAIL(ctx, "cuco_setup ran"); }}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {{ return 0; }}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {{ return 0; }}
"""


@pytest.mark.parametrize("needs,reason", [
    ("needs->sideStreams = 4;", "needs 4 side streams; the runner gives 2"),
    ('cuco_need_symmetric(needs, "b");', "needs buffer b symmetric"),
    ('cuco_need_symmetric(needs, "nope");', "needs buffer nope, which the workload does not have"),
    ("needs->lsaTeam = 1;", "exports no cuco_dev_requirements"),
])
def test_a_need_the_run_cannot_meet_fails_with_its_reason_before_setup(needs, reason, tmp_path):
    spec = SPECS["gemm_allgather"]
    src = tmp_path / "needy.cu"
    src.write_text(NEEDS_TOO_MUCH.format(needs=needs))
    rec = evaluate(spec, src, EvalOptions(device="cuda", max_level="L2", small_shapes=[spec.small_shapes[0].name],
                                          gpus=list(range(WORLD)), timeout_s=60, work_dir=tmp_path / "w"))
    assert not rec.ok and reason in rec.error and "cuco_setup ran" not in rec.error, rec.error
