"""The knobs of a rewritten program (cuco/fastpath/knobs.py) on the fast path's corpus: what is offered for each
program, every offered point passes the static checks and builds with nvcc, a collective is never put beside a
kernel the analysis cannot prove apart from it, nor its GEMM cut where the cut is not proven (planted programs), and
on one GPU every point is correct."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, WORKLOADS

from cuco.evolve.strategy import materialize, prebuild
from cuco.fastpath.analyze import analyze
from cuco.fastpath.knobs import CE_CTAS, CTAS, EVERY_PEER, GROUP, ISSUERS, MAX_SITES, PIECES, derive
from cuco.runner.build.nvcc import build
from cuco.runner.build.static_checks import check_source
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

HERE = ROOT / "tests" / "fastpath"
OVERLAP = "stream_overlap"
# Placements, and sync chunk: an all-gather whose GEMM reads it, or a reduce-scatter or all-reduce whose GEMM writes
# it, by pieces.
CHUNKED = ("deferred", OVERLAP, "chunk")
# program -> (workload, source, the placements offered per collective, in program order, then "chunk" where its
# consumer is cut into pieces).
PROGRAMS = {
    "typed_pointers": ("allreduce_sum", HERE / "corpus" / "typed_pointers.cu", [("deferred",)]),
    "two_halves": ("allreduce_sum", HERE / "corpus" / "two_halves.cu", [("deferred",), ("deferred",)]),
    "buffer_table": ("sendrecv_ring", HERE / "corpus" / "buffer_table.cu", [("deferred",)]),
    "gemm_rs_scratch": ("gemm_reducescatter", HERE / "corpus" / "gemm_rs_scratch.cu", [CHUNKED]),
    "gemm_ar_macros": ("gemm_allreduce", HERE / "corpus" / "gemm_ar_macros.cu", [CHUNKED]),
    "inplace_allgather": ("allgather_bf16", HERE / "corpus" / "inplace_allgather.cu", [("deferred",)]),
    "pairwise_loop": ("alltoall_bf16", HERE / "corpus" / "pairwise_loop.cu", [("deferred",)]),
    "own_block_loop": ("alltoall_bf16", HERE / "corpus" / "own_block_loop.cu", [("deferred",)]),
    "host_allreduce_scratch": ("allreduce_sum", HERE / "host_allreduce_scratch.cu", [("deferred",)]),
    "host_halo_exchange": ("sendrecv_ring", HERE / "host_halo_exchange.cu", [("deferred",)]),
    "overlap_beside": ("allgather_bf16", HERE / "knobs" / "overlap_beside.cu", [("deferred", OVERLAP)]),
    "gather_gemm_ex": ("gemm_allgather", HERE / "knobs" / "gather_gemm_ex.cu", [CHUNKED]),
    "gemm_ar_ex": ("gemm_allreduce", HERE / "knobs" / "gemm_ar_ex.cu", [CHUNKED]),
    **{f"{wl}_seed": (wl, WORKLOADS / wl / "seed.cu", [CHUNKED])
       for wl in ("gemm_allgather", "gemm_reducescatter", "gemm_allreduce")},
    **{f"{wl}_seed": (wl, WORKLOADS / wl / "seed.cu", [("deferred",)])
       for wl in ("allreduce_sum", "reducescatter_sum", "allgather_bf16", "alltoall_bf16", "sendrecv_ring")},
}
COPIES = ("ncclAllGather", "ncclAlltoAll", GROUP, EVERY_PEER)  # what the copy engine can move


def _knobs(name, world=None):
    wl, src, _ = PROGRAMS[name]
    spec = load_workload(WORKLOADS / wl, world)
    return spec, derive(analyze(src), spec)


def _points(name, tmp_path, world=None):
    """(strategy, point, materialised file) for every point the program's derived strategies accept."""
    spec, knobs = _knobs(name, world)
    out = []
    for sname, strategy in knobs.strategies(tmp_path / "derived", spec).items():
        for point in strategy.points():
            path = tmp_path / f"{sname}-{point.label().replace('/', '_')}.cu"
            path.write_text(materialize(strategy, point))
            out.append((strategy, point, path))
    return spec, out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_knobs_offered_for_each_program(name, tmp_path):
    spec, knobs = _knobs(name)
    assert [o.placements + (("chunk",) if "chunk" in o.syncs else ()) for o in knobs.offers] == PROGRAMS[name][2]
    for o in knobs.offers:
        assert (OVERLAP in o.placements) == (OVERLAP not in o.why_not), o
        assert ("chunk" in o.syncs) == ("sync chunk" not in o.why_not), o
        assert o.copies == (o.name in COPIES)
    overlapped = any(OVERLAP in o.placements for o in knobs.offers)
    chunked = any("chunk" in o.syncs for o in knobs.offers)
    copies = any(o.copies for o in knobs.offers)
    assert knobs.accepts["placement"] == (("deferred", OVERLAP) if overlapped else ("deferred",))
    assert knobs.accepts["backend"] == (("lsa", "ce") if copies else ("lsa",))
    # Per CTA count: every issuer at deferred, at stream_overlap, and at sync chunk with each count of pieces; the
    # copy engine (issuer cta) at deferred and at stream_overlap, once.
    placements = 1 + overlapped
    assert knobs.points() == len(CTAS) * len(ISSUERS) * (placements + chunked * len(PIECES)) + copies * placements
    # the number `cuco transform --explain` states is the number of points the search is given
    assert knobs.points() == sum(len(s.points()) for s in knobs.strategies(tmp_path, spec).values())
    assert all(line for line in knobs.explain())


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_offered_point_passes_the_static_checks(name, tmp_path):
    _, points = _points(name, tmp_path)
    assert points
    for _, point, path in points:
        report = check_source(path)
        assert report.ok, (point.label(), report.problems)


