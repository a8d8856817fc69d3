"""Evolve-block annotation of the fast path's output, and a search that starts from it."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import GEMM_AG, ROOT

from cuco.evolve.config import RunConfig
from cuco.evolve.run import Evolution
from cuco.evolve.slots import Slot
from cuco.fastpath.analyze import analyze
from cuco.fastpath.annotate import annotate
from cuco.fastpath.pipeline import TransformError, transform
from cuco.fastpath.rewrite import rewrite
from cuco.program.blocks import evolve_blocks, frozen_parts
from cuco.runner.build.static_checks import check_source
from cuco.workload import load_workload

AR = ROOT / "cuco" / "builtin" / "allreduce_sum"
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
def test_the_pipeline_returns_an_annotated_program_that_builds(tmp_path):
    """fastpath.pipeline.transform, as `cuco transform` calls it: the analysis in, a typed result out."""
    spec = load_workload(AR)
    result = transform(spec, analyze(spec.seed_path), tmp_path / "t.cu")
    assert result.build.ok and result.record is None and result.rules_stopped is None
    assert result.rewrites == ["line 9: ncclAllReduce -> cuco::allReduce<__nv_bfloat16>"], result.rewrites
    assert result.evolve_blocks == len(evolve_blocks(result.code)) > 0 and result.target.read_text() == result.code
    assert "cuco_dev_requirements" in "".join(frozen_parts(result.code))


def test_the_pipeline_stops_with_one_line_where_the_rules_stop(tmp_path):
    wl = AR.parent / "alltoallv_bf16"
    with pytest.raises(TransformError, match=r"seed.cu: the ncclSend of line 35 sends `out` and the ncclRecv of line "
                                              r"36 receives `in`"):
        transform(load_workload(wl), analyze(wl / "seed.cu"), tmp_path / "t.cu")
    assert not (tmp_path / "t.cu").exists()


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
    assert first.code == start.read_text() and evo.db.count("done") == 3
    assert first.label == "start: transformed.cu" and json.loads(first.directive)["point"] is None  # no design point
    evo.db.close()


@pytest.mark.nvcc
def test_a_program_that_does_not_build_is_not_rewritten(tmp_path):
    """Its own compiler error, at its own line, and nothing written: not an error in the rewritten file."""
    spec = load_workload(AR)
    src = tmp_path / "seed.cu"
    src.write_text(spec.seed_path.read_text().replace("return 0;\n}", "return undeclared_name;\n}", 1))
    with pytest.raises(TransformError, match=r"seed.cu: the program does not build as it is, so it is not "
                                             r"rewritten: .*seed.cu\(\d+\): error: identifier \"undeclared_name\""):
        transform(spec, analyze(src), tmp_path / "out" / "t.cu")
    assert not (tmp_path / "out" / "t.cu").exists()
