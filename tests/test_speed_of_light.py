"""The speed of light: every shipped workload's hbm_bytes against an independent count, and the bound from the
machine's ceilings (flops, HBM and link terms; the serial part added to the compute's side only)."""

from __future__ import annotations

import math
import sys

import pytest
from conftest import ROOT, WORKLOADS

from cuco.dtypes import DTYPES
from cuco.runner.results.bounds import compute_bound, speed_of_light
from cuco.workload import load_workload
from cuco.workload.expr import eval_expr
from cuco.workload.registry import builtin_names

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# Workloads whose least HBM traffic is not "every input read once, every output written once": one rank's work
# differs from another's, or the data decide how much of a buffer is touched.
SPECIAL = {"alltoallv_bf16", "kv_transfer", "moe_deepseek_v3"}
CEILINGS = {"ceilings": {"tensor_bf16_tflops": {"value": 800.0}, "hbm_read_gbps": {"value": 3000.0},
                         "hbm_write_gbps": {"value": 3200.0}, "hbm_copy_gbps": {"value": 2900.0},
                         "link_both_ways_gbps": {"value": 400.0}}}


def _declared_bytes(spec, shape) -> int:
    env = shape.env(spec.world_size)
    return sum(math.prod(eval_expr(d, env) for d in b.shape) * DTYPES[b.dtype].size
               for b in spec.buffers.values() if b.role in ("input", "parameter", "output"))


def test_every_shipped_workload_states_its_hbm_bytes():
    names = builtin_names()
    assert len(names) >= 13
    for name in names:
        assert load_workload(WORKLOADS / name).bounds.hbm_bytes != "0", name
    tutorial = tomllib.loads((ROOT / "examples" / "tutorial" / "workload.toml").read_text())
    assert tutorial["bounds"]["hbm_bytes"] != "0"


@pytest.mark.parametrize("name", sorted(set(builtin_names()) - SPECIAL))
def test_hbm_bytes_are_the_inputs_and_outputs_declared(name):
    spec = load_workload(WORKLOADS / name)
    for shape in spec.shapes + spec.small_shapes:
        assert eval_expr(spec.bounds.hbm_bytes, shape.env(spec.world_size)) == _declared_bytes(spec, shape), shape