def _way(point) -> tuple[str, str, str]:
    return point.backend.value, point.placement.value, point.sync.value


@functools.cache
def _offered() -> dict[str, tuple[set[str], list[tuple[str, str, str]]]]:
    """program -> (its collectives, the ways its points take)."""
    out = {}
    for name in sorted(PROGRAMS):
        spec, knobs = _knobs(name)
        strategies = knobs.strategies(Path(tempfile.mkdtemp()), spec).values()
        out[name] = ({o.name for o in knobs.offers}, sorted({_way(p) for s in strategies for p in s.points()}))
    return out


@functools.cache
def _build_plan() -> dict[str, list[tuple[tuple[str, str, str], str]]]:
    """program -> the (way, issuer) it builds. The code of a way is the same for every program with the same
    collective, the issuer a template argument of it, the CTA count and pieces numbers in it (the GPU test runs
    every point): so every program builds once (its own code), taking a way no program has built with its
    collective yet where it has one; a pair of collective and way still unbuilt after that pass is built by the
    first program that offers it; the issuers are taken in turn along the builds. CI's nvcc time stays down."""
    built: set[tuple[str, tuple[str, str, str]]] = set()
    picks: dict[str, list[tuple[str, str, str]]] = {}
    for phase in ("one each", "the rest"):
        for name, (kinds, ways) in _offered().items():
            fresh = [w for w in ways if any((k, w) not in built for k in kinds)]
            new = (fresh or ways[-1:])[:1] if phase == "one each" else fresh
            picks[name] = picks.get(name, []) + new
            built |= {(k, w) for k in kinds for w in new}
    turn = iter(range(sum(map(len, picks.values()))))
    return {name: [(w, "cta" if w[0] == "ce" else ISSUERS[next(turn) % len(ISSUERS)]) for w in ways]
            for name, ways in picks.items()}


def test_every_rewritten_program_builds_here():
    """The fast path's tests build each rewritten program once, here, under a design point of its knobs: the point
    adds its definitions, the search's markers and its needs to the rewrite's code, and changes nothing of it."""
    from test_fastpath_corpus import REWRITTEN, _case
    from test_fastpath_rewrite import PROGRAMS as REWRITE_PROGRAMS

    here = {src for _, src, _ in PROGRAMS.values()}
    assert {src for _, src in REWRITE_PROGRAMS.values()} | {_case(n)[1] for n in REWRITTEN} <= here


def test_the_build_sweep_builds_every_collective_s_every_way_and_every_issuer():
    plan, offered = _build_plan(), _offered()
    pairs = {(k, w) for kinds, ways in offered.values() for k in kinds for w in ways}
    assert pairs == {(k, w) for name, picks in plan.items() for k in offered[name][0] for w, _ in picks}
    assert all(plan.values())
    assert {i for picks in plan.values() for w, i in picks if w[0] == "lsa"} == set(ISSUERS)
    every_way = sum(len(ways) for _, ways in offered.values())
    assert sum(map(len, plan.values())) <= len(PROGRAMS) + len(pairs) // 2 < every_way


@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_offered_issuer_placement_sync_and_backend_builds(name, tmp_path):
    """The program's builds of the corpus-wide plan (_build_plan), each at the most CTAs (the copy engine's at its
    own count) and two pieces where it cuts its consumer."""
    from concurrent.futures import ThreadPoolExecutor

    _, points = _points(name, tmp_path)
    most, ce = f"CUCO_COLL_CTAS {max(CTAS)}", f"CUCO_COLL_CTAS {CE_CTAS}"
    chosen = []
    for way, issuer in _build_plan()[name]:
        chosen += [p for p in points if _way(p[1]) == way and p[1].issuer.value == issuer and
                   p[1].chunks == (2 if way[2] == "chunk" else 1) and
                   any(" ".join(d) == (ce if way[0] == "ce" else most) for d in p[0].defines)][:1]
    assert len(chosen) == len(_build_plan()[name])
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: build(p[2], includes=p[0].includes), chosen))
    failed = [(p[0].name, p[1].label(), r.log[-600:]) for p, r in zip(chosen, results) if not r.ok]
    assert not failed, failed


def test_a_point_asks_for_a_side_stream_only_where_it_issues_a_collective_beside_the_compute(tmp_path):
    """Every run gates and joins each side stream a program is given (about 3 us apiece): a deferred point asks for
    none, a stream_overlap point for the one its collective runs on."""
    _, points = _points("overlap_beside", tmp_path)
    asked = {p.placement.value: "needs->sideStreams = 1;" in path.read_text() for _, p, path in points}
    assert asked == {"deferred": False, OVERLAP: True}
    assert all("needs->sideStreams = 0;" in path.read_text() for _, p, path in points if p.placement.value != OVERLAP)


def test_an_overlapped_collective_joins_before_the_kernel_that_uses_its_output():
    _, knobs = _knobs("overlap_beside")
    assert knobs.offers[0].beside == ["zero (line 35)"]
    code = knobs.code
    side = code.index("cuco::onSideStream<0>(ctx, ctx->stream, [&](cudaStream_t cucoSide) { return cuco::allGather(")
    zero, join = code.index("zero<<<"), code.index("cuco::joinSideStream<0>(ctx, ctx->stream)")
    assert side < zero < join < code.index("addInto<<<")


