"""Decode GEMM + AllReduce in one kernel (cuco.kernels.decode_allreduce): the decode GEMM, whose program that
computes a tile all-reduces it, with no second launch and no host in the loop.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into the peers' memory (torch symmetric memory), from the GEMM's epilogue
  placement  fused: each tile, once its slices are summed, goes to the peers and is summed in the same program
  sync       tile: one counter per (sender, tile) on the receiver, bumped by the sender's release
  issuer     cta: the program that computed a tile stores, releases and sums it
  chunks     tiles each program computes in turn (64 / chunks columns each): a tile's transfer drains over the
             links under the next tile's compute, and is released after it (one-shot only)
  two_shot   (the strategy's option, workload.toml) one-shot: every rank sums every tile; two-shot: tile t's
             owner (rank t % world) sums it and sends the sum back
Above 128 rows (a prefill step) the decode kernel does not apply: the tiled fused kernel
(cuco.kernels.gemm.gemm_all_reduce) runs instead.

Invariants: cuco.kernels.symmetric.PartialsExchange (two receive buffers by run parity, counters that only grow,
zeroed before the rendezvous; this rank's own slot holds its own tiles between the waves and the sums); a run
allocates nothing.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

from cuco.kernels.decode import MAX_ROWS
from cuco.kernels.decode_allreduce import gemm_all_reduce_decode
from cuco.kernels.gemm import gemm_all_reduce
from cuco.kernels.symmetric import partials_exchange

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "fused", "sync": "tile"}

WAVES = DESIGN["chunks"]
TWO_SHOT = DESIGN.get("two_shot", False)


def setup(ctx):
    ctx.state["exchange"] = partials_exchange(ctx.buffers["c"], ctx.rank, ctx.world, ctx.group.group_name)


def run(ctx):
    a, b, c = (ctx.buffers[k] for k in ("a", "b", "c"))
    parts = ctx.state["exchange"].next_run()
    if a.shape[0] > MAX_ROWS:
        gemm_all_reduce(a, b, c, parts)
    else:
        gemm_all_reduce_decode(a, b, c, parts, two_shot=TWO_SHOT, waves=WAVES)


def teardown(ctx):
    ctx.state.clear()
