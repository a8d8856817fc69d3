"""The KV-transfer workload on CPUs: its reference, a host-driven program verified against it, and the judge
catching a program that writes pool pages the block table does not name."""

from __future__ import annotations

import torch
from conftest import WORKLOADS

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload
from cuco.workload.reference import load_reference

ROOT = WORKLOADS / "kv_transfer"


def test_the_reference_fills_the_named_pages_and_nothing_else():
    ref = load_reference(load_workload(ROOT))
    p = load_workload(ROOT).shape("s_odd").params  # 37 tokens: two full pages and 5 slots of a third
    inputs = [{**ref.make_inputs(p, 2, r, torch.Generator().manual_seed(r), "cpu"),
               **ref.make_parameters(p, 2, r, torch.Generator().manual_seed(10 + r), "cpu")} for r in range(2)]
    prefill, decode = (ref.reference(p, 2, r, inputs)["pool"] for r in range(2))
    assert prefill.isnan().all()  # the prefill rank's pool is never written
    table = inputs[1]["block_table"].long()
    assert len(set(table.tolist())) == 3 and table.max() < p["POOL"]
    x = inputs[0]["x"].float()
    k2, v2 = x @ inputs[0]["wk"][2].float(), x @ inputs[0]["wv"][2].float()
    assert torch.allclose(decode[2, table[1], :16], k2[16:32]) and torch.allclose(decode[2, table[1], 16:], v2[16:32])
    assert torch.allclose(decode[2, table[2], :5], k2[32:]) and decode[2, table[2], 5:16].isnan().all()
    unnamed = [q for q in range(p["POOL"]) if q not in table.tolist()]
    assert decode[:, unnamed].isnan().all()


def test_the_host_program_is_correct_and_a_write_outside_the_named_pages_is_caught(tmp_path):
    spec = load_workload(ROOT)
    opts = dict(device="cpu", max_level="L2", small_shapes=["s_odd"], timeout_s=120)
    rec = evaluate(spec, spec.candidates["torch_host"], EvalOptions(**opts, work_dir=tmp_path / "honest"))
    assert rec.ok, rec.error
    # The same program, but it clears the whole pool first, as a careless one might.
    src = spec.candidates["torch_host"].read_text()
    careless = tmp_path / "clears_pool.py"
    careless.write_text(src.replace("    decode, page = ctx.world - 1, p[\"PAGE\"]\n",
                                    "    decode, page = ctx.world - 1, p[\"PAGE\"]\n    pool.zero_()\n"))
    rec = evaluate(spec, careless, EvalOptions(**opts, work_dir=tmp_path / "careless"))
    assert not rec.ok and rec.failed_level == "L2"
    assert "pool" in rec.error and "must be left untouched" in rec.error