BESIDE = "  zero<<<64, 256, 0, ctx->stream>>>(s->scratch, all);\n"
ADD = "  addInto<<<64, 256, 0, ctx->stream>>>((__nv_bfloat16*)y->ptr, s->scratch, all);\n"
# Planted: the kernel beside the all-gather changed so that it may touch the all-gather's buffers, or the two placed
# where the order between them is not proven. Each is never offered a side stream, with its reason.
PLANTED = {
    "the kernel overwrites the all-gather's source (its producer for the next use)":
        (BESIDE, "  zero<<<64, 256, 0, ctx->stream>>>((__nv_bfloat16*)x->ptr, n);\n",
         "zero uses its buffer `x` next: nothing runs between them"),
    "the kernel writes through a pointer the analysis cannot place":
        (BESIDE, "  zero<<<64, 256, 0, ctx->stream>>>(pick(ctx), all);\n",
         "zero takes `pick(ctx)`, which names no buffer the analysis knows"),
    "the kernel is defined elsewhere":
        (BESIDE, "  external_zero<<<64, 256, 0, ctx->stream>>>(s->scratch, all);\n",
         "external_zero is defined elsewhere"),
    "the kernel runs on the legacy default stream":
        (BESIDE, "  zero<<<64, 256>>>(s->scratch, all);\n", "zero runs on default stream"),
    "the program uses a side stream itself":
        (BESIDE, "  zero<<<64, 256, 0, ctx->sideStreams[1]>>>(s->scratch, all);\n",
         "the program uses ctx->sideStreams itself"),
    "the all-gather is in a loop, where the next iteration's producer would run beside it":
        ("  CUCO_NCCL(ctx, ncclAllGather(", "  for (int i = 0; i < 2; i++) CUCO_NCCL(ctx, ncclAllGather(",
         "it is inside the loop of line"),
    "a synchronisation lies between them":
        (BESIDE, BESIDE + "  CUCO_CUDA(ctx, cudaStreamSynchronize(ctx->stream));\n",
         "cudaStreamSynchronize synchronises before its buffers are used"),
    "the next use is inside a branch, where a join would not be on every path":
        (ADD, "  if (all > 1) {\n" + ADD + "  }\n", "addInto, which uses its buffers next, is not in the collective's "
                                                  "block of statements"),
    "a return lies between the collective and the next use":
        (BESIDE, BESIDE + "  if (all == 0) return 0;\n", "a return between it and its join would end cuco_run"),
    "the kernel is launched from a lambda, which runs where it is called":
        (BESIDE, "  auto zap = [&] {\n  " + BESIDE + "  };\n  zap();\n", "zero is in a lambda of cuco_run()"),
    "the kernel takes a pointer assigned again, which may be the all-gather's output":
        (BESIDE, "  __nv_bfloat16* p = s->scratch;\n  if (all > 4) p = (__nv_bfloat16*)y->ptr;\n"
                 "  zero<<<64, 256, 0, ctx->stream>>>(p, all);\n", "zero takes `p`, a pointer assigned again"),
    "the kernel writes through a __device__ pointer":
        (BESIDE, "  via_global<<<1, 1, 0, ctx->stream>>>(all);\n",
         "via_global reaches memory through pointers it is not given"),
    "the kernel writes through a struct of pointers it is given by value":
        (BESIDE, "  Ptrs pt{s->scratch, (__nv_bfloat16*)y->ptr};\n  via_struct<<<1, 1, 0, ctx->stream>>>(pt, all);\n",
         "via_struct reaches memory through pointers it is not given"),
    "the kernel writes through addresses it is given as integers":
        (BESIDE, "  via_integers<<<1, 1, 0, ctx->stream>>>((const unsigned long long*)s->table, all);\n",
         "via_integers reaches memory through pointers it is not given"),
    "the kernel writes through a table of pointers":
        (BESIDE, "  via_table<<<1, 1, 0, ctx->stream>>>(s->table, all);\n",
         "via_table reaches memory through pointers it is not given"),
}
HELPERS = """__nv_bfloat16* pick(cuco_ctx_t* ctx);
__global__ void external_zero(__nv_bfloat16* out, int64_t n);
__device__ __nv_bfloat16* g_out;
__global__ void via_global(int64_t n) { g_out[n - 1] = __float2bfloat16(0.f); }
__global__ void via_table(__nv_bfloat16** table, int64_t n) { table[0][n - 1] = __float2bfloat16(0.f); }
struct Ptrs {
  __nv_bfloat16* p0;
  __nv_bfloat16* p1;
};
__global__ void via_struct(Ptrs t, int64_t n) { t.p1[n - 1] = __float2bfloat16(0.f); }
__global__ void via_integers(const unsigned long long* t, int64_t n) {
  ((__nv_bfloat16*)t[1])[n - 1] = __float2bfloat16(0.f);
}

CUCO_EXPORT int cuco_run("""


def test_a_call_the_rules_do_not_model_is_a_use_of_the_buffers_it_is_given(tmp_path):
    """cudaMemcpy2DAsync into the all-gather's output after the kernel beside it: the side stream joins back before
    the copy, never after it."""
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    copy = "  cudaMemcpy2DAsync(y->ptr, 16, s->scratch, 16, 16, 4, cudaMemcpyDeviceToDevice, ctx->stream);\n"
    src = tmp_path / "copy2d.cu"
    src.write_text(code.replace(BESIDE, BESIDE + copy, 1))
    knobs = derive(analyze(src), load_workload(WORKLOADS / "allgather_bf16"))
    assert knobs.offers[0].beside == ["zero (line 35)"]
    code = knobs.code
    assert code.index("zero<<<") < code.index("cuco::joinSideStream<0>(ctx, ctx->stream)") < \
        code.index("cudaMemcpy2DAsync")


