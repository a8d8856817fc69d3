"""Planted cheats on GPUs (tests/anticheat/ and the CUDA fault template): each caught at a named level, with the
static checks on and off. At world 2 where two GPUs are present, else at world 1 (no communication, the same
judge)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import GEMM_AG, ROOT, gpu_count

from cuco.runner import cascade
from cuco.runner.build import nvcc as build_mod
from cuco.runner.build.static_checks import StaticReport
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

CHEATS = ROOT / "tests" / "anticheat"
TEMPLATE = ROOT / "tests" / "faults" / "gpu_faults.cu.in"

pytestmark = [pytest.mark.gpu(1), pytest.mark.nvcc]


def _world() -> int:
    return min(2, gpu_count())


def _eval(src, tmp_path, shapes=("4k",), **kw):
    world = _world()
    opts = EvalOptions(device="cuda", shapes=list(shapes), small_shapes=["s_odd"], warmup=2, iters=10,
                       gpus=list(range(world)), timeout_s=120, work_dir=tmp_path / "w", **kw)
    return evaluate(load_workload(GEMM_AG, world), src, opts)


@pytest.fixture
def no_static_checks(monkeypatch):
    """The runtime alone: L0 passes everything, and L1 builds without its checks."""
    monkeypatch.setattr(cascade, "check_source", lambda path: StaticReport(True, []))
    monkeypatch.setattr(cascade, "check_and_build",
                        lambda path, includes=(): (build_mod.build(path, includes=includes), []))


def _fault(name: str, tmp_path):
    path = tmp_path / f"{name}.cu"
    path.write_text(f"#define CUCO_FAULT_{name.upper()}\n" + TEMPLATE.read_text())
    return path


def _assert_caught(rec, level, words):
    assert not rec.ok, "a cheat passed"
    assert rec.failed_level in level.split("|"), rec.error
    assert any(w in rec.error for w in words), rec.error


def test_forged_event_times_are_caught_by_the_judges_clock(tmp_path, no_static_checks):
    rec = _eval(CHEATS / "forged_events.py", tmp_path, shapes=("8k",))
    _assert_caught(rec, "L4", ["the candidate's process reported"])


def test_forged_event_times_are_caught_statically(tmp_path):
    _assert_caught(_eval(CHEATS / "forged_events.py", tmp_path), "L0", ["forbidden"])


# The first run may still see that work finished (the candidate's first cuBLAS call loads its kernels, which waits
# for the whole device); a later run does not, and no longer agrees with it.
OUTSIDE = ["NaN/Inf", "two runs on the same inputs differ"]


def test_python_work_on_a_stream_of_its_own_is_not_in_the_snapshot(tmp_path, no_static_checks):
    _assert_caught(_eval(CHEATS / "own_stream.py", tmp_path), "L2", OUTSIDE)


def test_no_shared_memory_files_are_left_behind(tmp_path):
    shm = set(Path("/dev/shm").iterdir())
    spec = load_workload(GEMM_AG, _world())
    assert _eval(spec.candidates["torch_host"], tmp_path, max_level="L2").ok
    assert set(Path("/dev/shm").iterdir()) - shm == set()


@pytest.mark.parametrize("name", ["own_stream", "late_thread"])
def test_cuda_work_outside_the_timed_region_is_caught(name, tmp_path, no_static_checks):
    _assert_caught(_eval(_fault(name, tmp_path), tmp_path), "L2", OUTSIDE)


@pytest.mark.parametrize("name,word", [("own_stream", "cudaStreamCreate"), ("late_thread", "thread")])
def test_cuda_work_outside_the_timed_region_is_caught_statically(name, word, tmp_path):
    rec = _eval(_fault(name, tmp_path), tmp_path)
    _assert_caught(rec, "L1", [word])


@pytest.mark.parametrize("name", ["seed", "device_lsa", "torch_host"])
def test_honest_candidates_pass_with_the_clocks_agreeing(name, tmp_path):
    spec = load_workload(GEMM_AG, _world())
    rec = _eval(spec.candidates[name], tmp_path)
    assert rec.ok, rec.error
    t = rec.shapes["4k"].timing
    assert t.clock["ok"] and t.judge_median_ms >= t.median_ms
    assert "Landlock" in rec.sandbox


@pytest.mark.parametrize("spin", [False, True], ids=["no_spin", "spin"])
def test_work_in_the_gap_before_the_clock_is_caught(tmp_path, no_static_checks, spin):
    """The GEMM done by a thread of the candidate's own between the runner's poisoning and the clock's start: the
    inputs are not there yet (sealed until the gate opens), so what it computes is the previous run's."""
    src = tmp_path / "gap.py"
    src.write_text((CHEATS / "gpu_work_in_the_gap.py").read_text().replace("SPIN = False", f"SPIN = {spin}"))
    # A thread that spins on the inputs may finish a small shape's GEMM, on its own stream, before the snapshot:
    # that work is inside the run and right, and the full shape's is not (L3).
    _assert_caught(_eval(src, tmp_path, shapes=("8k",)), "L2|L3", ["out of tolerance"])


def test_no_way_out_of_the_sandbox_on_a_gpu(tmp_path, no_static_checks):
    """On GPU machines cuco runs as root: the candidate runs under a uid of its own, with every door shut."""
    _assert_caught(_eval(CHEATS / "escape_the_sandbox.py", tmp_path), "L2", ["NaN/Inf"])


def test_skipped_timed_runs_are_caught(tmp_path, no_static_checks):
    """Every timed run is verified: a candidate that does no work on half of them, blind, fails every time."""
    _assert_caught(_eval(CHEATS / "skip_half_the_runs.py", tmp_path), "L4", ["timed run"])


def test_the_candidate_never_holds_root(tmp_path):
    spec = load_workload(GEMM_AG, _world())
    rec = _eval(spec.candidates["torch_host"], tmp_path, max_level="L2")
    assert rec.ok, rec.error
    assert not rec.sandbox.startswith("uid 0"), rec.sandbox
    if os.geteuid() == 0:  # as GPU machines run cuco: a uid of the evaluation's own
        assert "the evaluation's own" in rec.sandbox, rec.sandbox
