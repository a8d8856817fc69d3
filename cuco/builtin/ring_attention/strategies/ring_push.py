"""Ring attention whose blocks of K and V are pushed ahead of the attention that needs them, the attention side
waiting on a signal per block on the GPU instead of the host waiting for a transfer.

DESIGN, below, is the design point (the directive proposer writes each candidate's in its place):
  backend    ce: each block is copied by the copy engine straight into the next rank's buffer (torch symmetric
             memory), then a signal is put into that rank's signal pad; the receiving stream waits on it (GPUs
             only) | nccl_host: batched NCCL send/recv, the stream waiting on the request
  placement  deferred: every rank's block gathered, then all the attention | stream_overlap: the ring; the block
             in hand goes on to the next rank (side stream) while it is attended
  sync       global: the whole of a block (deferred: of every block) waited for before any of it is attended |
             chunk (stream_overlap): each piece waited for just before it is attended
  chunks     1: a block of two zig-zag chunks moves and is attended whole (one attention call where the query
             chunk sees both in full) | 2: attended chunk by chunk; on ce its chunks also move as two pieces,
             each attended once it has arrived

Zig-zag: rank r holds sequence chunks r and 2*world-1-r. A query chunk sees a key chunk whole if it comes earlier,
causally if it is the same chunk, not at all if it comes later. Attention is cuco.kernels.attention's block (torch's
cuDNN attention on GPUs, chosen per shape; grouped-query heads in the buffers' own [L, heads, D] layout, never
repeated); each query chunk's output starts from its first block and every further one merges by the log-sum-exp
in one fused pass over the output (O and the log-sum-exp in place).
"""

import math

import torch
import torch.distributed as dist

from cuco.kernels.attention import block_attention, merge_lse_

# The design point this file runs at as it is; each candidate has its own here (cuco.evolve.strategy).
DESIGN = {"backend": "ce", "chunks": 1, "issuer": "cta", "placement": "deferred", "sync": "global"}

# The side stream the ring on the copy engine pushes on: asked for there alone (every run joins each one it gives).
SIDE_STREAMS = 1 if DESIGN["placement"] != "deferred" and DESIGN["backend"] == "ce" else 0
ARRIVED = 0  # signal channels: ARRIVED + piece for a piece in a slot; FREE once a slot may be written again


class Accumulator:
    """This rank's output per query chunk in fp32, and its log-sum-exp (the lse output itself); a chunk's first block
    is copied in, every further one merged."""

    def __init__(self, q, lse):
        self.acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        self.lse = lse
        self.started = set()

    def add(self, rows: slice, out, lse) -> None:
        merge_lse_(self.acc[rows], self.lse[:, rows], out, lse, first=rows.start not in self.started)
        self.started.add(rows.start)


def _attend_block(acc, q, k, v, key_chunks, world, rank, c, scale, whole):
    """Attention of this rank's query chunks to a block holding key_chunks (c rows each, in order)."""
    for i, qi in enumerate((rank, 2 * world - 1 - rank)):
        rows = slice(i * c, (i + 1) * c)
        seen = [j for j, kj in enumerate(key_chunks) if kj <= qi]
        if whole and len(key_chunks) > 1 and all(kj < qi for kj in key_chunks):  # the block whole: one call
            acc.add(rows, *block_attention(q[rows], k, v, False, scale))
            continue
        for j in seen:
            keys = slice(j * c, (j + 1) * c)
            acc.add(rows, *block_attention(q[rows], k[keys], v[keys], key_chunks[j] == qi, scale))


def _chunks_of(src, world):
    return (src, 2 * world - 1 - src)


def setup(ctx):
    if DESIGN["backend"] != "ce":
        return
    if ctx.device.type != "cuda":
        raise RuntimeError("backend ce copies blocks between GPUs (torch symmetric memory): it needs GPUs")
    import torch.distributed._symmetric_memory as symm_mem

    k = ctx.buffers["k"]
    slots = ctx.world if DESIGN["placement"] == "deferred" else 2
    symm_mem.enable_symm_mem_for_group(ctx.group.group_name)
    ring = symm_mem.empty((slots, 2, *k.shape), dtype=k.dtype, device=ctx.device)  # [slot][K or V][rows, KV, D]
    hdl = symm_mem.rendezvous(ring, ctx.group.group_name)
    ctx.state.update(ring=ring, hdl=hdl, peers=[hdl.get_buffer(p, tuple(ring.shape), ring.dtype)
                                                for p in range(ctx.world)])


def _pieces(rows, c):
    return [slice(0, rows)] if DESIGN["chunks"] == 1 else [slice(0, c), slice(c, rows)]