def test_a_return_inside_a_lambda_does_not_end_cuco_run(tmp_path):
    """`auto clamp = [](int64_t v) { if (v < 0) return (int64_t)0; return v; };` between the all-gather and its next
    use: the lambda's returns end the lambda, so the side stream is still offered beside the kernel."""
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    clamp = "  auto clamp = [](int64_t v) { if (v < 0) return (int64_t)0; return v; };\n"
    src = tmp_path / "lambda.cu"
    src.write_text(code.replace(BESIDE, clamp + BESIDE.replace("all);", "clamp(all));"), 1))
    knobs = derive(analyze(src), load_workload(WORKLOADS / "allgather_bf16"))
    assert knobs.offers[0].beside == ["zero (line 36)"], knobs.offers[0].why_not


def test_a_2d_copy_on_the_collective_s_stream_that_touches_none_of_its_buffers_runs_beside_it(tmp_path):
    """cudaMemcpy2DAsync within the program's scratch, on ctx->stream: a copy like any other, beside the
    all-gather (it names its stream and its buffers), not a call of unknown reach."""
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    copy = "  cudaMemcpy2DAsync(s->scratch, 16, s->scratch + 8, 16, 16, 4, cudaMemcpyDeviceToDevice, ctx->stream);\n"
    src = tmp_path / "copy2d.cu"
    src.write_text(code.replace(BESIDE, BESIDE + copy, 1))
    knobs = derive(analyze(src), load_workload(WORKLOADS / "allgather_bf16"))
    assert knobs.offers[0].beside == ["zero (line 35)", "cudaMemcpy2DAsync (line 36)"]


def test_a_collective_is_never_offered_a_side_stream_where_a_helper_of_cuco_run_may_use_its_output(tmp_path):
    """The kernel that reads the all-gather's output launched from a host function of the program's own that
    cuco_run calls: the call is not an operation of cuco_run, so the join's place cannot be proven."""
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    consumer = "  addInto<<<64, 256, 0, ctx->stream>>>((__nv_bfloat16*)y->ptr, s->scratch, all);\n"
    helper = ("static void finish(cuco_ctx_t* ctx, __nv_bfloat16* out, __nv_bfloat16* add, int64_t n) {\n"
              "  addInto<<<64, 256, 0, ctx->stream>>>(out, add, n);\n}\n\nstruct State {")
    assert consumer in code and "struct State {" in code
    src = tmp_path / "helper.cu"
    src.write_text(code.replace(consumer, "  finish(ctx, (__nv_bfloat16*)y->ptr, s->scratch, all);\n")
                   .replace("struct State {", helper))
    knobs = derive(analyze(src), load_workload(WORKLOADS / "allgather_bf16"))
    assert knobs.offers[0].placements == ("deferred",)
    assert "is in finish(), a function of the program's own" in knobs.offers[0].why_not[OVERLAP]
    assert "onSideStream" not in knobs.code


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_collective_is_never_offered_a_side_stream_beside_what_may_touch_its_buffers(case, tmp_path):
    old, new, why = PLANTED[case]
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    assert old in code
    src = tmp_path / "planted.cu"
    src.write_text(code.replace(old, new, 1).replace("CUCO_EXPORT int cuco_run(", HELPERS, 1)
                   .replace("  __nv_bfloat16* scratch;", "  __nv_bfloat16* scratch;\n  __nv_bfloat16** table;"))
    spec = load_workload(WORKLOADS / "allgather_bf16")
    knobs = derive(analyze(src), spec)
    assert knobs.offers[0].placements == ("deferred",)
    assert why in knobs.offers[0].why_not[OVERLAP]
    assert knobs.accepts["placement"] == ("deferred",)
    assert "onSideStream" not in knobs.code


def test_the_limits_are_the_collectives_own():
    """The sites and pieces the knobs offer fit the arrays cuco_collectives.cuh sizes for them."""
    import re

    header = "".join(p.read_text() for p in sorted((ROOT / "cuco" / "cuda" / "include").glob("cuco_coll*.cuh")))
    define = {m[1]: int(m[2]) for m in re.finditer(r"#define (CUCO_COLL_MAX_\w+) (\d+)", header)}
    assert define["CUCO_COLL_MAX_SITES"] == MAX_SITES and max(PIECES) <= define["CUCO_COLL_MAX_CHUNKS"]


def test_a_gemm_that_reads_an_all_gather_by_rows_runs_piece_by_piece():
    """The gathered A is cuBLAS's B (transb N): the call is re-issued on rows [cucoRow, + cucoRows) of the gathered
    buffer and of C, its column count the chunk's, behind the all-gather's flags; nothing else changes."""
    _, knobs = _knobs("gather_gemm_ex")
    code = knobs.code
    gather = code.index("cuco::allGatherChunks<0>(ctx, gathered->window, 0, a->ptr, ")
    gemm = code.index("cuco::gemmByGatheredRows<0>(ctx, ctx->stream, gathered->ptr, (int64_t)(M), "
                      "(int64_t)(K) * cuco::dataTypeBytes(CUDA_R_16BF), [&](int64_t cucoRow, int64_t cucoRows) "
                      "{ return cublasGemmEx(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, nLocal, (int)cucoRows, K, &one, ")
    assert gather < gemm and '#include "cuco_gemm_rows.cuh"' in code
    assert "cuco::rowsAt(gathered->ptr, cucoRow, (int64_t)(K) * cuco::dataTypeBytes(CUDA_R_16BF))" in code
    assert "cuco::rowsAt(c->ptr, cucoRow, (int64_t)(nLocal) * cuco::dataTypeBytes(CUDA_R_16BF))" in code
    assert "joinSideStream" not in code  # the GEMM joins the side stream back itself, after its last piece


