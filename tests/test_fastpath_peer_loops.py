"""A group whose ncclSend and ncclRecv stand in loops over every peer (the hand-written all-to-all) is rewritten into
cuco::allToAll only where the rules prove it is one: every rank reached once, each call at block `peer` of one
buffer, nothing else in the loop. Each variant below is the corpus program with edits, every edit found."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, WORKLOADS

from cuco.fastpath.rewrite import RewriteError, no_host_collective_left, rewrite
from cuco.workload import load_workload

LOOP = ROOT / "tests" / "fastpath" / "corpus" / "pairwise_loop.cu"
SEND = "    CUCO_NCCL(ctx, ncclSend(x + p * block, block, ncclBfloat16, p, ctx->comm, ctx->stream));\n"
RECV = "    CUCO_NCCL(ctx, ncclRecv(y + p * block, block, ncclBfloat16, p, ctx->comm, ctx->stream));\n"
HEADER = "  for (int p = 0; p < ctx->nRanks; p++) {\n"
CALL = "cuco::allToAll(ctx, cuco_buffer(ctx, \"y\")->window, 0, x, (block) * sizeof(__nv_bfloat16), ctx->stream)"


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    src = LOOP.read_text()
    for old, new in edits:
        assert old in src, f"the edit's text is not in the program: {old!r}"
        src = src.replace(old, new)
    (tmp_path / "p.cu").write_text(src)
    return tmp_path / "p.cu"


def _rewrite(path: Path):
    return rewrite(path, load_workload(WORKLOADS / "alltoall_bf16"))


OWN = ("    if (p == ctx->rank) {\n      CUCO_CUDA(ctx, cudaMemcpyAsync(y + p * block, x + p * block, (block) * "
       "sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, ctx->stream));\n      continue;\n    }\n" + SEND)
# The block's parts: a share of the parameter N and a width (the count is still `block`, their product).
BLOCK = "  const size_t block = (size_t)(cuco_param(ctx, \"N\") / ctx->nRanks);\n"
PARTS = "  const size_t width = 8, per = (size_t)(cuco_param(ctx, \"N\") / ctx->nRanks) / width;\n"
ROTATED = "    const int to = (ctx->rank + p) % ctx->nRanks, from = (ctx->rank - p + ctx->nRanks) % ctx->nRanks;\n"
REWRITTEN = {
    "as written": (),
    "peers rotated by the rank, each call indexed by its own peer": (
        (HEADER, HEADER + ROTATED),
        (SEND, SEND.replace("x + p * block", "x + to * block").replace(", p, ctx->comm", ", to, ctx->comm")),
        (RECV, RECV.replace("y + p * block", "y + from * block").replace(", p, ctx->comm", ", from, ctx->comm"))),
    "a send loop and a receive loop": (
        (SEND, SEND + "  }\n" + HEADER.replace("p", "q")),
        (RECV, RECV.replace("y + p * block", "&y[block * q]").replace(", p, ctx->comm", ", q, ctx->comm"))),
    "its own block copied, the others sent": ((SEND, OWN),),
    "its own block copied, the others sent in the else": (
        (SEND, OWN.replace("      continue;\n    }\n", "    } else {\n  ") + "  "), (RECV, "  " + RECV + "    }\n")),
    "an index written from the count's parts, one of them a parameter's share": (
        (BLOCK, PARTS + "  const size_t block = per * width;\n"),
        (SEND, SEND.replace("x + p * block", "x + (size_t)p * per * width")),
        (RECV, RECV.replace("y + p * block", "y + (size_t)p * per * width"))),
    "a world size of the program's own, ++p, a cast peer": (
        ("  const size_t block", "  const int world = ctx->nRanks;\n  const size_t block"),
        (HEADER, "  for (int p = 0; p != world; ++p) {\n"),
        (SEND, SEND.replace(", p, ctx->comm", ", (int)p, ctx->comm").replace("p * block", "(size_t)p * block"))),
}
# edits -> the reason, word for word
REFUSED = {
    "skips itself without copying its own block": (
        (SEND, "    if (p == ctx->rank) continue;\n" + SEND),
        "line 14: the rank's own iteration does not just copy its block and go on"),
    "copies another block for itself": (
        (SEND, OWN.replace("y + p * block, x + p * block", "y + p * block, x")),
        "line 15: cudaMemcpyAsync's buffer `x` is not a block of one buffer"),
    "copies half its block": ((SEND, OWN.replace("(block) * sizeof", "(block / 2) * sizeof")),
                              "the rank's own copy moves `(block / 2) * sizeof(__nv_bfloat16)` bytes"),
    "stops one short": ((HEADER, HEADER.replace("p < ctx->nRanks", "p < ctx->nRanks - 1")),
                        "line 13: the loop runs to ctx->nRanks - 1, 1 at world 2: not once for every rank"),
    "sends to one peer every time": (
        (SEND, SEND.replace(", p, ctx->comm", ", (ctx->rank + 1) % ctx->nRanks, ctx->comm")),
        "ncclSend's peer `(ctx->rank + 1) % ctx->nRanks` does not reach every rank once at world 2"),
    "receives the wrong block": ((RECV, RECV.replace("y + p * block", "y + p * block / 2")),
                                 "ncclRecv's buffer is at index `p * block / 2`, not the peer times the count (block)"),
    "steps by bytes": ((SEND, SEND.replace("x + p * block", "(const char*)x + p * block")),
                       "`(const char*)x + p * block` steps by char, not by the __nv_bfloat16 its count is in"),
    "counts per peer": ((RECV, RECV.replace(", block, ncclBfloat16", ", block / 2, ncclBfloat16")),
                        "a size per peer (an all-to-allv) is not covered by the rules"),
    "counts down": ((HEADER, "  for (int p = ctx->nRanks - 1; p >= 0; p--) {\n"),
                    "the loop does not count up by one from 0"),
    "two sends": ((RECV, RECV + SEND), "the group's loops hold 2 ncclSend and 1 ncclRecv"),
    "an index from the count's parts, one part wrong": (
        (BLOCK, PARTS + "  const size_t block = per * width;\n"),
        (RECV, RECV.replace("y + p * block", "y + (size_t)p * per * 4")),
        "ncclRecv's buffer is at index `(size_t)p * per * 4`, not the peer times the count (block)"),
    "receives from itself beside its own copy": (
        (SEND, OWN.replace("      continue;\n    }\n", "    } else {\n  ") + "    }\n"),
        "line 19: ncclRecv runs for the rank itself too, beside the copy of its own block (line 14)"),
}


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_a_loop_over_every_peer_becomes_one_all_to_all(name, tmp_path):
    rw = _rewrite(_variant(tmp_path, *REWRITTEN[name]))
    assert f"CUCO_CUDA(ctx, {CALL});" in rw.code, rw.code
    assert "ncclSend" not in rw.code and no_host_collective_left(rw.code)
    assert rw.replaced[0].endswith("ncclSend/ncclRecv to every peer -> cuco::allToAll")


def test_the_loop_s_lines_are_gone_and_said_where():
    code = _rewrite(LOOP).code
    assert "for (int p" not in code and "/* the loop over peers of line 13: cuco::allToAll above */" in code


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_loop_that_is_not_an_all_to_all_is_refused_with_its_reason(name, tmp_path):
    *edits, words = REFUSED[name]
    with pytest.raises(RewriteError) as err:
        _rewrite(_variant(tmp_path, *edits))
    assert words in str(err.value)


def test_a_standalone_program_s_exchange_is_counted_by_init_and_rewritten(tmp_path):
    """`cuco init` on an expert-parallel exchange written with MPI and a loop of sends and receives: the bound counts
    what each rank receives, reference.py's stubs name the all-to-all (and torch's call for it), and the rules
    rewrite the seed's loop into one cuco::allToAll."""
    from cuco.scaffold import create_workload

    root = create_workload("ep", ROOT / "tests" / "init_programs" / "ep_alltoall.cu", tmp_path).root
    spec = load_workload(root)
    assert spec.bounds.comm_bytes == "(world - 1) * (tokens / world * hidden) * 2"
    assert all(spec.buffers[b].symmetric for b in ("send", "recv"))
    reference = (spec.source.parent / "reference.py").read_text()
    assert "ncclAlltoAll (send -> recv)" in reference and "dist.all_to_all_single(out, view.bufs['send']" in reference
    rw = rewrite(spec.seed_path, spec)
    assert "cuco::allToAll(ctx, cuco_buffer(ctx, \"recv\")->window, 0, send, (chunk) * sizeof(__nv_bfloat16), " \
           "stream)" in rw.code and no_host_collective_left(rw.code)


