"""The typed evaluation record: its JSON is the layout records always had, and records written before the type
existed (or by a newer tree, with keys this one does not know) still load."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from cuco.runner.cascade import EvalOptions, evaluate, save_record
from cuco.runner.results.record import Bound, Correctness, EvalRecord, ShapeResult, Timing
from cuco.workload import load_workload

CPU_EXAMPLE = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"

# The keys, in order, of the dict the cascade built before the record was typed.
TOP_KEYS = ["workload", "candidate", "candidate_name", "language", "sha256", "world", "device", "started", "ok",
            "level_reached", "failed_level", "error", "diagnostics", "shapes", "env"]
TIMING_KEYS = ["median_ms", "p10_ms", "p90_ms", "min_ms", "max_ms", "spread_pct", "iters", "per_rank_median_ms",
               "gated", "note", "per_rank_ms", "verified_runs", "final_output_errors", "clock_errors",
               "judge_median_ms", "clock", "inputs_ms", "null_median_ms", "null_per_rank_ms"]
BOUND_KEYS = ["compute_ms", "compute_floor_ms", "comm_ms", "comm_source", "comm_bytes", "flops", "bound_ms",
              "hbm_bytes", "inputs_bytes"]


@pytest.fixture(scope="module")
def cpu_record(tmp_path_factory) -> EvalRecord:
    """A real CPU evaluation of the example's seed, L0 to L4, on its small shapes (seconds)."""
    spec = load_workload(CPU_EXAMPLE)
    rec = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", shapes=["tiny"], small_shapes=["odd"], warmup=1,
                                                     iters=3, work_dir=tmp_path_factory.mktemp("w")))
    assert rec.ok, rec.error
    return rec


def test_a_real_record_round_trips_and_keeps_the_json_layout(cpu_record, tmp_path):
    d = cpu_record.to_dict()
    assert list(d)[:len(TOP_KEYS)] == TOP_KEYS
    assert list(d)[len(TOP_KEYS):] == ["work_dir", "seconds", "seed", "sandbox"]
    assert list(d["shapes"]) == ["odd", "tiny"]
    assert list(d["shapes"]["odd"]) == ["params", "correctness"]
    tiny = d["shapes"]["tiny"]
    assert list(tiny) == ["params", "correctness", "timing", "references_ms", "bound", "efficiency", "beats_library"]
    assert list(tiny["timing"]) == TIMING_KEYS and list(tiny["bound"]) == BOUND_KEYS
    assert list(tiny["correctness"][0]) == ["level", "trials", "max_norm_rel_err"]
    again = EvalRecord.from_dict(json.loads(json.dumps(d)))
    assert again == cpu_record and again.to_dict() == d
    assert isinstance(again.shapes["tiny"].timing, Timing) and isinstance(again.shapes["tiny"].bound, Bound)
    assert isinstance(again.shapes["odd"].correctness[0], Correctness)
    assert again.median_ms("tiny") == d["shapes"]["tiny"]["timing"]["median_ms"]
    assert again.bound_ms("tiny") == d["shapes"]["tiny"]["bound"]["bound_ms"]
    assert again.median_ms("odd") is None and again.bound_ms("absent") is None
    path = save_record(cpu_record, tmp_path / "r.json")
    assert json.loads(path.read_text()) == d


def test_every_timed_run_is_verified_and_the_runners_floor_recorded(cpu_record):
    """Each of the three timed runs checked; runs that do nothing timed on every rank, at least five of them, their
    median (the slowest rank's) below the candidate's, which does work."""
    from cuco.runner.cascade import null_floor_ms
    from cuco.runner.judge.candidate import NULL_RUNS

    t = cpu_record.shapes["tiny"].timing
    assert t.verified_runs == [0, 1, 2]
    assert len(t.null_per_rank_ms) == 2 and all(len(r) == NULL_RUNS for r in t.null_per_rank_ms)
    assert 0 < t.null_median_ms < t.median_ms
    assert null_floor_ms(t, "cpu")[1] == t.null_median_ms


def test_unknown_keys_are_ignored_at_every_level(cpu_record):
    d = cpu_record.to_dict()
    d["from_a_newer_tree"] = 1
    d["shapes"]["tiny"]["new_shape_key"] = {"x": 1}
    d["shapes"]["tiny"]["timing"]["p99_ms"] = 1.0
    d["shapes"]["tiny"]["bound"]["memory_ms"] = 2.0
    d["shapes"]["odd"]["correctness"][0]["seed"] = 3
    assert EvalRecord.from_dict(d) == cpu_record