GEMM = "cuco_gemm_bf16(s->blas, aFull->ptr, b->ptr, c->ptr, M, K, nLocal)"
# Planted: the GEMM after the all-gather of the GEMM+AllGather seed changed so that cutting it by the gathered rows
# would be wrong, or is not proven right.
PLANTED_CONSUMERS = {
    "the gathered buffer is the GEMM's B, whose rows are K": (GEMM, "cuco_gemm_bf16(s->blas, b->ptr, aFull->ptr, "
                                                                    "c->ptr, M, K, nLocal)", "reads it as B"),
    "the GEMM writes the all-gather's source": (GEMM, "cuco_gemm_bf16(s->blas, aFull->ptr, b->ptr, a->ptr, M, K, "
                                                      "nLocal)", "writes the all-gather's buffer `a`"),
    "the GEMM reads from inside the gathered buffer": (GEMM, "cuco_gemm_bf16(s->blas, (char*)aFull->ptr + K, "
                                                             "b->ptr, c->ptr, M - 1, K, nLocal)",
                                                       "does not read the gathered buffer from its start"),
    "the GEMM reads the gathered buffer whole as B too": (GEMM, "cuco_gemm_bf16(s->blas, aFull->ptr, aFull->ptr, "
                                                                "c->ptr, M, K, nLocal)",
                                                          "also reads the gathered buffer as another operand"),
    "an argument has a side effect": (GEMM, "cuco_gemm_bf16(s->blas, aFull->ptr, b->ptr, c->ptr, M, K, nLocal++)",
                                      "assign or increment"),
    "the GEMM runs on another stream": ("cublasSetStream(s->blas, ctx->stream)", "cublasSetStream(s->blas, 0)",
                                        "runs on 0, not on ctx->stream"),
    "a kernel reads the gathered rows first": (
        f"  CUCO_CUBLAS(ctx, {GEMM});", f"  CUCO_CUDA(ctx, cudaMemsetAsync(c->ptr, 0, 16, ctx->stream));\n"
                                        f"  CUCO_CUDA(ctx, cudaMemcpyAsync(c->ptr, aFull->ptr, 16, "
                                        f"cudaMemcpyDeviceToDevice, ctx->stream));\n  CUCO_CUBLAS(ctx, {GEMM});",
        "cudaMemcpyAsync, its next use, is not a GEMM"),
}


def test_a_gemm_that_writes_a_reduce_scatters_input_signals_it_piece_by_piece():
    """The GEMM writes the peers' blocks of the partial products first, each piece flagged on the rank that sums it;
    the reduce-scatter, forked before the GEMM, sums pieces as they are flagged and joins back at the end."""
    _, knobs = _knobs("gemm_reducescatter_seed")
    code = knobs.code
    gemm = code.index("cuco::gemmSignalRows<0>(ctx, ctx->stream, partial->ptr, (int64_t)(M), (int64_t)(N) * "
                      "(int64_t)sizeof(__nv_bfloat16), [&](int64_t cucoRow, int64_t cucoRows) { return "
                      "cuco_gemm_bf16(s->blas, cuco::rowsAt(a->ptr, cucoRow, ")
    scatter = code.index("cuco::reduceScatterChunks<0>(ctx, partial->window, 0, (__nv_bfloat16*)(c->ptr), ")
    assert gemm < scatter < code.index("cuco::joinSideStream<0>(ctx, ctx->stream));\n  return 0;")


RS_GEMM = "  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a->ptr, b->ptr, partial->ptr, M, kLocal, N));\n"
# Planted: the GEMM before the reduce-scatter of the GEMM+ReduceScatter seed changed, or work put between the two,
# so that summing the GEMM's pieces as they are written would be wrong, or is not proven right.
PLANTED_PRODUCERS = {
    "a copy writes the partial products after the GEMM": (
        RS_GEMM, RS_GEMM + "  CUCO_CUDA(ctx, cudaMemsetAsync(partial->ptr, 0, 16, ctx->stream));\n",
        "cudaMemsetAsync is not a GEMM"),
    "a synchronisation lies between them": (
        RS_GEMM, RS_GEMM + "  CUCO_CUDA(ctx, cudaStreamSynchronize(ctx->stream));\n", "synchronises before"),
    "the GEMM reads the reduce-scatter's output": (
        "b->ptr, partial->ptr", "c->ptr, partial->ptr", "touches the reduce-scatter's output `c`"),
    "the GEMM writes into the partial products past their start": (
        "b->ptr, partial->ptr, M, kLocal, N", "b->ptr, (char*)partial->ptr + 2 * N, M - 1, kLocal, N",
        "does not write the reduce-scatter's input from its start"),
    "the partial products are the GEMM's B": (
        "a->ptr, b->ptr, partial->ptr", "a->ptr, partial->ptr, partial->ptr", "also reads the reduce-scatter's input"),
}


def test_a_gemm_that_writes_an_all_reduces_input_signals_it_by_columns():
    """The row-parallel layer: the GEMM is re-issued on columns [cucoCol, + cucoCols) of the weights and of its output
    (the weights read once), each piece flagged on every rank; the all-reduce, forked before the GEMM, sums pieces as
    every rank flags them and joins back where its output is next used."""
    _, knobs = _knobs("gemm_allreduce_seed")
    code = knobs.code
    gemm = code.index("cuco::gemmSignalColumns<0>(ctx, ctx->stream, c->ptr, (int64_t)(N), (int64_t)(M), (int64_t)(N), "
                      "(int64_t)sizeof(__nv_bfloat16), [&](int64_t cucoCol, int64_t cucoCols) { return "
                      "cuco_gemm_bf16_ld(s->blas, a->ptr, cuco::rowsAt(b->ptr, cucoCol, (int64_t)sizeof(__nv_bfloat16))"
                      ", cuco::rowsAt(c->ptr, cucoCol, (int64_t)sizeof(__nv_bfloat16)), M, K / ctx->nRanks, cucoCols, "
                      "N, 0.0f); })")
    reduce = code.index("cuco::allReduceChunks<0>(ctx, c->window, 0, c->window, 0, (size_t)M * N, ctx->stream, "
                        "(const __nv_bfloat16*)(c->ptr))")
    assert gemm < reduce < code.index("cuco::joinSideStream<0>(ctx, ctx->stream));\n  return 0;")
    assert any("writes its input by columns" in line for line in knobs.explain())


