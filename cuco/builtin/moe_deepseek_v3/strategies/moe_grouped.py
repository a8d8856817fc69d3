"""The MoE layer with no host in the loop (cuco.kernels.moe_layer): the exchange on the GPU (counts, dispatch and
combine as stores into the peers' torch symmetric memory) around the local experts in cuco.kernels' grouped GEMM,
which reads its group sizes from device memory.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into the peers' memory, each phase released by its programs and awaited by a
             one-program kernel
  placement  deferred: counts, the whole dispatch, every local expert (two grouped launches: w13 with the SwiGLU
             epilogue, w2), the whole way back, the combine, on one stream |
             stream_overlap: the local experts in `chunks` groups; the dispatch group by group on side stream 0,
             each group's experts started once its rows are in, each group's outputs back on side stream 1 while
             the next computes; the scatters on cuco.kernels.moe_exchange.PUT_SMS SMs, the GEMMs on the rest
  sync       global: the experts wait for the whole dispatch | chunk (stream_overlap): each group for its own rows
             (a counter per group and sender)
  issuer     cta: a program moves whole rows, eight at a time
  chunks     groups of consecutive local experts (1: deferred; more: stream_overlap)
  once       (the strategy's option, workload.toml) each token sent once to each rank that owns one of its picks,
             the experts gathering their pairs' rows from those, and back once from each, its picks there summed
             (deferred only); else a row per pick each way
Each rank routes (top-k, softmax over the chosen logits) and sorts its pairs by expert on the device; every rank
lays the moves out alike from every rank's counts: a pair's token row goes straight to its place in the owner's
expert-major rows, where the grouped GEMM reads it, and each output straight to its pair's sorted place in the
source's back, where the combine reads it (a token's k outputs weighted in fp32, in pick order).

Invariants: cuco.kernels.moe_exchange (counters that only grow; each phase's wait orders the next run's stores
after the peers' reads); a run allocates only the routing's and the plan's small temporaries (from torch's
caching allocator, so no device allocation after the first run).
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

from cuco.kernels.moe_layer import moe_layer, run_layer

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "deferred", "sync": "global"}

SIDE_STREAMS = 2 if DESIGN["placement"] == "stream_overlap" else 0
ONCE = DESIGN.get("once", False)


def setup(ctx):
    p, x = ctx.params, ctx.buffers["x"]
    group = ctx.group.group_name if ctx.world > 1 else None
    ctx.state["layer"] = moe_layer(ctx.rank, ctx.world, p["T"], p["HID"], p["E"], p["TOPK"], p["FF"], x.dtype,
                                   x.device, group, once=ONCE)


def run(ctx):
    b = ctx.buffers
    run_layer(ctx.state["layer"], b["x"], b["logits"], b["w13"], b["w2"], b["y"], groups=DESIGN["chunks"],
              per_group=DESIGN["sync"] == "chunk", sides=tuple(ctx.side_streams[:SIDE_STREAMS]))


def teardown(ctx):
    ctx.state.clear()
