"""The slowest rank counts; the bound is max(compute alone, bytes over the measured peer bandwidth)."""

from __future__ import annotations

import pytest
from conftest import GEMM_AG, WORKLOADS

from cuco.runner.results.bounds import compute_bound
from cuco.runner.results.stats import slowest_rank, summarize
from cuco.workload import load_workload


def test_slowest_rank_per_iteration():
    assert slowest_rank([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_summary_median_and_spread():
    per_rank = [[float(i) for i in range(1, 12)], [0.5] * 11]
    s = summarize(per_rank)
    assert s["median_ms"] == 6.0 and s["min_ms"] == 1.0 and s["max_ms"] == 11.0
    assert s["p10_ms"] == 2.0 and s["p90_ms"] == 10.0
    assert s["spread_pct"] == pytest.approx(100 * 8 / 6)
    assert s["per_rank_median_ms"] == [6.0, 0.5]


def test_gpu_bound_uses_peer_bandwidth():
    spec = load_workload(GEMM_AG)
    b = compute_bound(spec, spec.shape("8k"), 2, "cuda", 0.68, 0.29, {"peer_bw_gbps": 368.0, "gemm_bf16_tflops": 800})
    assert b["comm_bytes"] == 4096 * 8192 * 2
    assert b["comm_ms"] == pytest.approx(4096 * 8192 * 2 / 368e9 * 1e3)
    assert b["bound_ms"] == 0.68  # compute-bound shape
    assert b["compute_floor_ms"] == pytest.approx(2 * 8192 * 8192 * 4096 / 800e12 * 1e3)


def test_cpu_bound_uses_measured_collective():
    spec = load_workload(GEMM_AG)
    b = compute_bound(spec, spec.shape("s256"), 2, "cpu", 0.1, 0.4, {})
    assert b["comm_ms"] == 0.4 and b["bound_ms"] == 0.4 and b["comm_source"] == "measured collective alone"


def test_world_size_changes_bytes():
    spec = load_workload(GEMM_AG, world_size=4)
    b = compute_bound(spec, spec.shape("8k"), 4, "cuda", 1.0, None, {"peer_bw_gbps": 100.0})
    assert b["comm_bytes"] == 3 * 2048 * 8192 * 2


def test_communication_that_follows_the_compute_adds_to_the_bound():
    """KV transfer: the last layer's K and V exist only once prefill is over, so their transfer comes after it."""
    spec = load_workload(WORKLOADS / "kv_transfer")
    b = compute_bound(spec, spec.shape("8k"), 2, "cuda", 5.0, None, {"peer_bw_gbps": 400.0})
    layer = 2 * 8192 * 8 * 128 * 2
    assert b["comm_bytes"] == 32 * layer
    assert b["serial_comm_ms"] == pytest.approx(layer / 400e9 * 1e3)
    assert b["bound_ms"] == pytest.approx(5.0 + layer / 400e9 * 1e3)


def test_communication_that_follows_the_compute_is_not_counted_twice_where_communication_dominates():
    """The part that follows the compute is part of the communication's own time: where the communication alone is
    the longer (here measured, the link's rate unknown), it is the bound, not itself plus that part again."""
    spec = load_workload(WORKLOADS / "kv_transfer")
    b = compute_bound(spec, spec.shape("8k"), 2, "cuda", 0.010, 0.020, {})
    assert b["serial_comm_ms"] == pytest.approx(0.020 / 32) and b["bound_ms"] == pytest.approx(0.020)
    b = compute_bound(spec, spec.shape("8k"), 2, "cuda", 0.030, 0.020, {})
    assert b["bound_ms"] == pytest.approx(0.030 + 0.020 / 32)


def test_a_cpu_bound_cached_from_a_busy_moment_is_measured_again_before_a_time_is_called_impossible(tmp_path):
    """The CPU's only limit is the library bound, cached once measured: one taken while the machine was busy (here
    planted: every cached time a hundred times over) is measured again, and an honest program passes."""
    import json

    from cuco.runner.cascade import EvalOptions, evaluate
    from cuco.runner.results.bounds import _cache_path, _workload_key

    spec = load_workload(WORKLOADS / "cpu_allgather_matmul")
    opts = EvalOptions(device="cpu", shapes=["tiny"], small_shapes=["odd"], warmup=1, iters=5, work_dir=tmp_path / "w")
    assert evaluate(spec, spec.candidates["seed"], opts).ok
    cache = _cache_path(spec, _workload_key(spec, "cpu"), spec.shape("tiny"), "cpu")
    honest = json.loads(cache.read_text())
    slow = {k: [[t * 100 for t in rank] for rank in v] if k.endswith("per_rank_ms") and v else v
            for k, v in honest.items()}
    cache.write_text(json.dumps(slow))
    rec = evaluate(spec, spec.candidates["seed"], opts)
    assert rec.ok, rec.error
    again = json.loads(cache.read_text())["compute_alone_per_rank_ms"]
    assert min(map(min, again)) < min(map(min, slow["compute_alone_per_rank_ms"])) / 10