def test_a_cublas_gemm_is_cut_by_the_columns_of_its_row_major_output(tmp_path):
    """cublasGemmEx in the row-major idiom (C^T = B^T A^T, weights as cuBLAS's A with transa N): a piece is cuBLAS's
    m, its A and C moved by elements; with transa T, A moves by whole rows of lda. The GEMM and the all-reduce are
    named through variables of the program's own (`stream`, `blas`), one stream once followed."""
    _, knobs = _knobs("gemm_ar_ex")
    assert knobs.offers[0].pieces is not None, knobs.offers[0].why_not
    code = knobs.code
    assert ("cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)cucoCols, M, k, &one, cuco::rowsAt(w, cucoCol, "
            "cuco::dataTypeBytes(CUDA_R_16BF)), CUDA_R_16BF, N, x, CUDA_R_16BF, k, &zero, cuco::rowsAt(y, cucoCol, "
            "cuco::dataTypeBytes(CUDA_R_16BF)), CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)") in code
    src = tmp_path / "transposed.cu"
    src.write_text((HERE / "knobs" / "gemm_ar_ex.cu").read_text().replace("CUBLAS_OP_N, CUBLAS_OP_N, N, M",
                                                                         "CUBLAS_OP_T, CUBLAS_OP_N, N, M"))
    code = derive(analyze(src), load_workload(WORKLOADS / "gemm_allreduce")).code
    assert "cuco::rowsAt(w, cucoCol, (int64_t)(N) * cuco::dataTypeBytes(CUDA_R_16BF))" in code


AR_GEMM = "  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a->ptr, b->ptr, c->ptr, M, K / ctx->nRanks, N));\n"
AR = "ncclAllReduce(c->ptr, c->ptr, (size_t)M * N,"
# Planted: the GEMM before the all-reduce of the decode GEMM+AllReduce seed changed, or work put between the two, so
# that summing the GEMM's pieces as they are written would be wrong, or is not proven right.
PLANTED_AR_PRODUCERS = {
    "a copy writes the product after the GEMM": (
        AR_GEMM, AR_GEMM + "  CUCO_CUDA(ctx, cudaMemsetAsync(c->ptr, 0, 16, ctx->stream));\n",
        "cudaMemsetAsync is not a GEMM"),
    "the all-reduce writes elsewhere, and the GEMM reads that output": (
        (AR, "a->ptr, b->ptr, c->ptr, M", '*c = cuco_buffer(ctx, "c");'),
        ("ncclAllReduce(partial->ptr, c->ptr, (size_t)M * N,", "c->ptr, b->ptr, partial->ptr, M",
         '*c = cuco_buffer(ctx, "c"), *partial = cuco_buffer(ctx, "partial");'),
        "touches the all-reduce's output `c`"),
    "the GEMM writes into the product past its start": (
        "b->ptr, c->ptr, M, K", "b->ptr, (char*)c->ptr + 2 * N, M - 1, K", "does not write the all-reduce's input"),
    "the product is also the GEMM's B": ("a->ptr, b->ptr, c->ptr", "a->ptr, c->ptr, c->ptr",
                                         "also reads the all-reduce's input"),
    "an argument has a side effect": ("c->ptr, M, K / ctx->nRanks, N)", "c->ptr, M, K / ctx->nRanks, N++)",
                                      "assign or increment"),
    "the GEMM runs on another stream": ("cublasSetStream(s->blas, ctx->stream)", "cublasSetStream(s->blas, 0)",
                                        "runs on 0, not on ctx->stream"),
}


PLANTED_PIECES = {**{("gemm_allgather", case): v for case, v in PLANTED_CONSUMERS.items()},
                  **{("gemm_reducescatter", case): v for case, v in PLANTED_PRODUCERS.items()},
                  **{("gemm_allreduce", case): v for case, v in PLANTED_AR_PRODUCERS.items()}}


@pytest.mark.parametrize("workload, case", sorted(PLANTED_PIECES))
def test_a_gemm_is_never_cut_into_pieces_where_the_cut_is_not_proven(workload, case, tmp_path):
    """Each planted change keeps the GEMM whole (no sync chunk), with its reason."""
    old, new, why = PLANTED_PIECES[workload, case]
    code = (WORKLOADS / workload / "seed.cu").read_text()
    for o, n in zip(*((old, new) if isinstance(old, tuple) else ((old,), (new,)))):
        assert o in code
        code = code.replace(o, n, 1)
    src = tmp_path / "planted.cu"
    src.write_text(code)
    knobs = derive(analyze(src), load_workload(WORKLOADS / workload))
    assert knobs.offers[0].pieces is None and knobs.accepts["sync"] == ("global",)
    assert why in knobs.offers[0].why_not["sync chunk"], knobs.offers[0].why_not
    assert not any(f in knobs.code for f in ("gemmByGatheredRows", "gemmSignalRows", "gemmSignalColumns"))


