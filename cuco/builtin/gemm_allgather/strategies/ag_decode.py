"""Decode AllGather + GEMM in one kernel (cuco.kernels.decode_allgather): the decode GEMM's programs gather the
rows first, then stream the weights on every SM.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    lsa: stores over NVLink into every peer's gathered buffer (torch symmetric memory), from the kernel
  placement  fused: the gather is the GEMM launch's first phase: no collective, no second launch, no host
  sync       global: one counter per rank, bumped by every program of every rank once its share is stored
  issuer     cta: every program stores an equal share of this rank's rows
  chunks     slices of K per column tile (split-K); tiles widen where the programs would outnumber the SMs
  prefetch_rows  (the strategy's option, workload.toml) rows of its weights each program asks L2 for before it
             waits for the gathered rows, so that the weights stream under the gather (0: none)
Above 128 gathered rows (a prefill step) the decode kernel does not apply: the rows are all-gathered by NCCL and
multiplied by cuBLAS instead.

Invariants: two gathered buffers by run parity, one counter that only grows (zeroed before the rendezvous); the
split slices' workspace is made in setup.
Requires: all ranks on one NVLink domain (peer-mapped symmetric memory).
"""

import torch
import torch.distributed as dist

from cuco.kernels.decode import MAX_ROWS
from cuco.kernels.decode_allgather import Gather, gathered_decode_workspace, gemm_decode_gathered
from cuco.kernels.symmetric import symmetric_tensor

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "lsa", "chunks": 1, "issuer": "cta", "placement": "fused", "sync": "global"}

SPLIT_K = DESIGN["chunks"]
PREFETCH_ROWS = DESIGN.get("prefetch_rows", 0)


def setup(ctx):
    a, b = ctx.buffers["a"], ctx.buffers["b"]
    rows, k = a.shape
    m, world, rank = rows * ctx.world, ctx.world, ctx.rank
    if m > MAX_ROWS:
        return
    gathered, hg = symmetric_tensor(2 * m * k, a.dtype, a.device, ctx.group.group_name)
    arrived, ha = symmetric_tensor(1, torch.int32, a.device, ctx.group.group_name, zeroed=True)
    row_bytes = k * a.element_size()

    def ptrs(values):
        return torch.tensor(values, dtype=torch.int64, device=a.device)

    ctx.state.update(
        run=0, arrived=arrived, gathered=gathered.view(2, m, k), flags=ptrs(ha.buffer_ptrs),
        dests=[ptrs([hg.buffer_ptrs[s] + (parity * m + rank * rows) * row_bytes for s in range(world)])
               for parity in range(2)],
        workspace=gathered_decode_workspace(m, b.shape[1], k, a.device, SPLIT_K))


def run(ctx):
    a, b, c = (ctx.buffers[k] for k in ("a", "b", "c"))
    st = ctx.state
    if not st:  # a prefill shape
        gathered = ctx.buffers["a_gathered"]
        dist.all_gather_into_tensor(gathered, a, group=ctx.group)
        torch.matmul(gathered, b, out=c)
        return
    st["run"] += 1
    parity = st["run"] % 2
    gather = Gather(st["gathered"][parity], ctx.rank * a.shape[0], st["dests"][parity], st["flags"], st["arrived"],
                    st["run"])
    gemm_decode_gathered(a, b, c, gather, st["workspace"], split_k=SPLIT_K, prefetch_rows=PREFETCH_ROWS)


def teardown(ctx):
    ctx.state.clear()
