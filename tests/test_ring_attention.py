"""The ring-attention workload: its fp32 reference against torch's causal attention, the host-driven rings (gloo
send/recv, cuco.kernels.attention's blocks and log-sum-exp merges) against the reference on CPUs, the bound's
compute doing the rings' whole work, and the rings on a GPU (cuDNN's blocks, the fused merge)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import WORKLOADS, gpu_count

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.runner.judge.verify import compare
from cuco.workload import load_workload
from cuco.workload.contract import RankView
from cuco.workload.reference import load_reference

ROOT = WORKLOADS / "ring_attention"


def test_the_reference_is_causal_gqa_attention_with_its_log_sum_exp():
    """At world 1 the zig-zag chunks are the sequence in order: plain causal attention over it."""
    ref = load_reference(load_workload(ROOT))
    p = {"S": 40, "H": 4, "KV": 2, "D": 16}
    inputs = [ref.make_inputs(p, 1, 0, torch.Generator().manual_seed(1), "cpu")]
    got = ref.reference(p, 1, 0, inputs)
    q = inputs[0]["q"].float().transpose(0, 1)  # [H, S, D]
    k, v = (inputs[0][n].float().transpose(0, 1).repeat_interleave(2, dim=0) for n in ("k", "v"))
    scores = q @ k.transpose(1, 2) / math.sqrt(p["D"])
    scores.masked_fill_(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(scores, -1) @ v
    assert torch.allclose(got["o"].transpose(0, 1), want, atol=1e-5)
    assert torch.allclose(got["lse"], torch.logsumexp(scores, -1), atol=1e-5)


def test_the_host_rings_match_the_reference():
    """The seed (exchange, then attention) at worlds 2 and 4; the pipelined ring (attention while the next block
    travels) at world 2."""
    for world, name in ((2, "seed"), (4, "seed"), (2, "host_pipeline")):
        spec = load_workload(ROOT, world)
        rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cpu", max_level="L2", small_shapes=["s96"]))
        assert rec.ok, (world, name, rec.error)


def test_each_output_is_held_to_its_own_tolerance():
    """o's atol follows each row's size, lse is held tight: bf16 rounding of a row over few keys passes, a row's
    log-sum-exp that left out 1% of its keys does not."""
    spec = load_workload(ROOT)
    o_tol, lse_tol = spec.tolerance_for("o"), spec.tolerance_for("lse")
    assert (o_tol.atol_scale, o_tol.rtol) == ("row", spec.tolerance.rtol)
    few_keys = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 0.001]])  # a row averaging few keys
    ref = torch.cat([few_keys, torch.full((99, 8), 0.01)])  # and many rows averaging thousands
    out = ref.clone()
    out[0, 7] += 0.008  # two bf16 steps at the size of that row's values
    assert not compare("o", out, ref, o_tol.rtol, o_tol.atol, o_tol.norm_rtol).ok  # rms of the whole: too tight
    assert compare("o", out, ref, o_tol.rtol, o_tol.atol, o_tol.norm_rtol, o_tol.atol_scale).ok
    lse = torch.full((4, 64), math.log(8192.0))
    args = (lse_tol.rtol, lse_tol.atol, lse_tol.norm_rtol, lse_tol.atol_scale)
    assert compare("lse", lse + 1e-5, lse, *args).ok
    assert not compare("lse", lse + math.log(1 - 0.01), lse, *args).ok


def test_the_ring_push_strategy_matches_the_reference_on_nccl_host(tmp_path):
    """The strategy's attention plan and log-sum-exp merges on CPUs (its ce backend needs GPUs), at world 2: the ring
    piece by piece, and the gathered blocks (rank 0's last query chunk sees the peer's whole block: one call)."""
    from cuco.designspace.directive import DesignPoint
    from cuco.evolve.strategy import materialize

    spec = load_workload(ROOT, 2)
    for point in (DesignPoint("nccl_host", "stream_overlap", "chunk", "cta", 2),
                  DesignPoint("nccl_host", "deferred", "global", "cta", 1)):
        src = tmp_path / f"ring_push_{point.placement}.py"
        src.write_text(materialize(spec.strategies["ring_push"], point))
        rec = evaluate(spec, src, EvalOptions(device="cpu", max_level="L2", small_shapes=["s96"]))
        assert rec.ok, (point.label(), rec.error)


def test_the_bounds_compute_is_the_rings_whole_work():
    """compute_alone attends every block and merges it, as the rings do: on every rank its outputs are the
    reference's, so the library bound times all of the work a program must do."""
    spec = load_workload(ROOT, 2)
    ref = load_reference(spec)
    p = {"S": 96, "H": 8, "KV": 2, "D": 64}
    gen = torch.Generator().manual_seed(3)
    inputs = [ref.make_inputs(p, 2, r, gen, "cpu") for r in range(2)]
    for rank in range(2):
        bufs = {**{n: t.clone() for n, t in inputs[rank].items()},
                "o": torch.full_like(inputs[rank]["q"], float("nan")), "lse": torch.full((8, 48), float("nan"))}
        ref.compute_alone(RankView(p, 2, rank, inputs, bufs))()
        want = ref.reference(p, 2, rank, inputs)
        for name in ("o", "lse"):
            tol = spec.tolerance_for(name)
            assert compare(name, bufs[name], want[name], tol.rtol, tol.atol, tol.norm_rtol, tol.atol_scale).ok, name


@pytest.mark.gpu(1)
@pytest.mark.nvcc
def test_the_host_rings_match_the_reference_on_gpus(tmp_path):
    """The seed and the pipelined ring on GPUs (cuDNN's blocks, the fused merge) at the small and odd shapes: at
    world 2 where two GPUs are present, else at world 1 (every block of the sequence on one rank)."""
    world = max(1, min(2, gpu_count()))
    spec = load_workload(ROOT, world)
    for name in ("seed", "host_pipeline"):
        rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", max_level="L2", gpus=list(range(world)),
                                                                timeout_s=120, work_dir=tmp_path / name))
        assert rec.ok, (name, rec.error)