def test_two_exchanges_are_two_all_to_alls_each_with_its_own_buffers(tmp_path):
    """Dispatch, expert work, combine: two loops over every peer, each read as its own all-to-all in reference.py's
    stubs (the combine's receive is not the dispatch's)."""
    from cuco.scaffold import create_workload

    src = (ROOT / "tests" / "init_programs" / "ep_alltoall.cu").read_text()
    back = ("    CHECK_NCCL(ncclGroupStart());\n    for (int peer = 0; peer < nranks; ++peer) {\n"
            "      CHECK_NCCL(ncclSend(recv + peer * chunk, chunk, ncclBfloat16, peer, comm, stream));\n"
            "      CHECK_NCCL(ncclRecv(back + peer * chunk, chunk, ncclBfloat16, peer, comm, stream));\n"
            "    }\n    CHECK_NCCL(ncclGroupEnd());\n")
    edits = (("  __nv_bfloat16 *send, *recv;", "  __nv_bfloat16 *send, *recv, *back;"),
             ("  CHECK_CUDA(cudaMalloc(&recv, tokens * hidden * sizeof(__nv_bfloat16)));\n",
              "  CHECK_CUDA(cudaMalloc(&recv, tokens * hidden * sizeof(__nv_bfloat16)));\n"
              "  CHECK_CUDA(cudaMalloc(&back, tokens * hidden * sizeof(__nv_bfloat16)));\n"),
             ("    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n",
              "    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);\n" + back))
    for old, new in edits:
        assert old in src
        src = src.replace(old, new)
    (tmp_path / "p.cu").write_text(src)
    reference = (create_workload("w", tmp_path / "p.cu", tmp_path).root / "reference.py").read_text()
    assert "ncclAlltoAll (send -> recv)" in reference and "ncclAlltoAll (recv -> back)" in reference