def run(ctx):
    q, k, v, o, lse = (ctx.buffers[n] for n in ("q", "k", "v", "o", "lse"))
    world, rank = ctx.world, ctx.rank
    c, scale = q.shape[0] // 2, 1.0 / math.sqrt(q.shape[2])
    acc = Accumulator(q, lse)
    whole = DESIGN["chunks"] == 1
    if DESIGN["placement"] == "deferred":
        blocks = _gather(ctx, k, v)
        for src in range(world):
            kb, vb = blocks[src]
            _attend_block(acc, q, kb, vb, _chunks_of(src, world), world, rank, c, scale, whole)
    elif DESIGN["backend"] == "ce":
        _ring_ce(ctx, acc, q, k, v, c, scale, whole)
    else:
        _ring_nccl(ctx, acc, q, k, v, c, scale, whole)
    o.copy_(acc.acc)


def _gather(ctx, k, v):
    """Every rank's (K, V), by rank: one all-gather (nccl_host) or a push of this rank's block into every peer's
    slot, then one wait per peer (ce)."""
    world, rank = ctx.world, ctx.rank
    if DESIGN["backend"] == "nccl_host":
        out = torch.empty((2 * world, *k.shape), dtype=k.dtype, device=k.device)  # [rank's K, rank's V] by rank
        dist.all_gather_into_tensor(out, torch.stack([k, v]), group=ctx.group)
        return [(out[2 * p], out[2 * p + 1]) for p in range(world)]
    hdl, ring, peers = ctx.state["hdl"], ctx.state["ring"], ctx.state["peers"]
    for p in range(world):
        if p != rank:
            for piece in _pieces(k.shape[0], k.shape[0] // 2):
                peers[p][rank, 0, piece].copy_(k[piece])
                peers[p][rank, 1, piece].copy_(v[piece])
            hdl.put_signal(p, ARRIVED)
    for p in range(world):
        if p != rank:
            hdl.wait_signal(p, ARRIVED)
    return [(k, v) if p == rank else (ring[p, 0], ring[p, 1]) for p in range(world)]


def _ring_nccl(ctx, acc, q, k, v, c, scale, whole):
    """The pipelined ring on NCCL: the block in hand is sent on while it is attended; the stream waits for the
    next block only before attending it."""
    world, rank = ctx.world, ctx.rank
    ring = ctx.buffers["kv_ring"].view(2, 2, *k.shape)  # [slot][K or V][rows, KV, D]
    hand = torch.stack([k, v]) if world > 1 else None
    for step in range(world):
        kb, vb = (k, v) if step == 0 else (hand[0], hand[1])
        reqs = []
        if step < world - 1:
            nxt = ring[(step + 1) % 2]
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, hand, (rank + 1) % world, ctx.group),
                                           dist.P2POp(dist.irecv, nxt, (rank - 1) % world, ctx.group)])
        _attend_block(acc, q, kb, vb, _chunks_of((rank - step) % world, world), world, rank, c, scale, whole)
        for req in reqs:
            req.wait()
        if step < world - 1:
            hand = nxt


def _ring_ce(ctx, acc, q, k, v, c, scale, whole):
    """The pipelined ring on the copy engine. Step s attends the block received at step s - 1, held in slot s % 2
    (step 0: this rank's own K and V); the side stream pushes the block in hand into the next rank's slot
    (s + 1) % 2 and signals each piece. The next rank must have finished with that slot (its step s - 1) before
    it is written again: it says so with a FREE signal once that step's attention and push are done."""
    world, rank = ctx.world, ctx.rank
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    hdl, ring, peer = ctx.state["hdl"], ctx.state["ring"], ctx.state["peers"][nxt]
    pieces = _pieces(k.shape[0], c)
    free = ARRIVED + len(pieces)
    main, side = torch.cuda.current_stream(), ctx.side_streams[0]
    for step in range(world):
        kb, vb = (k, v) if step == 0 else (ring[step % 2, 0], ring[step % 2, 1])
        if step < world - 1:
            side.wait_stream(main)  # the block in hand has arrived (main waited on its signals)
            with torch.cuda.stream(side):
                if step >= 1:
                    hdl.wait_signal(nxt, free)
                for i, piece in enumerate(pieces):
                    peer[(step + 1) % 2, 0, piece].copy_(kb[piece])
                    peer[(step + 1) % 2, 1, piece].copy_(vb[piece])
                    hdl.put_signal(nxt, ARRIVED + i)
        key_chunks = _chunks_of((rank - step) % world, world)
        per_piece = DESIGN["sync"] == "chunk"
        for i in range(len(pieces)) if step >= 1 and not per_piece else ():
            hdl.wait_signal(prv, ARRIVED + i)
        for i, piece in enumerate(pieces):
            if step >= 1 and per_piece:
                hdl.wait_signal(prv, ARRIVED + i)
            sub = key_chunks if len(pieces) == 1 else key_chunks[i:i + 1]
            _attend_block(acc, q, kb[piece], vb[piece], sub, world, rank, c, scale, whole)
        if 1 <= step <= world - 3:  # the previous rank writes this slot again at its step + 1
            main.wait_stream(side)
            hdl.put_signal(prv, free)
    main.wait_stream(side)

