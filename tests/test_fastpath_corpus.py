"""The fast path on host programs written the way users write them (tests/fastpath/corpus/ and the user-style
programs beside it): each is rewritten by the rules or refused with a reason that is true, a rewritten one builds
(under a design point of its knobs, test_fastpath_knobs.py), and on two GPUs it verifies."""

from __future__ import annotations

import pytest
from conftest import ROOT, WORKLOADS

from cuco.fastpath.rewrite import RewriteError, no_host_collective_left, rewrite
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

HERE = ROOT / "tests" / "fastpath"
# program -> (workload, what the rules do: a line of the rewritten program, or the reason of the refusal). The
# programs are tests/fastpath/corpus/<name>.cu, but for the two user-style programs the rewrite tests share and
# the all-to-allv seed, whose counts come from the host.
ELSEWHERE = {"host_allreduce_scratch": HERE / "host_allreduce_scratch.cu",
             "host_halo_exchange": HERE / "host_halo_exchange.cu",
             "alltoallv_seed": WORKLOADS / "alltoallv_bf16" / "seed.cu"}
CORPUS = {
    "typed_pointers": ("allreduce_sum", "rewritten",
                       "CUCO_CUDA(ctx, cuco::allReduce<__nv_bfloat16>(ctx, xb->window, 0, yb->window, 0, count"),
    "two_halves": ("allreduce_sum", "rewritten",
                   "cuco::allReduce<__nv_bfloat16>(ctx, x->window, (half) * sizeof(__nv_bfloat16), y->window, "
                   "(half) * sizeof(__nv_bfloat16), n - half"),
    "buffer_table": ("sendrecv_ring", "rewritten", "cucoSends1.add(bufs[0], (n) * sizeof(__nv_bfloat16), next, "
                                                   "y->window, 0)"),
    "gemm_rs_scratch": ("gemm_reducescatter", "rewritten",
                        "cuco::reduceScatter<__nv_bfloat16>(ctx, cucoWin_s_partials, 0, C,"),
    "gemm_ar_macros": ("gemm_allreduce", "rewritten",
                       "CUCO_CUDA(ctx, cuco::allReduce<__nv_bfloat16>(ctx, cb->window, 0, cb->window, 0,"),
    "inplace_allgather": ("allgather_bf16", "rewritten",
                          "cuco::allGather(ctx, y->window, 0, mine, (block) * sizeof(__nv_bfloat16)"),
    "host_allreduce_scratch": ("allreduce_sum", "rewritten",
                                  "cuco::allReduce<__nv_bfloat16>(ctx, cucoWin_s_scratch, 0, cucoWin_s_scratch, 0"),
    "host_halo_exchange": ("sendrecv_ring", "rewritten", "cucoSends1.add(x->ptr, (n) * sizeof(__nv_bfloat16), "
                                                           "right, y->window, 0)"),
    "helper_wrapper": ("allreduce_sum", "refused",
                       "line 6: ncclAllReduce's send buffer: `in` is a parameter of allReduceSum(): the rules do not "
                       "follow buffers into the functions they are passed to"),
    "rotating_buffers": ("sendrecv_ring", "refused",
                         "line 28: ncclRecv's receive buffer: `bufs[(i + 1) % 2]` picks one of the buffers of `bufs` "
                         "by `(i + 1) % 2`: which one is chosen at run time"),
    "swapped_pointers": ("allreduce_sum", "refused",
                         "line 15: ncclAllReduce's send buffer: `src` is assigned again at line 17: which buffer it "
                         "names changes"),
    "double_buffered_output": ("allgather_bf16", "refused",
                               "line 25: ncclAllGather's receive buffer: `s->gathered + (s->runs++ % 2) * n` lies at "
                               "an offset that depends on `s->runs`, which the rules cannot follow to one value on "
                               "every rank"),
    "pairwise_loop": ("alltoall_bf16", "rewritten",
                      "CUCO_CUDA(ctx, cuco::allToAll(ctx, cuco_buffer(ctx, \"y\")->window, 0, x, (block) * "
                      "sizeof(__nv_bfloat16), ctx->stream));"),
    "own_block_loop": ("alltoall_bf16", "rewritten",
                       "CUCO_CUDA(ctx, cuco::allToAll(ctx, cuco_buffer(ctx, \"y\")->window, 0, x, (block) * "
                       "sizeof(__nv_bfloat16), ctx->stream));"),
    "alltoallv_seed": ("alltoallv_bf16", "refused", "the ncclSend of line 35 sends `out` and the ncclRecv of line 36 "
                       "receives `in`: blocks of one size are an all-to-all; a size per peer (an all-to-allv) is not "
                       "covered by the rules"),
}
REWRITTEN = sorted(n for n, (_, outcome, _) in CORPUS.items() if outcome == "rewritten")


