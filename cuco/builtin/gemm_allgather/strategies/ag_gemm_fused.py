"""GEMM + AllGather, fused: one Triton kernel (cuco.kernels.gemm) gathers A and multiplies it.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into the peers' memory (torch symmetric memory), from inside the kernel
  placement  fused: programs of the GEMM's own launch push this rank's rows to every peer, chunk by chunk;
             the GEMM's tiles compute the local rows first, then each peer row block once its chunk's counter
             has reached this run's number (acquire), so the tile, not a chunked cuBLAS call, is the unit
             of overlap: no launch per chunk and no chunk-sized GEMMs; the pushing programs take the peers'
             tiles too once their rows are out
  sync       chunk: one counter per (shard, chunk) on the receiver, bumped by the sender's release
  issuer     cta: each push program stores whole chunks, then releases them
  chunks     pieces each shard is sent in

Invariants: the gathered rows land in one of two buffers, by the parity of the run, so a peer that is one run
ahead never overwrites rows this rank's GEMM still reads (a rank two runs ahead is impossible: its previous run
waited for this rank's pushes, which this rank's previous kernel, ended by then, made). Counters only grow (one
per run per chunk), as does the work counter the programs take tiles from, so they are zeroed once, in setup,
before the rendezvous that every rank must reach.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

import torch

from cuco.kernels.gemm import Arrival, Push, gemm_gathered
from cuco.kernels.symmetric import symmetric_tensor

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "fused", "sync": "chunk"}

# Programs (SMs) that push: 16 x 16 KiB per step (cuco.kernels.gemm.PUSH_ROWS x PUSH_COLS) keep ~256 KiB of stores
# in flight, about the link's rate (~350 GB/s per direction) times its latency (~1 us); the other SMs compute.
PUSH_PROGRAMS = 16


def setup(ctx):
    a = ctx.buffers["a"]
    shard, k = a.shape
    m, world, rank = shard * ctx.world, ctx.world, ctx.rank
    chunks = DESIGN["chunks"]
    gathered, hg = symmetric_tensor(2 * m * k, a.dtype, a.device, ctx.group.group_name)
    flags, hf = symmetric_tensor(world * chunks, torch.int32, a.device, ctx.group.group_name, zeroed=True)
    peers = [(rank + i) % world for i in range(1, world)]  # ring order: every peer's chunk 0 goes first
    row_bytes = k * a.element_size()
    ctx.state.update(
        run=0, flags=flags, a_all=gathered.view(2, m, k), shard=shard, chunks=chunks,
        work=torch.zeros(1, dtype=torch.int32, device=a.device),
        pushes=[Push(torch.tensor([hg.buffer_ptrs[p] + (parity * m + rank * shard) * row_bytes for p in peers],
                                  dtype=torch.int64, device=a.device),
                     torch.tensor([hf.buffer_ptrs[p] for p in peers], dtype=torch.int64, device=a.device),
                     shard=rank, programs=PUSH_PROGRAMS) for parity in range(2)])


def run(ctx):
    st = ctx.state
    st["run"] += 1
    parity = st["run"] % 2
    arrival = Arrival(st["a_all"][parity], ctx.rank * st["shard"], st["shard"], st["chunks"], st["flags"], st["run"],
                      st["work"])
    gemm_gathered(ctx.buffers["a"], ctx.buffers["b"], ctx.buffers["c"], arrival,
                  st["pushes"][parity] if ctx.world > 1 else None)


def teardown(ctx):
    ctx.state.clear()
