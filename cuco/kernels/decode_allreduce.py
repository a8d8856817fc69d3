"""The decode GEMM with the all-reduce in its tail: a row-parallel layer at 1 to 128 tokens in one kernel.

Program `tile` multiplies the rows of A by columns `tile` of B, the tiles as narrow as it takes for every SM to
stream B (the decode GEMM's way, cuco.kernels.decode, without splitting K: a tile's sum then leaves from the program
that made it, where split slices would add a pass through a workspace and a count, slower at every decode shape
measured: benchmarks/results/archive/decode_layer-gemm_allreduce-w2-NVIDIA_H200-20261128-1250.md). It rounds the
tile to bf16 and all-reduces it, with no second launch:
- one-shot: the tile is stored into every peer's receive slot for this rank and released there (one counter per
  sender and tile); then the peers' tiles are summed with it in rank order once their counters say they landed.
- two-shot: the tile's owner (rank tile % world) alone sums; the others store their tile into the owner's slot
  and wait for the owner to store the sum into theirs. The same bytes cross the links as one-shot at world 2,
  1 / world of them beyond, for one more crossing of latency.
- waves (one-shot): each program computes several narrower tiles in turn, a tile's transfer draining
  under the next one's compute (at the decode shapes of 2x H200 the narrower tiles stream B slower than this saves:
  benchmarks/results/decode_layer-gemm_allreduce-w2.md).
Every rank stores the same bits: each partial is rounded to bf16 as sent (this rank's own too) and summed in rank
order. Every program is resident at once (at most one per SM), so a tile's wait never keeps its sender's
program from running. Receive slots and counters come from cuco.kernels.symmetric.PartialsExchange.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from cuco.kernels.common import descriptor, interpreted, row_major, sm_count, tma_ok
from cuco.kernels.decode import MAX_ROWS, DecodeConfig, decode_config_for, slice_product
from cuco.kernels.gemm import Partials, store_rows, sum_in_rank_order

# Shared memory for a program's pipeline stages: Hopper gives a CTA at most 227 KB; the rest is Triton's scratch for
# the epilogue's layout changes.
SMEM_STAGES_BYTES = 192 * 1024
NARROWEST_TILE = 16  # columns: 32-byte rows of B, the L2's sector
WIDEST_TILE = 256  # columns: wider tiles hold a 128-row fp32 accumulator of more than 256 registers a thread


def summed_decode_config_for(m: int, n: int, k: int, sms: int, split_k: int = 1, waves: int = 1) -> DecodeConfig:
    """The decode GEMM's blocks by row count, with tiles of 64 columns (64 / waves where each program computes
    `waves` tiles in turn) widened until every program has an SM of its own: a tile waits for the peers' tiles, so
    none may wait for an SM. Stages are cut to what shared memory holds (blocks of K halved where two stages would
    not fit), and the tall tiles get 8 warps (the summing epilogue addresses each element)."""
    base = decode_config_for(m, n, k, sms)
    block_n = max(NARROWEST_TILE, 64 // waves)
    while triton.cdiv(triton.cdiv(n, block_n), waves) * split_k > sms and block_n < WIDEST_TILE:
        block_n *= 2
    block_m, block_k = max(16, triton.next_power_of_2(m)), base.block_k
    while 2 * (block_m * block_k + block_k * block_n) * 2 > SMEM_STAGES_BYTES:  # two stages of bf16 A and B blocks
        block_k //= 2
    stages = min(base.num_stages, SMEM_STAGES_BYTES // ((block_m * block_k + block_k * block_n) * 2))
    warps = 8 if block_m * block_n >= 64 * 128 else base.num_warps
    return replace(base, block_n=block_n, block_k=block_k, split_k=split_k, num_stages=stages, num_warps=warps)


@triton.jit
def _release(flag_ptrs, to, sender, tiles, t):
    """Counter (sender, t) on rank `to`, after every store before it (system scope, cumulative)."""
    flag = tl.load(flag_ptrs + to).to(tl.pointer_type(tl.int32))
    tl.atomic_add(flag + sender * tiles + t, 1, sem="release", scope="sys")


@triton.jit
def _landed(recv, counters, sender, tiles, t, rows, col, N, target, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tile t of rank `sender`'s slot, once its counter has reached the target."""
    while tl.atomic_add(counters + sender * tiles + t, 0, sem="acquire", scope="sys") < target:
        pass
    return _slot_tile(recv, sender, rows, col, N, BLOCK_M, BLOCK_N)