def _case(name):
    wl, outcome, words = CORPUS[name]
    return load_workload(WORKLOADS / wl), ELSEWHERE.get(name, HERE / "corpus" / f"{name}.cu"), outcome, words


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_program_is_rewritten_or_refused_with_its_reason(name):
    spec, src, outcome, words = _case(name)
    if outcome == "refused":
        with pytest.raises(RewriteError) as err:
            rewrite(src, spec)
        assert words in str(err.value)
        return
    rw = rewrite(src, spec)
    assert words in rw.code and no_host_collective_left(rw.code)


def test_the_corpus_is_a_dozen_programs_and_both_outcomes():
    assert len(CORPUS) >= 12 and 0 < len(REWRITTEN) < len(CORPUS)


@pytest.mark.gpu(2)
@pytest.mark.nvcc
@pytest.mark.parametrize("name", REWRITTEN)
def test_each_rewritten_program_is_correct_on_gpus(name, tmp_path):
    spec, src, _, _ = _case(name)
    out = tmp_path / "t.cu"
    out.write_text(rewrite(src, spec).code)
    rec = evaluate(spec, out, EvalOptions(device="cuda", max_level="L3", gpus=[0, 1], work_dir=tmp_path / "w"))
    assert rec.ok, rec.error


def test_a_window_offset_that_depends_on_the_rank_is_refused(tmp_path):
    src = tmp_path / "p.cu"
    src.write_text((HERE / "corpus" / "inplace_allgather.cu").read_text()
                   .replace("ncclAllGather(mine, all,", "ncclAllGather(all, mine,"))
    with pytest.raises(RewriteError, match=r"receive buffer `mine` lies at an offset that depends on the rank "
                                           r"\(ctx->rank\): a peer would compute another offset"):
        rewrite(src, load_workload(WORKLOADS / "allgather_bf16"))


def test_the_analysis_records_loops_what_they_carry_and_where_it_is_unsure():
    from cuco.fastpath.analyze import analyze

    a = analyze(HERE / "corpus" / "rotating_buffers.cu")
    send, recv = (o for o in a.ops if o.kind == "p2p")
    assert send.loops == recv.loops == [25]
    assert (recv.index, send.index, "s->spare", 25) in a.carried  # this iteration's receive is the next one's send
    assert "line 28: `bufs[(i + 1) % 2]` picks one of several buffers at run time" in "\n".join(a.warnings)
    assert not any("bufs[0]" in w for w in a.warnings)  # a literal index names one buffer
    swapped = analyze(HERE / "corpus" / "swapped_pointers.cu")
    assert any(w.startswith("`src` is assigned again at line 17") for w in swapped.warnings)


@pytest.mark.parametrize("offset,why", [
    ("(half) * sizeof(__nv_bfloat16)", None),  # half = n / 2, n = cuco_param(ctx, "N"): the shape's
    ("ctx->nRanks * 4", None),
    ("x->bytes / 2", None),
    ("ctx->rank * n", "the rank (ctx->rank)"),
    ("(dev) * 8", "`ctx->cudaDevice`"),  # dev = ctx->cudaDevice: another number on every rank
    ("x->ptr", "`x->ptr`"),
    ("i * 2", "`i`, which the program assigns more than once"),
    ("s->runs % 2", "`s->runs`"),
    ("next_offset(n)", "a call of next_offset()"),
])
def test_a_window_offset_must_be_the_same_on_every_rank(offset, why):
    from cuco.fastpath.places import why_offset_varies

    scalars = {"n": 'cuco_param(ctx, "N")', "half": "n / 2", "dev": "ctx->cudaDevice", "i": None}
    got = why_offset_varies(offset, scalars, {"x": "x"})
    assert (got is None) if why is None else (got is not None and why in got), got


@pytest.mark.parametrize("cast", ["static_cast<__nv_bfloat16*>({})", "reinterpret_cast<__nv_bfloat16*>({})",
                                  "(__nv_bfloat16*)({})"])
def test_a_buffer_behind_a_cpp_cast_is_placed(cast, tmp_path):
    """`static_cast<T*>(cuco_buffer(ctx, "y")->ptr)`, or through a `void*` local and `reinterpret_cast`, as C++
    programs write it: the rules find the buffer as they do behind a C cast."""
    src = (HERE / "corpus" / "pairwise_loop.cu").read_text()
    old = '  __nv_bfloat16* y = (__nv_bfloat16*)cuco_buffer(ctx, "y")->ptr;\n'
    assert old in src
    raw = '  void* raw = cuco_buffer(ctx, "y")->ptr;\n'
    (tmp_path / "p.cu").write_text(src.replace(old, raw + f"  __nv_bfloat16* y = {cast.format('raw')};\n"))
    rw = rewrite(tmp_path / "p.cu", load_workload(WORKLOADS / "alltoall_bf16"))
    assert 'cuco::allToAll(ctx, cuco_buffer(ctx, "y")->window, 0, x,' in rw.code
