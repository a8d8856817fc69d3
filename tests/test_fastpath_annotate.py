"""Evolve-block annotation of the fast path's output, and a search that starts from it."""

from __future__ import annotations

import asyncio

import pytest

from conftest import GEMM_AG, ROOT
from cuco.evolve.config import RunConfig
from cuco.program.blocks import evolve_blocks, frozen_parts
from cuco.evolve.run import Evolution
from cuco.evolve.slots import Slot
from cuco.fastpath.annotate import annotate
from cuco.fastpath.rewrite import rewrite
from cuco.runner.build import build
from cuco.runner.static_checks import check_source
from cuco.workload import load_workload

AR = ROOT / "cuco" / "workloads" / "allreduce_sum"
TWO_STREAM = GEMM_AG / "candidates" / "host_two_stream.cu"


def test_entry_point_signatures_stay_frozen(tmp_path):
    out = annotate((AR / "seed.cu").read_text())
    frozen = "".join(frozen_parts(out))
    for sig in ("int cuco_setup(cuco_ctx_t* ctx) {", "int cuco_run(cuco_ctx_t* ctx) {",
                "int cuco_teardown(cuco_ctx_t* ctx) {", '#include "cuco.h"'):
        assert sig in frozen
    assert len(evolve_blocks(out)) == 3
    path = tmp_path / "a.cu"
    path.write_text(out)
    assert check_source(path).ok


def test_kernels_state_and_bodies_become_blocks(tmp_path):
    out = annotate(TWO_STREAM.read_text())
    blocks = [out[b.start:b.end] for b in evolve_blocks(out)]
    assert any("struct State" in b for b in blocks) and any("ncclGroupStart" in b for b in blocks)
    assert "cuco_dev_requirements" not in "".join(blocks)
    path = tmp_path / "b.cu"
    path.write_text(out)
    assert check_source(path).ok


@pytest.mark.nvcc
def test_annotated_rewrite_builds(tmp_path):
    spec = load_workload(AR)
    path = tmp_path / "t.cu"
    path.write_text(annotate(rewrite(spec.seed_path, spec).code))
    assert build(path).ok and "cuco_dev_requirements" in "".join(frozen_parts(path.read_text()))


def test_window_allocation_and_release_stay_frozen(tmp_path):
    out = annotate(rewrite(ROOT / "tests" / "fastpath" / "host_allreduce_scratch.cu", load_workload(AR)).code)
    frozen = "".join(frozen_parts(out))
    assert "cuco::symmetricAlloc(ctx, (void**)&s->scratch" in frozen and "cuco::symmetricFree(ctx, s->scratch" in frozen
    blocks = "".join(out[b.start:b.end] for b in evolve_blocks(out))
    assert "ctx->state = s;" in blocks and "cuco::allReduce" in blocks and "symmetric" not in blocks
    path = tmp_path / "c.cu"
    path.write_text(out)
    assert check_source(path).ok


def test_already_annotated_is_unchanged():
    seed = (GEMM_AG / "seed.cu").read_text()
    assert annotate(seed) == seed


def test_search_starts_from_the_transformed_program(tmp_path):
    from test_evolve_run import fake_evaluator

    spec = load_workload(GEMM_AG)
    start = tmp_path / "transformed.cu"
    start.write_text(annotate(rewrite(spec.seed_path, spec).code))
    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape, cfg.search.start = 3, "8k", str(start)
    evo = Evolution(spec, cfg, tmp_path / "run", [Slot(0, ())], fake_evaluator, "cuda")
    asyncio.run(evo.run())
    first = evo.db.all()[0]
    assert first.code == start.read_text() and first.label is None and evo.db.count("done") == 3
    evo.db.close()