@triton.jit
def _slot_tile(recv, sender, rows, col, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rc = tl.arange(0, BLOCK_M)
    rn = col + tl.arange(0, BLOCK_N)
    mask = (rc[:, None] < rows) & (rn[None, :] < N)
    # .cg: from L2, never a line this SM kept from the previous run
    return tl.load(recv + sender * rows * N + rc[:, None] * N + rn[None, :], mask=mask, other=0.0,
                   cache_modifier=".cg")


@triton.jit
def _release_peers(flag_ptrs, t, tiles, world, rank):
    tl.debug_barrier()  # every thread's stores before the releases
    for i in range(1, world):
        _release(flag_ptrs, (rank + i) % world, rank, tiles, t)


@triton.jit
def _to_peers(tile, dtype, dest_ptrs, flag_ptrs, t, tiles, M, N, world, rank,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tile t into every peer's slot for this rank, then released on each (all stores before any release)."""
    for i in range(1, world):
        dest = tl.load(dest_ptrs + (rank + i) % world).to(tl.pointer_type(dtype))
        store_rows(dest, 0, t * BLOCK_N, M, tile, N, BLOCK_M, BLOCK_N)
    _release_peers(flag_ptrs, t, tiles, world, rank)


@triton.jit
def _all_reduce_tile(sent, out, recv, counters, dest_ptrs, flag_ptrs, t, tiles, M, N, world, rank, target,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TWO_SHOT: tl.constexpr):
    col = t * BLOCK_N
    dtype = out.dtype.element_ty
    if TWO_SHOT:
        owner = t % world
        if owner == rank:  # the peers' tiles summed here, the sum sent back
            total = sum_in_rank_order(sent, recv, counters, rank, world, tiles, t, M, 0, col, N, target,
                                       BLOCK_M, BLOCK_N).to(dtype)
            _to_peers(total, dtype, dest_ptrs, flag_ptrs, t, tiles, M, N, world, rank, BLOCK_M, BLOCK_N)
        else:
            dest = tl.load(dest_ptrs + owner).to(tl.pointer_type(dtype))
            store_rows(dest, 0, col, M, sent, N, BLOCK_M, BLOCK_N)
            tl.debug_barrier()  # every thread's stores before the release
            _release(flag_ptrs, owner, rank, tiles, t)
            total = _landed(recv, counters, owner, tiles, t, M, col, N, target, BLOCK_M, BLOCK_N)
    else:  # one-shot: every rank's tile to every peer, then every rank sums
        _to_peers(sent, dtype, dest_ptrs, flag_ptrs, t, tiles, M, N, world, rank, BLOCK_M, BLOCK_N)
        total = sum_in_rank_order(sent, recv, counters, rank, world, tiles, t, M, 0, col, N, target,
                                   BLOCK_M, BLOCK_N).to(dtype)
    store_rows(out, 0, col, M, total, N, BLOCK_M, BLOCK_N)


@triton.jit(do_not_specialize=["M", "world", "rank", "target"])
def _decode_ar_kernel(a_desc, b_desc, a, b, out, recv, counters, dest_ptrs, flag_ptrs, M, N, K, world, rank, target,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WAVES: tl.constexpr,
                      TWO_SHOT: tl.constexpr, TMA: tl.constexpr):
    """A tile a program, all-reduced by it; or (WAVES > 1, one-shot) WAVES tiles a program in turn (pid, pid +
    programs, ...): a tile's stores to the peers drain over the links while the program computes its next tile,
    and the tile is released only then, so the release's wait for them costs nothing; this rank's own copy waits
    in its slot of recv (unused by the peers) until the sums, which follow the last tile."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(N, BLOCK_N)
    dtype = out.dtype.element_ty
    if WAVES == 1:
        sent = slice_product(a_desc, a, b_desc, b, pid * BLOCK_N, 0, K, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        _all_reduce_tile(sent.to(dtype), out, recv, counters, dest_ptrs, flag_ptrs, pid, tiles, M, N, world, rank,
                         target, BLOCK_M, BLOCK_N, TWO_SHOT)
    else:
        _waves(a_desc, b_desc, a, b, out, recv, counters, dest_ptrs, flag_ptrs, M, N, K, world, rank, target,
               BLOCK_M, BLOCK_N, BLOCK_K, WAVES, TMA)


@triton.jit
def _waves(a_desc, b_desc, a, b, out, recv, counters, dest_ptrs, flag_ptrs, M, N, K, world, rank, target,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WAVES: tl.constexpr,
           TMA: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(N, BLOCK_N)
    dtype = out.dtype.element_ty
    for w in tl.static_range(WAVES):
        t = pid + w * programs
        if t < tiles:
            sent = slice_product(a_desc, a, b_desc, b, t * BLOCK_N, 0, K, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                 TMA).to(dtype)
            store_rows(recv + rank * M * N, 0, t * BLOCK_N, M, sent, N, BLOCK_M, BLOCK_N)
            for i in range(1, world):
                dest = tl.load(dest_ptrs + (rank + i) % world).to(tl.pointer_type(dtype))
                store_rows(dest, 0, t * BLOCK_N, M, sent, N, BLOCK_M, BLOCK_N)
        if w > 0:
            if t - programs < tiles:  # the previous tile, its stores drained under this one's compute
                _release_peers(flag_ptrs, t - programs, tiles, world, rank)
    if pid + (WAVES - 1) * programs < tiles:
        _release_peers(flag_ptrs, pid + (WAVES - 1) * programs, tiles, world, rank)
    for w in tl.static_range(WAVES):
        t = pid + w * programs
        if t < tiles:
            own = _slot_tile(recv, rank, M, t * BLOCK_N, N, BLOCK_M, BLOCK_N)
            total = sum_in_rank_order(own, recv, counters, rank, world, tiles, t, M, 0, t * BLOCK_N, N, target,
                                      BLOCK_M, BLOCK_N)
            store_rows(out, 0, t * BLOCK_N, M, total, N, BLOCK_M, BLOCK_N)


def gemm_all_reduce_decode(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, parts: Partials, *,
                           two_shot: bool = False, waves: int = 1, config: DecodeConfig | None = None) -> torch.Tensor:
    """out = the sum over ranks of a @ b on every rank (a: this rank's K slice, at most MAX_ROWS rows), the
    all-reduce done by the decode GEMM's own programs (one-shot, or two-shot through each tile's owner). With
    waves > 1 (one-shot) each program computes that many tiles in turn, each tile's transfer under the next one's
    compute. Nothing is allocated: a cudaMalloc may wait for a kernel that spins on a peer."""
    row_major("gemm_all_reduce_decode", a=a, b=b, out=out)
    m, k = a.shape
    n = b.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"gemm_all_reduce_decode: a has {m} rows; at most {MAX_ROWS} "
                         "(use cuco.kernels.gemm.gemm_all_reduce)")
    if waves > 1 and two_shot:
        raise ValueError("gemm_all_reduce_decode: waves of tiles are one-shot")
    sms = sm_count(out.device)
    cfg = config or summed_decode_config_for(m, n, k, sms, waves=waves)
    if cfg.split_k != 1:
        raise ValueError("gemm_all_reduce_decode: K is not split (a tile's sum is sent from the program that made it)")
    tiles = triton.cdiv(n, cfg.block_n)
    programs = triton.cdiv(tiles, waves)
    if programs > sms and not interpreted():  # the interpreter runs programs one after another
        raise ValueError(f"gemm_all_reduce_decode: {programs} programs ({tiles} tiles, {waves} a program) are more "
                         f"than the {sms} SMs: a waiting tile could hold the SM its sender needs")
    if parts.counters.numel() < parts.world * tiles:
        raise ValueError("Partials.counters is too small for this shape: size it with partials_counters()")
    block_m = max(16, triton.next_power_of_2(m))  # tl.dot's least tile edge is 16
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k)))
    tma = tma_ok(a, b)
    _decode_ar_kernel[(programs,)](
        descriptor(a, [block_m, block_k], tma), descriptor(b, [block_k, cfg.block_n], tma), a, b, out,
        parts.recv, parts.counters, parts.dest_ptrs, parts.flag_ptrs, m, n, k, parts.world, parts.rank, parts.target,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, WAVES=waves, TWO_SHOT=two_shot, TMA=tma,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return out
