"""On GPUs: every strategy kernel of every built-in workload is correct, and its results bitwise deterministic run to
run (the judge's determinism check), at every design point it accepts, on the workload's small and odd shapes
(CUDA strategies, and Python ones that move data between GPUs themselves). At
world 2 where two GPUs are present, else at world 1 (each point's code runs, its transfers only to itself)."""

from __future__ import annotations

import pytest
from conftest import WORKLOADS, gpu_count

from cuco.evolve.strategy import accepted_points, materialize, prebuild
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = [pytest.mark.gpu(1), pytest.mark.nvcc]
WORLD = max(1, min(2, gpu_count()))

SPECS = {p.parent.name: load_workload(p.parent, WORLD) for p in sorted(WORKLOADS.glob("*/workload.toml"))}
GPU_BACKENDS = {"lsa", "ce", "gin"}  # a Python strategy with one of these moves data between GPUs itself
CASES = [(wl, name, point) for wl, spec in SPECS.items() for name, strategy in spec.strategies.items()
         if strategy.path.suffix == ".cu" or GPU_BACKENDS & set(strategy.accepts["backend"])
         for point in accepted_points(strategy)]


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """Compiles all of a strategy's points at once (nvcc in parallel) the first time one is run: each test then
    pays only for its run, and a selection (-k) compiles only the strategies it runs."""
    done: set[tuple[str, str]] = set()

    def build(wl: str, name: str) -> None:
        if (wl, name) not in done:
            prebuild(SPECS[wl].strategies[name], tmp_path_factory.mktemp(f"{wl}-{name}"))
            done.add((wl, name))

    return build


@pytest.mark.parametrize("wl,name,point", CASES, ids=[f"{wl}-{name}-{p.label()}" for wl, name, p in CASES])
def test_strategy_point_is_correct(wl, name, point, tmp_path, prebuilt):
    prebuilt(wl, name)
    spec = SPECS[wl]
    src = tmp_path / f"candidate{spec.strategies[name].path.suffix}"
    src.write_text(materialize(spec.strategies[name], point))
    rec = evaluate(spec, src, EvalOptions(device="cuda", max_level="L2",
                                          small_shapes=[s.name for s in spec.small_shapes],
                                          gpus=list(range(WORLD)), timeout_s=60, work_dir=tmp_path / "w"))
    assert rec.ok, rec.error
