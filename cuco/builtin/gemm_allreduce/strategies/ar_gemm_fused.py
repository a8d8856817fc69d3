"""Decode GEMM + AllReduce, fused: one Triton kernel (cuco.kernels.gemm) multiplies and all-reduces.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into every peer's memory (torch symmetric memory), from the GEMM's epilogue
  placement  fused: each tile, as it finishes, is stored into every peer's receive slot for this rank and
             released; then, once the peers' partials of it have landed, summed with them in rank order and
             stored to c. The one-shot all-reduce happens in the GEMM's tail: no kernel after it, no barrier
  sync       tile: one counter per (sender, tile) on every rank, bumped by the sender's release
  issuer     cta: the program that computed a tile stores and releases it
  chunks     1 (the tile is the unit)

Invariants: cuco.kernels.symmetric.PartialsExchange (two receive buffers by run parity, counters that only grow,
zeroed before the rendezvous). Every partial is rounded to bf16 as it is sent, this rank's own too, and the sum
is in rank order: every rank stores the same bits.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

from cuco.kernels.gemm import gemm_all_reduce
from cuco.kernels.symmetric import partials_exchange

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "fused", "sync": "tile"}


def setup(ctx):
    ctx.state["exchange"] = partials_exchange(ctx.buffers["c"], ctx.rank, ctx.world, ctx.group.group_name)


def run(ctx):
    gemm_all_reduce(ctx.buffers["a"], ctx.buffers["b"], ctx.buffers["c"], ctx.state["exchange"].next_run())


def teardown(ctx):
    ctx.state.clear()
