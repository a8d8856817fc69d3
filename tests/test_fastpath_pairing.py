"""Grouped send/recv: each send is rewritten into the receive NCCL would deliver it to, on every rank at every world
size, or the group is refused with the reason. Checked without GPUs: NCCL's matching is simulated for every rank at
world sizes 3, 4 and 8 (where next and prev differ, unlike at 2) and compared with the rewrite's pairing."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest
from conftest import ROOT, WORKLOADS

from cuco.fastpath.analyze import analyze
from cuco.fastpath.peers import Call, PeerExpression, pair
from cuco.fastpath.rewrite import RewriteError, rewrite
from cuco.workload import load_workload

RING = WORKLOADS / "sendrecv_ring"
GROUP = """#include "cuco.h"
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {{ return 0; }}
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {{
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  const int next = (ctx->rank + 1) % ctx->nRanks, prev = (ctx->rank + ctx->nRanks - 1) % ctx->nRanks;
  ncclGroupStart();
{calls}
  ncclGroupEnd();
  return 0;
}}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {{ return 0; }}
"""


def _program(tmp_path, *calls: str):
    path = tmp_path / "p.cu"
    path.write_text(GROUP.format(calls="\n".join(f"  {c};" for c in calls)))
    return path


def nccl_deliveries(sends: list[Call], recvs: list[Call], scalars, world: int) -> dict[tuple[int, int], int]:
    """(rank, send index) -> the receive index it fills on its peer, by NCCL's rule: per (source, destination)
    pair, sends and receives are matched in the order each rank posts them."""
    queues: dict[tuple[int, int], deque] = defaultdict(deque)
    for r in range(world):
        for i, c in enumerate(sends):
            queues[(r, PeerExpression(c.peer, scalars)(r, world))].append((r, i))
    out = {}
    for q in range(world):
        for j, c in enumerate(recvs):
            out[queues[(PeerExpression(c.peer, scalars)(q, world), q)].popleft()] = j
    assert not any(queues.values()), "a send nobody receives"
    return out


@pytest.mark.parametrize("program", [RING / "seed.cu", ROOT / "tests" / "fastpath" / "host_halo_exchange.cu"],
                         ids=["ring", "halo_exchange"])
@pytest.mark.parametrize("world", [3, 4, 8])
def test_rewritten_pairing_is_what_nccl_delivers(program, world):
    a = analyze(program)
    sends = [Call(o.line, o.args["peer"]) for o in a.ops if o.name == "ncclSend"]
    recvs = [Call(o.line, o.args["peer"]) for o in a.ops if o.name == "ncclRecv"]
    scalars = a.scalars["cuco_run"]
    pairing = pair(sends, recvs, scalars)
    assert nccl_deliveries(sends, recvs, scalars, world) == {(r, i): pairing[i] for r in range(world)
                                                             for i in range(len(sends))}


def test_sends_paired_by_position_with_receives_from_other_peers_are_refused(tmp_path):
    """send next, send prev, recv next, recv prev: at world 2 the first send fills the first receive, from 3 on
    the second one; no static rewrite is right at both, so none is made."""
    src = _program(tmp_path, "ncclSend(x->ptr, n, ncclBfloat16, next, ctx->comm, ctx->stream)",
                   "ncclSend(x->ptr, n, ncclBfloat16, prev, ctx->comm, ctx->stream)",
                   "ncclRecv(y->ptr, n, ncclBfloat16, next, ctx->comm, ctx->stream)",
                   "ncclRecv(y->ptr, n, ncclBfloat16, prev, ctx->comm, ctx->stream)")
    with pytest.raises(RewriteError, match=r"line 7: the ncclSend of line 8 lands in the ncclRecv of line 10 at "
                                           r"world 2 but of line 11 at world 3 \(rank 0\): no one pairing is right"):
        rewrite(src, load_workload(RING))


@pytest.mark.parametrize("peers,reason", [
    (("ctx->rank ^ 1", "ctx->rank ^ 1"), r"at world 3, rank 2's peer `ctx->rank \^ 1` \(line 8\) is 3, not a rank"),
    (("next", "next"), r"at world 3, rank 0's ncclSend of line 8 to rank 1 has no ncclRecv from rank 0 on rank 1"),
    (("peers[0]", "prev"), r"peer `peers\[0\]`: `peers\[0\]` is not arithmetic the rules can evaluate"),
    (("nranks - 1", "prev"), r"peer `nranks - 1` depends on `nranks`, which the program does not define"),
])
def test_groups_whose_pairing_cannot_be_proved_are_refused_with_the_reason(tmp_path, peers, reason):
    src = _program(tmp_path, f"ncclSend(x->ptr, n, ncclBfloat16, {peers[0]}, ctx->comm, ctx->stream)",
                   f"ncclRecv(y->ptr, n, ncclBfloat16, {peers[1]}, ctx->comm, ctx->stream)")
    with pytest.raises(RewriteError, match=reason):
        rewrite(src, load_workload(RING))


def test_a_peer_assigned_in_a_loop_is_not_taken_for_its_first_value(tmp_path):
    path = tmp_path / "loop.cu"
    path.write_text(GROUP.format(calls="  for (int p = 1; p < 2; ++p) {\n"
                                       "    ncclSend(x->ptr, n, ncclBfloat16, p, ctx->comm, ctx->stream);\n"
                                       "    ncclRecv(y->ptr, n, ncclBfloat16, p, ctx->comm, ctx->stream);\n  }"))
    with pytest.raises(RewriteError, match=r"line 8: the loop does not count up by one from 0"):
        rewrite(path, load_workload(RING))