def test_hbm_bytes_of_the_special_workloads_by_hand():
    kv = load_workload(WORKLOADS / "kv_transfer")
    env = kv.shape("32k").env(2)
    decode = env["L"] * 2 * env["S"] * env["KV"] * env["D"] * 2 + -(-env["S"] // env["PAGE"]) * 4
    prefill = env["S"] * env["HID"] * 2 + 2 * env["L"] * env["HID"] * env["KV"] * env["D"] * 2
    assert eval_expr(kv.bounds.hbm_bytes, env) == max(decode, prefill) == decode
    moe = load_workload(WORKLOADS / "moe_deepseek_v3")
    env = moe.shape("t128").env(2)
    weights = 128 * (7168 * 2 * 2048 + 2048 * 7168) * 2  # 128 local experts' w13 and w2, bf16
    assert eval_expr(moe.bounds.hbm_bytes, env) == weights + 128 * 7168 * 2 * 2 + 128 * 256 * 4
    assert 11.2e9 < weights < 11.4e9
    a2a = load_workload(WORKLOADS / "alltoallv_bf16")
    env = a2a.shapes[0].env(2)
    assert eval_expr(a2a.bounds.hbm_bytes, env) == env["N"] // 2 * 2 + 2 * 8 + env["N"] * 2


def test_speed_of_light_takes_the_largest_term_and_counts_nothing_twice():
    # 1.6 GFLOP at 800 TFLOP/s = 2 us; 32 MB at the fastest HBM rate (3200 GB/s) = 10 us; 8 MB at 400 GB/s = 20 us
    sol = speed_of_light(1.6e9, 32e6, 8e6, 0.0, CEILINGS)
    assert sol["hbm_ms"] == pytest.approx(0.010) and sol["speed_of_light_ms"] == pytest.approx(0.020)
    # 2 MB of the 8 can only leave once the compute is over: 10 + 5 us, still under the link's 20
    assert speed_of_light(1.6e9, 32e6, 8e6, 2e6, CEILINGS)["speed_of_light_ms"] == pytest.approx(0.020)
    # with the link four times as fast the serial part shows: 10 us of HBM, then 1.25 us of the last bytes
    fast = {"ceilings": {**CEILINGS["ceilings"], "link_both_ways_gbps": {"value": 1600.0}}}
    assert speed_of_light(1.6e9, 32e6, 8e6, 2e6, fast)["speed_of_light_ms"] == pytest.approx(0.01125)
    assert speed_of_light(1.6e9, 32e6, 8e6, 0.0, {}) == {}  # no ceilings measured: no speed of light


def test_the_record_carries_both_bounds_on_gpus_only():
    spec = load_workload(WORKLOADS / "gemm_allgather")
    shape = spec.shape("8k")
    gpu = compute_bound(spec, shape, 2, "cuda", 0.68, None, {**CEILINGS, "peer_bw_gbps": 368.0})
    assert gpu["bound_ms"] == pytest.approx(0.68)  # the library bound: cuBLAS's time
    flops, hbm = eval_expr(spec.bounds.flops, shape.env(2)), eval_expr(spec.bounds.hbm_bytes, shape.env(2))
    inputs = 8192 // 2 * 8192 * 2  # A's rows of this rank, bf16: written into its buffer inside every run
    assert gpu["inputs_bytes"] == inputs
    assert gpu["speed_of_light_ms"] == pytest.approx(max(flops / 800e12, (hbm + 2 * inputs) / 3200e9,
                                                         67108864 / 400e9) * 1e3)
    cpu = compute_bound(spec, shape, 2, "cpu", 0.68, 0.3, CEILINGS)
    assert "speed_of_light_ms" not in cpu and cpu["hbm_bytes"] == hbm


def test_a_library_bound_under_the_speed_of_light_is_refused_with_the_term_it_misses():
    """A library cannot beat the machine: a compute alone that leaves out the GEMM its flops count (a workload whose
    reference times only the elementwise kernels) is refused, and the record says which term and by how much."""
    spec = load_workload(WORKLOADS / "gemm_allgather")
    shape, machine = spec.shape("8k"), {**CEILINGS, "peer_bw_gbps": 368.0}
    light = compute_bound(spec, shape, 2, "cuda", 0.68, None, machine)["speed_of_light_ms"]
    fine = compute_bound(spec, shape, 2, "cuda", light * 0.97, None, machine)  # within the ceilings' slack
    assert fine["bound_ms"] is not None and "library_refused" not in fine
    short = compute_bound(spec, shape, 2, "cuda", 0.01, None, machine)
    assert short["bound_ms"] is None and short["speed_of_light_ms"] == pytest.approx(light)
    assert short["library_refused"].startswith(f"the library bound {short['comm_ms']:.4f} ms is under the speed of "
                                               f"light {light:.4f} ms: compute alone (0.0100 ms: reference.py's")
    assert "communication alone" not in short["library_refused"]
    assert "library_refused" not in compute_bound(spec, shape, 2, "cpu", 0.01, 0.3, machine)


def test_a_refused_library_bound_fails_the_evaluation_as_the_workloads_fault():
    from cuco.runner.cascade import EvalOptions, _l4_problems
    from cuco.runner.results.record import Bound, EvalRecord, ShapeResult, Timing

    spec = load_workload(WORKLOADS / "gemm_allgather")
    shape = ShapeResult(timing=Timing(median_ms=1.0), bound=Bound(
        speed_of_light_ms=0.9, library_refused="the library bound 0.1000 ms is under the speed of light 0.9000 ms"))
    record = EvalRecord(workload=spec.name, candidate="c.cu", shapes={"8k": shape})
    problems, fault = _l4_problems(spec, record, EvalOptions(device="cuda"))
    assert fault == "workload"
    assert problems == ["shape 8k: no physical bound (the library bound 0.1000 ms is under the speed of light "
                        "0.9000 ms); a time without its bound is not reported"]


def _judged(device: str, median: float, library: float, light: float | None):
    """The L4 verdict on one shape timed at `median`, with a library bound and (on GPUs) a speed of light."""
    from cuco.runner.cascade import EvalOptions, _l4_problems
    from cuco.runner.results.record import Bound, EvalRecord, ShapeResult, Timing

    spec = load_workload(WORKLOADS / "gemm_allgather")
    shape = ShapeResult(timing=Timing(median_ms=median), bound=Bound(bound_ms=library, speed_of_light_ms=light),
                        efficiency=library / median, beats_library=median < library)
    record = EvalRecord(workload=spec.name, candidate="c.cu", shapes={"8k": shape})
    problems, _ = _l4_problems(spec, record, EvalOptions(device=device))
    return problems, shape


def test_beating_the_library_is_a_finding_and_only_the_speed_of_light_rejects():
    # 20% under cuBLAS's time, above the speed of light: a finding, marked, not a rejection
    problems, shape = _judged("cuda", median=0.80, library=1.00, light=0.70)
    assert problems == [] and shape.beats_library
    # 10% under the speed of light (the slack is 5%): work was skipped, or the clock is wrong
    problems, _ = _judged("cuda", median=0.63, library=1.00, light=0.70)
    assert len(problems) == 1 and problems[0].startswith("impossible: shape 8k median 0.6300 ms is below the speed "
                                                         "of light 0.7000 ms")
    # within the slack of the speed of light: noise, not fraud
    assert _judged("cuda", median=0.68, library=1.00, light=0.70)[0] == []


def test_where_no_ceilings_were_measured_the_library_bound_stands_in_on_the_cpu_alone():
    problems, _ = _judged("cpu", median=0.20, library=1.00, light=None)  # the CPU's slack: 72%, from its noise
    assert len(problems) == 1 and "below the library bound (no speed of light measured here)" in problems[0]
    assert _judged("cpu", median=0.50, library=1.00, light=None)[0] == []
    # a GPU whose ceilings were never measured: a decode program 25% under cuBLAS + NCCL alone is a finding
    problems, shape = _judged("cuda", median=0.030, library=0.040, light=None)
    assert problems == [] and shape.beats_library


def _against_null(device: str, times: list[float], null: list[float], work: bool = True,
                  bound: float | None = None) -> list[str]:
    """The L4 verdict on two ranks timed `times` (and, a little faster, 0.9x), beside null runs timed `null`, with a
    bound well below both (so that only the null runs can make the time impossible), yet above the noise's margin:
    0.1 ms on the CPU, 5 us on GPUs, unless `bound` says."""
    bound = bound if bound is not None else 0.1 if device == "cpu" else 0.005
    from cuco.runner.cascade import EvalOptions, _l4_problems
    from cuco.runner.results.record import Bound, EvalRecord, ShapeResult, Timing
    from cuco.runner.results.stats import summarize

    spec = load_workload(WORKLOADS / "gemm_allgather")
    per_rank = [times, [0.9 * x for x in times]]
    amounts = dict(flops=1e6, hbm_bytes=1e4, comm_bytes=1e4) if work else dict(flops=0.0, hbm_bytes=0.0, comm_bytes=0)
    timing = Timing(**summarize(per_rank), per_rank_ms=per_rank, null_per_rank_ms=[null, null],
                    null_median_ms=summarize([null])["median_ms"])
    shape = ShapeResult(timing=timing, bound=Bound(bound_ms=bound, **amounts))
    return _l4_problems(spec, EvalRecord(workload=spec.name, candidate="c.py", shapes={"s": shape}),
                        EvalOptions(device=device))[0]


def test_a_time_within_noise_of_a_run_that_does_nothing_is_impossible():
    null = [0.14, 0.15, 0.13, 0.16, 0.14, 0.15, 0.14, 0.30, 0.14, 0.15]  # sigma 0.0074 ms (MAD 0.005), one outlier
    # the null runs' own times: a program that did nothing
    problems = _against_null("cpu", null, null)
    assert problems == ["impossible: shape s median 0.1450 ms is within noise of a run that does nothing (0.1450 ms)"]
    # calling a run() that returns at once costs a little: still nothing (the CPU's floor, 0.03 ms)
    assert _against_null("cpu", [x + 0.02 for x in null], null)
    # an honest program's work (0.25 ms of a gloo collective) clears it, however noisy its own runs
    assert _against_null("cpu", [0.40, 0.41, 0.39, 2.0, 0.42, 0.40, 0.38, 0.45, 5.0, 0.40], null) == []
    # on GPUs (a floor of 2 us) the spread decides: 3 standard errors of two medians of 10 runs at sigma 0.0074 ms,
    # 0.0125 ms
    assert _against_null("cuda", [x + 0.01 for x in null], null, bound=0.05)
    assert _against_null("cuda", [x + 0.015 for x in null], null, bound=0.05) == []
    # a workload with nothing to do (no flops, no bytes) is not judged by it; nor a record without null runs
    assert _against_null("cpu", null, null, work=False) == []
    assert _against_null("cpu", null, []) == []


def test_null_runs_that_all_read_the_same_leave_the_floor():
    null = [0.0100] * 8  # GPU events of runs that only receive their inputs: no spread at all
    assert _against_null("cuda", [0.0115] * 8, null)  # 1.5 us above: within the events' four ticks
    assert _against_null("cuda", [0.0125] * 8, null) == []


def test_null_runs_too_noisy_to_tell_work_from_none_judge_nothing():
    """A busy CPU: null runs spread over milliseconds, so their margin is longer than the least time the work takes
    (the bound); honest programs measured there, as fast as the null runs or faster, are not called impossible."""
    null = [1.4, 2.5, 1.1, 3.0, 1.6, 2.2, 1.3, 2.8, 1.5, 2.4]
    assert _against_null("cpu", [1.6, 2.2, 1.5, 2.0, 1.9, 2.6, 1.2, 2.1, 1.7, 2.3], null, bound=0.084) == []
    assert _against_null("cpu", null, null, bound=0.084) == []  # nor can it tell nothing from work there
    assert _against_null("cpu", null, null, bound=5.0)  # where the work would take longer than the noise, it can