def test_a_record_written_before_the_type_loads():
    """By hand, with the keys the cascade's dict had: a failed CUDA candidate and a timed Python one, as the
    baselines files, records directories and SQLite stores hold them."""
    old = {
        "workload": "gemm_allgather", "candidate": "/x/torch_host.py", "candidate_name": "torch_host",
        "language": "python", "sha256": "ab" * 32, "world": 2, "device": "cpu", "started": "2026-01-01T00:00:00+00:00",
        "ok": True, "level_reached": "L4", "failed_level": None, "error": None, "diagnostics": "",
        "shapes": {"s256": {
            "params": {"M": 256, "K": 128, "N": 64},
            "correctness": [{"level": "L2", "trials": 3, "max_norm_rel_err": 0.001}],
            "timing": {"median_ms": 2.0, "p10_ms": 1.5, "p90_ms": 2.5, "min_ms": 1.4, "max_ms": 3.0,
                       "spread_pct": 50.0, "iters": 5, "per_rank_median_ms": [1.9, 2.0], "gated": False,
                       "note": "CPU", "per_rank_ms": [[2.0] * 5, [2.0] * 5], "verified_runs": [0, 4],
                       "final_output_errors": [], "clock_errors": [], "judge_median_ms": 2.1, "clock": None},
            "references_ms": {"compute_alone": 1.0, "compute_alone_min": 0.9},
            "bound": {"compute_ms": 0.9, "compute_floor_ms": None, "comm_ms": None,
                      "comm_source": "measured collective alone", "comm_bytes": 1e6, "flops": 4e6, "bound_ms": 0.9},
            "efficiency": 0.45, "speedup": {"nccl": 1.2}}},
        "env": {"torch": "2.5"}, "nccl_env": {"NCCL_PROTO": "Simple"}, "seconds": 4.2, "seed": None, "sandbox": "",
        "note": "a note",
    }
    rec = EvalRecord.from_dict(json.loads(json.dumps(old)))
    assert rec.ok and rec.median_ms("s256") == 2.0 and rec.bound_ms("s256") == 0.9
    assert rec.shapes["s256"].speedup == {"nccl": 1.2} and rec.nccl_env == {"NCCL_PROTO": "Simple"}
    assert rec.to_dict() == old and list(rec.to_dict()) == list(old)
    failed = {k: old[k] for k in TOP_KEYS} | {"ok": False, "level_reached": "L0", "failed_level": "L1",
                                              "error": "nvcc build failed", "shapes": {},
                                              "build": {"cached": False, "seconds": 3.0}}
    rec = EvalRecord.from_dict(failed)
    assert not rec.ok and rec.build == {"cached": False, "seconds": 3.0} and rec.to_dict() == failed


def test_a_record_that_stored_its_language_as_kind_loads_with_it():
    stored = {"workload": "w", "candidate": "/x/seed.cu", "candidate_name": "seed", "kind": "cuda", "ok": False}
    rec = EvalRecord.from_dict(stored)
    assert rec.language == "cuda" and "kind" not in rec.to_dict() and rec.to_dict()["language"] == "cuda"


def test_a_shape_without_baselines_has_no_speedup_key_and_an_empty_one_survives():
    s = ShapeResult(params={"M": 1}, timing=Timing(median_ms=1.0), references_ms={})
    assert "speedup" not in s.to_dict() and s.to_dict()["references_ms"] == {}
    s.speedup = {}
    assert ShapeResult.from_dict(s.to_dict()).speedup == {}


def test_a_rank_report_reads_back_what_the_judge_wrote():
    """The judge's report and the launcher's reading of it are one type: every kind of stage comes back as the class
    it was written as, and a report cut short (a judge that died early) reads as fewer stages, not an error."""
    from cuco.runner.results.rank_report import BoundsStage, CorrectnessStage, RankReport, TimingStage

    stages = [CorrectnessStage("L2", "s", 2, 1e-3),
              TimingStage("s", True, "", [1, 4], [[1.0, 1.1]], [[1.2, 1.3]], [0.01], [], [], {"ok": True}),
              BoundsStage("s", comm_alone_per_rank_ms=[[0.5]])]
    report = RankReport(1, stages, done=True, sandbox="landlock", seed=7)
    assert RankReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert stages[2].times() == {"comm_alone_per_rank_ms": [[0.5]]}
    partial = RankReport.from_json({"rank": 0, "stages": [report.to_json()["stages"][0]], "unknown": 1})
    assert partial.stages == stages[:1] and not partial.done and partial.error is None
