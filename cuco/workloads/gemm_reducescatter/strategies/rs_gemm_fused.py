"""GEMM + ReduceScatter, fused: one Triton kernel (cuco.kernels.gemm) multiplies and reduce-scatters.

DESIGN (prepended by the directive proposer) picks the point:
  backend    lsa: stores over NVLink into the owners' memory (torch symmetric memory), from the GEMM's epilogue
  placement  fused: each tile of another rank's rows is stored, as it finishes, into that rank's receive slot
             for this rank; this rank's own rows come last, and each of their tiles, once the peers' partials
             of it have landed, is summed with them in rank order (fp32) and stored to c. No partial product in
             memory, no reduction kernel, no chunked GEMMs
  sync       tile: one counter per (sender, tile) on the owner, bumped by the sender's release
  issuer     cta: the program that computed a tile stores and releases it
  chunks     1 (the tile is the unit)

Invariants: the receive slots are two buffers, by the parity of the run, so a sender one run ahead never
overwrites partials its owner still reads (two runs ahead is impossible: the sender's previous run waited for
this rank's partials, which this rank's previous kernel, ended by then, sent). Counters only grow (one per run),
so they are zeroed once, in setup, before the rendezvous every rank must reach. The sum is in rank order, so a
tile has the same bits whichever partial lands first.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory); M divisible by the world size.
"""

import torch
import torch.distributed._symmetric_memory as symm_mem

from cuco.kernels.gemm import Scatter, gemm_reduce_scatter, scatter_counters


def setup(ctx):
    c = ctx.buffers["c"]
    shard, n = c.shape
    world, rank = ctx.world, ctx.rank
    recv = symm_mem.empty(2 * world * shard * n, dtype=c.dtype, device=c.device)
    counters = symm_mem.empty(scatter_counters(world, shard, n), dtype=torch.int32, device=c.device)
    counters.zero_()
    torch.cuda.current_stream().synchronize()  # zeroed before any peer can pass the rendezvous and push
    hr = symm_mem.rendezvous(recv, ctx.group.group_name)
    hc = symm_mem.rendezvous(counters, ctx.group.group_name)
    slot_bytes = shard * n * c.element_size()
    ctx.state.update(
        run=0, recv=recv.view(2, world, shard, n), counters=counters,
        dest=[torch.tensor([hr.buffer_ptrs[s] + (parity * world + rank) * slot_bytes if s != rank else 0
                            for s in range(world)], dtype=torch.int64, device=c.device) for parity in range(2)],
        flags=torch.tensor([hc.buffer_ptrs[s] if s != rank else 0 for s in range(world)], dtype=torch.int64,
                           device=c.device))


def run(ctx):
    st = ctx.state
    st["run"] += 1
    parity = st["run"] % 2
    scatter = Scatter(ctx.rank, ctx.world, st["recv"][parity], st["counters"], st["dest"][parity], st["flags"],
                      st["run"])
    gemm_reduce_scatter(ctx.buffers["a"], ctx.buffers["b"], ctx.buffers["c"], scatter)


def teardown(ctx):
    ctx.state.clear()
