"""GEMM + ReduceScatter, fused: one Triton kernel (cuco.kernels.gemm) multiplies and reduce-scatters.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into the owners' memory (torch symmetric memory), from the GEMM's epilogue
  placement  fused: each tile of another rank's rows is stored, as it finishes, into that rank's receive slot
             for this rank; this rank's own rows come last, and each of their tiles, once the peers' partials
             of it have landed, is summed with them in rank order (fp32) and stored to c. No partial product in
             memory, no reduction kernel, no chunked GEMMs
  sync       tile: one counter per (sender, tile) on the owner, bumped by the sender's release
  issuer     cta: the program that computed a tile stores and releases it
  chunks     1 (the tile is the unit)

Invariants: cuco.kernels.symmetric.PartialsExchange (two receive buffers by run parity, counters that only grow,
zeroed before the rendezvous). The sum is in rank order: a tile has the same bits whichever partial lands first.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory); M divisible by the world size.
"""

from cuco.kernels.gemm import gemm_reduce_scatter
from cuco.kernels.symmetric import partials_exchange

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "fused", "sync": "tile"}


def setup(ctx):
    ctx.state["exchange"] = partials_exchange(ctx.buffers["c"], ctx.rank, ctx.world, ctx.group.group_name)


def run(ctx):
    gemm_reduce_scatter(ctx.buffers["a"], ctx.buffers["b"], ctx.buffers["c"], ctx.state["exchange"].next_run())


def teardown(ctx):
    ctx.state.clear()