@pytest.mark.gpu(1)
@pytest.mark.nvcc
@pytest.mark.parametrize("name, ctas", [(n, c) for n in sorted(PROGRAMS) for c in CTAS])
def test_every_offered_point_is_correct_on_one_gpu(name, ctas, tmp_path):
    spec, points = _points(name, tmp_path, world=1)
    points = [p for p in points if p[0].name == f"rewrite_ctas{ctas}"]
    prebuild(points[0][0], tmp_path / "prebuilt", points=[p for _, p, _ in points])  # nvcc in parallel, cached
    failed = []
    for strategy, point, path in points:
        work = tmp_path / "w" / path.stem
        rec = evaluate(spec, path, EvalOptions(device="cuda", max_level="L2", gpus=[0], work_dir=work))
        if not rec.ok:
            failed.append((strategy.name, point.label(), rec.failed_level, rec.error))
        whole = _whole_fallbacks(work)  # at sync chunk the GEMM must have run in pieces
        if point.sync == "chunk" and whole:
            failed.append((strategy.name, point.label(), "not cut into pieces", whole[0]))
    assert not failed, failed


@pytest.mark.gpu(2)
@pytest.mark.nvcc
def test_every_sync_chunk_point_of_an_all_reduce_is_correct_at_world_2(tmp_path):
    """The GEMM's pieces summed across two GPUs as they are flagged, in place, every count of pieces and issuer, at
    every shape (m1: fewer lines than ranks, each rank a share of the columns; s_odd: columns no 16 bytes divide),
    in both forms of the GEMM (cuco_gemm.h's row-major call, cublasGemmEx), and with one rank late to its first
    GEMM."""
    failed = []
    for name in ("gemm_allreduce_seed", "gemm_ar_ex"):
        spec, points = _points(name, tmp_path / name, world=2)
        points = [p for p in points if p[0].name == "rewrite_ctas64" and p[1].sync == "chunk"]
        points = points if name == "gemm_allreduce_seed" else points[-1:]
        prebuild(points[0][0], tmp_path / "prebuilt", points=[p for _, p, _ in points])
        if name == "gemm_allreduce_seed":
            points.append(_late_first_rank(*points[-1], tmp_path))
        for _, point, path in points:
            work = tmp_path / "w" / name / path.stem
            rec = evaluate(spec, path, EvalOptions(device="cuda", max_level="L3", gpus=[0, 1], work_dir=work))
            if not rec.ok:
                failed.append((name, point.label(), rec.failed_level, rec.error))
            if _whole_fallbacks(work):
                failed.append((name, point.label(), "not cut into pieces", _whole_fallbacks(work)[0]))
    assert not failed, failed


LATE = """__global__ void cucoTestDelay(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

CUCO_EXPORT int cuco_run("""


def _late_first_rank(strategy, point, path: Path, tmp_path: Path):
    """The point with rank 0 held up by a spinning kernel (about 0.2 s) before its first GEMM: rank 1 flags its first
    piece on rank 0 before rank 0 has zeroed its flags, which must not be lost."""
    code = path.read_text()
    gemm = "  CUCO_CUBLAS(ctx, cuco::gemmSignalColumns<0>("
    assert gemm in code and "CUCO_EXPORT int cuco_run(" in code
    late = tmp_path / "late_first_rank.cu"
    late.write_text(code.replace("CUCO_EXPORT int cuco_run(", LATE, 1).replace(
        gemm, "  static int cucoRuns = 0;\n  if (ctx->rank == 0 && cucoRuns++ == 0) "
              "cucoTestDelay<<<1, 1, 0, ctx->stream>>>(400000000LL);\n" + gemm, 1))
    return strategy, point, late


def _whole_fallbacks(work: Path) -> list[str]:
    """The rank logs' lines in which a sync-chunk GEMM or collective fell back to the whole buffer (as correct, it
    says so once a process)."""
    return [line for log in work.glob("rank*.log") for line in log.read_text(errors="replace").splitlines()
            if "waits for the whole" in line]


# A sync-chunk point whose pieces' check is handed another buffer at run time: it stays correct and runs whole.
PLANTED_FALLBACKS = {
    "gemm_allgather_seed": ("gemmByGatheredRows<0>(ctx, ctx->stream, aFull->ptr,",
                            "gemmByGatheredRows<0>(ctx, ctx->stream, b->ptr,"),
    "gemm_reducescatter_seed": ("gemmSignalRows<0>(ctx, ctx->stream, partial->ptr,",
                                "gemmSignalRows<0>(ctx, ctx->stream, c->ptr,"),
    "gemm_allreduce_seed": ("gemmSignalColumns<0>(ctx, ctx->stream, c->ptr,",
                            "gemmSignalColumns<0>(ctx, ctx->stream, b->ptr,"),
}


def _planted_fallback(name: str, tmp_path: Path):
    """The program's first sync-chunk point with PLANTED_FALLBACKS' change: (spec, its file)."""
    spec, points = _points(name, tmp_path, world=1)
    _, _, path = next(p for p in points if p[1].sync == "chunk")
    old, new = PLANTED_FALLBACKS[name]
    code = path.read_text()
    assert old in code, "the rewrite no longer calls the pieces' check as the plant expects"
    path.write_text(code.replace(old, new, 1))
    return spec, path


@pytest.mark.parametrize("name", sorted(PLANTED_FALLBACKS))
def test_the_planted_fallbacks_still_apply(name, tmp_path):
    _planted_fallback(name, tmp_path)


@pytest.mark.gpu(1)
@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(PLANTED_FALLBACKS))
def test_a_sync_chunk_gemm_that_runs_whole_is_seen(name, tmp_path):
    """The check of every offered point is not vacuous: a sync-chunk point whose GEMM falls back to the whole
    buffer passes verification, and its rank log says it ran whole."""
    spec, path = _planted_fallback(name, tmp_path)
    work = tmp_path / "w"
    rec = evaluate(spec, path, EvalOptions(device="cuda", max_level="L2", gpus=[0], work_dir=work))
    assert rec.ok, (rec.failed_level, rec.error)
    assert _whole_fallbacks(work), "the fallback ran without saying so"


