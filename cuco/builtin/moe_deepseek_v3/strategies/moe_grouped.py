"""The MoE layer with no host in the loop: the exchange on the GPU (cuco.kernels.moe_exchange) around the experts
in cuco.kernels' grouped GEMM, which reads its group sizes from device memory.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: the counts, the dispatch and the combine are stores over NVLink into the peers' memory (torch
             symmetric memory), each phase released by its programs and awaited by a one-program kernel
  placement  deferred: counts, dispatch, every local expert (two grouped launches: w13 with the SwiGLU epilogue,
             w2), the outputs back, the combine, on one stream
  sync       global: one counter per phase and sender
  issuer     cta: a program moves whole rows, many rows per program
  chunks     1
Each rank routes (top-k, softmax over the chosen logits) and sorts its pairs by expert on the device; every rank
then lays the moves out alike from every rank's counts: a pair's token row goes straight to its place in the
owner's expert-major rows, where the grouped GEMM reads it, and each output straight to its pair's sorted place
in the source's back, where the combine reads it (a token's k outputs weighted in fp32, in pick order).

Invariants: cuco.kernels.moe_exchange (counters that only grow; each phase's wait orders the next run's stores
after the peers' reads); a run allocates only torch's routing temporaries.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

import torch

from cuco.kernels.combine import combine
from cuco.kernels.grouped_gemm import grouped_gemm, grouped_swiglu, sort_by_expert
from cuco.kernels.moe_exchange import COMBINE, COUNTS, DISPATCH, exchange_plan, moe_exchange

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "deferred", "sync": "global"}


def setup(ctx):
    p, x = ctx.params, ctx.buffers["x"]
    pairs = p["T"] * p["TOPK"]
    group = ctx.group.group_name if ctx.world > 1 else None
    ex = moe_exchange(ctx.rank, ctx.world, p["E"], pairs, p["HID"], x.dtype, x.device, group)
    rows = ex.rows.shape[0]
    ctx.state.update(exchange=ex, h=torch.empty(rows, p["FF"], dtype=x.dtype, device=x.device),
                     out=torch.empty(rows, p["HID"], dtype=x.dtype, device=x.device))


def run(ctx):
    p, b, s = ctx.params, ctx.buffers, ctx.state
    ex, k = s["exchange"], p["TOPK"]
    vals, idx = b["logits"].topk(k, dim=-1)
    weight = torch.softmax(vals, dim=-1)
    layout = sort_by_expert(idx, p["E"])
    ex.next_run()
    ex.publish_counts(layout.offs)
    ex.wait(COUNTS)
    plan = exchange_plan(ex.counts, ctx.rank, idx.flatten()[layout.order], layout.offs, ex.rows.shape[0])
    ex.dispatch(b["x"], layout.order // k, plan)
    ex.wait(DISPATCH)
    grouped_swiglu(ex.rows, plan.recv_offs, b["w13"], s["h"])
    grouped_gemm(s["h"], plan.recv_offs, b["w2"], s["out"])
    ex.send_back(s["out"], plan)
    ex.wait(COMBINE)
    where = torch.empty_like(layout.order)
    where[layout.order] = torch.arange(len(where), device=where.device)
    combine(ex.back, where, weight, b["y"])


def teardown(ctx):
    ctx.state.clear()
