"""CPU strategy: gloo's asynchronous all-gather of A in chunks, overlapped with the matmul.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  placement  deferred: all-gather, then one matmul | stream_overlap: local rows first, then each chunk's
             rows once it has arrived | split_put_wait: local rows, one wait, then the peers' rows
  sync       global: wait for every chunk before any peer rows | chunk: wait chunk by chunk
  chunks     pieces the shard is sent in
"""

import torch
import torch.distributed as dist

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "nccl_host", "chunks": 1, "issuer": "cta", "placement": "deferred", "sync": "global"}


def _rows(m, n):
    return [(m * j // n, m * (j + 1) // n) for j in range(n)]


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    world, rank, m = ctx.world, ctx.rank, a.shape[0]
    if DESIGN["placement"] == "deferred":
        dist.all_gather(list(a_full.chunk(world)), a, group=ctx.group)
        torch.matmul(a_full, b, out=c)
        return
    chunks = [(r0, r1) for r0, r1 in _rows(m, DESIGN["chunks"]) if r1 > r0]
    works = [dist.all_gather([a_full[p * m + r0:p * m + r1] for p in range(world)], a[r0:r1], group=ctx.group,
                             async_op=True) for r0, r1 in chunks]
    torch.matmul(a, b, out=c[rank * m:(rank + 1) * m])  # own rows: no communication needed
    peers = [p for p in range(world) if p != rank]
    if DESIGN["placement"] == "split_put_wait" or DESIGN["sync"] == "global":
        for w in works:
            w.wait()
    if DESIGN["placement"] == "split_put_wait":
        for p in peers:
            torch.matmul(a_full[p * m:(p + 1) * m], b, out=c[p * m:(p + 1) * m])
        return
    for w, (r0, r1) in zip(works, chunks):
        w.wait()
        for p in peers:
            torch.matmul(a_full[p * m + r0:p * m + r1], b, out=c[p * m + r0:p * m + r1])