def test_a_search_given_starting_points_evaluates_them_first_beside_the_seed(tmp_path):
    """An LLM search on a workload without [strategies] starts from the rewrite's design points (every issuer and
    placement, at the most CTAs): they are stored after the seed, each with its design point, and run first."""
    import asyncio
    from dataclasses import replace

    from test_evolve_run import fake_evaluator

    from cuco.evolve.config import RunConfig
    from cuco.evolve.run import Evolution
    from cuco.evolve.slots import Slot
    from cuco.fastpath.knobs import Knobs

    spec, knobs = _knobs("overlap_beside")
    spec = replace(spec, strategies=knobs.strategies(tmp_path / "derived", spec))
    first = Knobs.start_strategy(spec.strategies)
    starts = [(first, p) for p in first.points()]
    assert {(p.issuer, p.placement) for _, p in starts} == {(i, pl) for i in ("cta", "warp")
                                                            for pl in ("deferred", OVERLAP)}
    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape = len(starts) + 1, spec.shapes[0].name
    evo = Evolution(spec, cfg, tmp_path / "run", [Slot(0, ())], fake_evaluator, "cuda", starts=starts)
    asyncio.run(evo.run())
    rows = evo.db.all()
    assert [c.proposer for c in rows] == ["seed"] + ["knobs"] * len(starts)
    assert [c.label for c in rows[1:]] == [f"{p.label()} in rewrite_ctas{max(CTAS)}" for _, p in starts]  # CTAs
    assert rows[1].code == materialize(first, starts[0][1]) and f"CUCO_COLL_CTAS {max(CTAS)}" in rows[1].code
    assert evo.db.count("done") == len(starts) + 1
    evo.db.close()


@pytest.mark.parametrize("proposer, says", [("directive", "the directive proposer searches the 6 design points"),
                                            ("llm", "the LLM starts from the seed and from every issuer")])
def test_evolve_says_what_it_does_with_a_workload_without_strategies(proposer, says, tmp_path):
    from typer.testing import CliRunner

    from cuco.cli import app

    res = CliRunner().invoke(app, ["evolve", str(WORKLOADS / "allreduce_sum"), "--run-dir", str(tmp_path / "run"),
                                   "--set", f"search.proposer={proposer}", "--device", "cpu"],
                             env={"COLUMNS": "300", "CUCO_HOME": str(tmp_path / "home")})
    assert says in " ".join(res.output.split()), res.output


def _evolve(tmp_path, monkeypatch, capsys, *args):
    """`cuco evolve ARGS` as the command line runs it: its exit code and its output in one line."""
    import sys

    from cuco.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("CUCO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "argv", ["cuco", "evolve", *args, "--run-dir", str(tmp_path / "run"), "--device", "cpu"])
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr()
    return stop.value.code, " ".join((out.out + out.err).split())


@pytest.mark.parametrize("name", ["typed_pointers", "gather_gemm_ex"])
def test_search_space_knobs_searches_the_start_programs_knobs(name, tmp_path, monkeypatch, capsys):
    """A program of one's own on a built-in workload's buffers, that workload shipping strategy kernels or not: the
    directive proposer is given the knobs of the program's rewrite (and, on this machine, the search stops at the
    GPUs it lacks)."""
    wl, src, _ = PROGRAMS[name]
    spec, knobs = _knobs(name)
    code, out = _evolve(tmp_path, monkeypatch, capsys, str(WORKLOADS / wl), "--set", f"search.start={src}", "--set",
                        "search.space=knobs")
    assert f"search.space = knobs: the directive proposer searches the {knobs.points()} design points derived from " \
           f"the rules' rewrite of {src.name}" in out, out
    assert code == 4, out
    assert bool(spec.strategies) == (wl == "gemm_allgather")  # one workload with strategy kernels, one without


@pytest.mark.parametrize("value, says", [
    ("search.space=every", "search.space: expected auto or knobs, got 'every'"),
    (f"search.start={HERE / 'corpus' / 'helper_wrapper.cu'}", "knobs: the rules' rewrite of the start program gives "
                                                              "none"),
    ("search.start=/nonexistent/p.cu", "search.start: /nonexistent/p.cu does not exist")])
def test_search_space_knobs_refuses_in_one_line(value, says, tmp_path, monkeypatch, capsys):
    code, out = _evolve(tmp_path, monkeypatch, capsys, str(WORKLOADS / "allreduce_sum"), "--set", "search.space=knobs",
                        "--set", value)
    assert code == 2 and says in out, out


def test_the_knobs_benchmark_searches_every_program_listed_here():
    """benchmarks/knobs_search.py runs the programs this file lists, on the same workloads."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from knobs_search import PROGRAMS as SEARCHED

    assert {n: (wl, Path(src).resolve()) for n, (wl, src) in SEARCHED.items()} == \
        {n: (wl, Path(src).resolve()) for n, (wl, src, _) in PROGRAMS.items()}


def test_a_group_left_open_is_refused_by_the_knobs_not_a_crash(tmp_path):
    """ncclGroupStart as the program's last NCCL call: the rewrite's refusal, not an index past the calls."""
    from cuco.fastpath.rewrite import RewriteError

    src = (HERE / "corpus" / "pairwise_loop.cu").read_text()
    start = src.index("  for (int p = 0;")
    (tmp_path / "p.cu").write_text(src[:start] + src[src.index("  return 0;", start):])
    with pytest.raises(RewriteError, match="ncclGroupStart without ncclGroupEnd"):
        derive(analyze(tmp_path / "p.cu"), load_workload(WORKLOADS / "alltoall_bf16"))
