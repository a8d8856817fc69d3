"""A persistent Triton GEMM (C = A @ B, row-major, fp32 accumulation) with the hooks of the fused placement.

- Arrival: the rows of A that live on other ranks land in `a_all` while the kernel runs. Each chunk of rows
  has a counter in `flags`, bumped by whoever delivers it (a peer's push, a copy engine's stream write); a tile
  first computes on this rank's own rows, then, for the others, waits (acquire, system scope) until every
  chunk its rows touch has reached the target. No chunked GEMM launches: the tile is the unit of overlap.
- Push: programs of the same launch beyond the GEMM's copy this rank's rows into every peer's `a_all`, chunk
  by chunk, and release the peer's counter for the chunk, then join the GEMM on the peers' tiles. The
  all-gather of A runs inside the GEMM kernel.
- Partials (gemm_reduce_scatter, gemm_all_reduce): the row-parallel GEMM's epilogue stores each partial tile
  into the memory of the ranks that sum it and releases a counter per tile; a tile's summing rank adds the
  partials in rank order. The reduce-scatter or all-reduce runs inside the GEMM kernel.

A launch that waits never has more programs than SMs, so every program is resident at once: a tile that waits
for a chunk never keeps the program that pushes it from running. A kernel's first launch compiles and loads it,
and loading waits for the kernels running in the CUDA context: where two waiting kernels share a context (one
GPU, as in the tests), each must have run once before they run together. Shapes whose rows or strides break
TMA's 16-byte rule take the pointer path (masked loads) of the same kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from cuco.kernels.common import descriptor, row_major, sm_count, tma_ok
from cuco.kernels.decode import MAX_ROWS as DECODE_ROWS
from cuco.kernels.decode import gemm_decode

PUSH_ROWS, PUSH_COLS = 16, 512  # elements a push program moves per step: 16 KiB of bf16, 16-byte accesses


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int  # row blocks that share a column band, so that B's tiles are reused from L2
    num_stages: int
    num_warps: int
    flatten: bool = False  # pipeline across a program's tiles (the next tile's loads under this one's epilogue)


def config_for(m: int, n: int, k: int) -> GemmConfig:
    """Tile shape by problem size, from the sweep in benchmarks/results/triton_gemm.md: 128x256 tiles, persistent and
    flattened, wherever there are rows for them; with few rows (decode), tiles as tall as M and 64 wide, so that B,
    the bulk of the bytes, is read about once and there are about as many tiles as a Hopper GPU has SMs (132)."""
    if m <= 16:
        return GemmConfig(16, 64, 256, 1, 4, 4)
    if m <= 64:
        return GemmConfig(32, 64, 128, 1, 4, 4)
    if m <= 256:
        if triton.cdiv(m, 128) * triton.cdiv(n, 64) >= 128:
            return GemmConfig(128, 64, 128, 1, 4, 4)
        return GemmConfig(64, 64, 256, 1, 3, 4)
    return GemmConfig(128, 256, 64, 8, 3, 8, flatten=True)


def summed_config_for(rows: int, n: int, k: int) -> GemmConfig:
    """config_for's tiles for a GEMM that sums partials across ranks in its epilogue, with 8 warps where the tiles
    are 128 rows by 64: the epilogue addresses every element of a tile by pointer, which spills a 4-warp program's
    registers (ncu: 255 a thread), and the spills slow its main loop too: at 128 x 4096 x 8192 on an H200, 37 us
    with 4 warps, 29 with 8 (benchmarks/results/triton_gemm.md, the summing epilogue)."""
    cfg = config_for(rows, n, k)
    return replace(cfg, num_warps=8) if (cfg.block_m, cfg.block_n) == (128, 64) else cfg


@dataclass
class Arrival:
    """Where the rows from other ranks land, and the counters that say they have.

    `a_all` holds every row of A ([M, K]); rows [own_row0, own_row0 + rows of a_own) are this rank's. Row r
    belongs to shard r // shard_rows and, inside it, to chunk (r % shard_rows) // ceil(shard_rows / chunks);
    flags[shard * chunks + chunk] reaches `target` once that chunk is in a_all.
    """

    a_all: torch.Tensor
    own_row0: int
    shard_rows: int
    chunks: int
    flags: torch.Tensor  # int32, shards * chunks counters; they only grow, so a target per run needs no reset
    target: int  # this run's number, 1, 2, ...: every run of a shape goes through gemm_gathered
    work: torch.Tensor  # int32, one counter the programs take the others' tiles from; zeroed once, like flags


@dataclass
class Push:
    """This rank's rows sent to every peer by `programs` extra programs of the GEMM's launch.

    dest_ptrs[p] is the address, on peer p, of row own_row0 of its a_all (rows K elements apart); flag_ptrs[p]
    the address of its flags. Each chunk is released to the peer once its rows are stored there."""

    dest_ptrs: torch.Tensor  # int64, one per peer
    flag_ptrs: torch.Tensor  # int64, one per peer
    shard: int  # this rank's shard index: its chunks' counters are flags[shard * chunks + c]
    programs: int = 4  # a candidate sets its own (ag_gemm_fused.py: 16)


@dataclass
class Partials:
    """Where this rank's partial tiles go and where the other ranks' land, for a row-parallel GEMM whose partial
    products are summed across ranks inside its epilogue (reduce-scatter: each row's owner sums; all-reduce:
    every rank sums every row).

    recv is this rank's receive buffer, [world, rows, N], rows being the rows this rank sums (its shard for a
    reduce-scatter, all M for an all-reduce): slot r holds rank r's partial of them (this rank's own slot is
    unused). counters[r * tiles + t] reaches `target` once rank r's tile t is in slot r: one counter per sender and
    tile, which only grow, one per run (size them with partials_counters). dest_ptrs[s] is the address, on rank s,
    of its recv slot for this rank; flag_ptrs[s] the address of rank s's counters (this rank's entries unused).
    """

    rank: int
    world: int
    recv: torch.Tensor
    counters: torch.Tensor
    dest_ptrs: torch.Tensor  # int64, one per rank
    flag_ptrs: torch.Tensor  # int64, one per rank
    target: int  # this run's number, 1, 2, ...


def partials_counters(world: int, rows: int, n: int) -> int:
    """Counters Partials needs for `rows` summed rows, whatever tiles the shape gets (16, the smallest tile edge)."""
    return world * triton.cdiv(rows, 16) * triton.cdiv(n, 16)


@triton.jit
def _grouped(t, blocks_m, blocks_n, GROUP_M: tl.constexpr):
    """Tile t's (row block, column block): GROUP_M row blocks walk a column band together (L2 reuse of B)."""
    per_group = GROUP_M * blocks_n
    first = (t // per_group) * GROUP_M
    size = tl.minimum(blocks_m - first, GROUP_M)
    return first + (t % per_group) % size, (t % per_group) // size


@triton.jit
def _acc(a_desc, a_ptr, a_row, b_desc, b_ptr, col, M_a, N, K,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """The fp32 product of rows [a_row, a_row + BLOCK_M) of A (M_a rows in all) and columns [col, ...) of B."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(a_desc.load([a_row, k]), b_desc.load([k, col]), acc)
    else:
        ra = a_row + tl.arange(0, BLOCK_M)
        rn = col + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + ra[:, None] * K + (k + rk)[None, :],
                        mask=(ra[:, None] < M_a) & ((k + rk)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def store_rows(ptr, row, col, rows, acc, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows [row, row + BLOCK_M) of a tile into a row-major [rows, N] matrix at ptr, those below `rows` only."""
    rc = row + tl.arange(0, BLOCK_M)
    rn = col + tl.arange(0, BLOCK_N)
    tl.store(ptr + rc[:, None] * N + rn[None, :], acc.to(ptr.dtype.element_ty),
             mask=(rc[:, None] < rows) & (rn[None, :] < N))


@triton.jit
def _store_out(out_desc, out, row, col, rows, acc, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               TMA: tl.constexpr):
    """A finished tile into this rank's output ([rows, N]): by TMA where it can (clipped at the last row)."""
    if TMA:
        out_desc.store([row, col], acc.to(out_desc.dtype))
    else:
        store_rows(out, row, col, rows, acc, N, BLOCK_M, BLOCK_N)


@triton.jit
def _tile(a_desc, a_ptr, a_row, b_desc, b_ptr, c_desc, c_ptr, c_row, col, M_a, M, N, K,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """One output tile: rows [c_row, c_row + BLOCK_M) of C from rows [a_row, ...) of A (M_a rows in all)."""
    acc = _acc(a_desc, a_ptr, a_row, b_desc, b_ptr, col, M_a, N, K, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
    _store_out(c_desc, c_ptr, c_row, col, M, acc, N, BLOCK_M, BLOCK_N, TMA)


@triton.jit
def _wait_rows(flags, row, row_end, shard_rows, chunks, rows_per_chunk, target, FENCE: tl.constexpr):
    """Spin until every chunk that rows [row, row_end) touch has arrived. The acquire (system scope: the
    writer may be a peer GPU or a copy engine) orders this program's later reads after the chunk's stores;
    the proxy fence then lets TMA, which reads through the async proxy, see them too."""
    r = row
    while r < row_end:
        s = r // shard_rows
        c = (r - s * shard_rows) // rows_per_chunk
        while tl.atomic_add(flags + s * chunks + c, 0, sem="acquire", scope="sys") < target:
            pass
        r = tl.minimum(s * shard_rows + (c + 1) * rows_per_chunk, (s + 1) * shard_rows)
    if FENCE:
        tl.inline_asm_elementwise("fence.proxy.async.global;\n mov.u32 $0, $1;", "=r,r", [target],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _push(a_own, dest_ptrs, flag_ptrs, q, push_progs, npeers, own_rows, K, shard, chunks, rows_per_chunk,
          PUSH_ROWS: tl.constexpr, PUSH_COLS: tl.constexpr):
    """Push program q: chunks in order (every peer's chunk 0 first), stored, then released on the peer."""
    rr = tl.arange(0, PUSH_ROWS)
    cc = tl.arange(0, PUSH_COLS)
    for item in range(q, npeers * chunks, push_progs):
        c = item // npeers
        p = item % npeers
        dest = tl.load(dest_ptrs + p).to(tl.pointer_type(a_own.dtype.element_ty))
        end = tl.minimum((c + 1) * rows_per_chunk, own_rows)
        for r0 in range(c * rows_per_chunk, end, PUSH_ROWS):
            rows = r0 + rr
            for k0 in range(0, K, PUSH_COLS):
                cols = k0 + cc
                mask = (rows[:, None] < end) & (cols[None, :] < K)
                off = rows[:, None] * K + cols[None, :]
                tl.store(dest + off, tl.load(a_own + off, mask=mask), mask=mask)
        # Every thread's stores precede the barrier; the release (system scope, cumulative) publishes them
        # to the peer together with the count.
        tl.debug_barrier()
        flag = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
        tl.atomic_add(flag + shard * chunks + c, 1, sem="release", scope="sys")


# Values that change from run to run or rank to rank are not specialised on: a new value would compile and load
# a new module, and loading one waits for the kernels running in the context, among them, on one GPU, a peer's
# kernel that spins until this one pushes.
@triton.jit(do_not_specialize=["own_row0", "own_rows", "push_rows", "shard_rows", "chunks", "rows_per_chunk",
                               "target", "gemm_progs", "push_progs", "npeers", "shard"])
def _gemm_kernel(a_own_desc, a_all_desc, b_desc, c_desc, a_own, a_all, b, c,
                 flags, work, dest_ptrs, flag_ptrs,
                 M, N, K, own_row0, own_rows, push_rows, shard_rows, chunks, rows_per_chunk, target,
                 gemm_progs, push_progs, npeers, shard,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 TMA: tl.constexpr, GATED: tl.constexpr, PUSH: tl.constexpr, FENCE: tl.constexpr,
                 PUSH_ROWS: tl.constexpr, PUSH_COLS: tl.constexpr, FLATTEN: tl.constexpr):
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    own_block0 = own_row0 // BLOCK_M
    own_blocks = tl.cdiv(own_rows, BLOCK_M)
    if PUSH and pid >= gemm_progs:
        _push(a_own, dest_ptrs, flag_ptrs, pid - gemm_progs, push_progs, npeers, push_rows, K, shard, chunks,
              rows_per_chunk, PUSH_ROWS, PUSH_COLS)
    else:
        # This rank's rows first: they are here from the start.
        for t in tl.range(pid, own_blocks * blocks_n, gemm_progs, flatten=FLATTEN):
            pm, pn = _grouped(t, own_blocks, blocks_n, GROUP_M)
            _tile(a_own_desc, a_own, pm * BLOCK_M, b_desc, b, c_desc, c, own_row0 + pm * BLOCK_M, pn * BLOCK_N,
                  own_rows, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
    if GATED:
        # Then the others', in ring order from the next shard on, each tile once its rows have arrived, taken one
        # at a time from a shared counter by every program: a pusher joins once its rows are out, and no program
        # idles while tiles are left. Each program's last take finds none, so a launch moves the counter by the
        # tiles plus the programs, and run `target` starts where run target - 1 ended (counter zeroed once).
        other_blocks = blocks_m - own_blocks
        n_other = other_blocks * blocks_n
        base = (target - 1) * (n_other + gemm_progs + push_progs)
        t = tl.atomic_add(work, 1, sem="relaxed", scope="gpu") - base
        while t < n_other:
            j, pn = _grouped(t, other_blocks, blocks_n, GROUP_M)
            row = ((own_block0 + own_blocks + j) % blocks_m) * BLOCK_M
            _wait_rows(flags, row, tl.minimum(row + BLOCK_M, M), shard_rows, chunks, rows_per_chunk, target, FENCE)
            _tile(a_all_desc, a_all, row, b_desc, b, c_desc, c, row, pn * BLOCK_N, M, M, N, K,
                  BLOCK_M, BLOCK_N, BLOCK_K, TMA)
            t = tl.atomic_add(work, 1, sem="relaxed", scope="gpu") - base


@triton.jit
def _peer_partial(recv, counters, r, tiles, t, rows, row, col, N, target,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rank r's partial of tile t from its recv slot, once r's counter for the tile has reached the target."""
    while tl.atomic_add(counters + r * tiles + t, 0, sem="acquire", scope="sys") < target:
        pass
    rc = row + tl.arange(0, BLOCK_M)
    rn = col + tl.arange(0, BLOCK_N)
    # .cg: from L2, never a line this SM kept from the previous run
    return tl.load(recv + r * rows * N + rc[:, None] * N + rn[None, :],
                   mask=(rc[:, None] < rows) & (rn[None, :] < N), other=0.0, cache_modifier=".cg")


@triton.jit
def sum_in_rank_order(own, recv, counters, rank, world, tiles, t, rows, row, col, N, target,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAIR: tl.constexpr = False):
    """Tile t's sum over ranks in rank order, so the same bits whichever partial lands first: this rank's own (in
    fp32, or already rounded as the peers' were where every rank must store the same bits), and each peer's from
    its recv slot once the peer's counter for the tile has reached the target.

    PAIR (world 2): own + the peer's partial, added into own. fp32 addition commutes, so both ranks store the bits
    of p0 + p1, and no second fp32 accumulator is held beside own: at 128 x 256 tiles that second one spills the
    registers, which cost the fused reduce-scatter 10-15% of its time (benchmarks/results/fused_epilogue.md)."""
    if PAIR:
        return own.to(tl.float32) + _peer_partial(recv, counters, 1 - rank, tiles, t, rows, row, col, N, target,
                                                  BLOCK_M, BLOCK_N).to(tl.float32)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r in range(world):
        if r == rank:
            total += own.to(tl.float32)
        else:
            total += _peer_partial(recv, counters, r, tiles, t, rows, row, col, N, target, BLOCK_M,
                                   BLOCK_N).to(tl.float32)
    return total


@triton.jit(do_not_specialize=["shard_rows", "world", "rank", "target", "programs"])
def _gemm_rs_kernel(a_desc, b_desc, out_desc, a, b, out, recv, counters, dest_ptrs, flag_ptrs,
                    M, N, K, shard_rows, world, rank, target, programs,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    TMA: tl.constexpr, OUT_TMA: tl.constexpr, PAIR: tl.constexpr):
    """The other ranks' shards first, in ring order from the next rank (ranks start on different owners), each
    tile stored into its owner's recv slot and released there; this rank's shard last, each tile summed with the
    peers' partials of it in rank order (the same bits whichever lands first), into out."""
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(shard_rows, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_shard = blocks_m * blocks_n
    for u in range(pid, world * per_shard, programs):
        shard = (rank + 1 + u // per_shard) % world
        t = u % per_shard
        pm, pn = _grouped(t, blocks_m, blocks_n, GROUP_M)
        row, col = pm * BLOCK_M, pn * BLOCK_N
        acc = _acc(a_desc, a, shard * shard_rows + row, b_desc, b, col, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        if shard != rank:
            dest = tl.load(dest_ptrs + shard).to(tl.pointer_type(out.dtype.element_ty))
            store_rows(dest, row, col, shard_rows, acc, N, BLOCK_M, BLOCK_N)
            tl.debug_barrier()  # every thread's stores before the release (system scope, cumulative)
            flag = tl.load(flag_ptrs + shard).to(tl.pointer_type(tl.int32))
            tl.atomic_add(flag + rank * per_shard + t, 1, sem="release", scope="sys")
        else:
            total = sum_in_rank_order(acc, recv, counters, rank, world, per_shard, t, shard_rows, row, col, N,
                                      target, BLOCK_M, BLOCK_N, PAIR)
            _store_out(out_desc, out, row, col, shard_rows, total, N, BLOCK_M, BLOCK_N, OUT_TMA)


@triton.jit(do_not_specialize=["rows", "world", "rank", "target", "programs"])
def _gemm_ar_kernel(a_desc, b_desc, out_desc, a, b, out, recv, counters, dest_ptrs, flag_ptrs,
                    M, N, K, rows, world, rank, target, programs,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    TMA: tl.constexpr, OUT_TMA: tl.constexpr, PAIR: tl.constexpr):
    """Each tile: computed, stored into every peer's recv slot for this rank and released there, then summed with
    the peers' partials of it in rank order, every partial rounded to bf16 as sent, so that every rank stores the
    same bits. Tiles go to programs alike on every rank, so the tile a program waits for is the one the same
    program of each peer is computing or has pushed: all resident, none waits forever. rows: M (every row)."""
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    tiles = blocks_m * blocks_n
    for t in range(pid, tiles, programs):
        pm, pn = _grouped(t, blocks_m, blocks_n, GROUP_M)
        row, col = pm * BLOCK_M, pn * BLOCK_N
        sent = _acc(a_desc, a, row, b_desc, b, col, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, TMA).to(out.dtype.element_ty)
        for i in range(1, world):
            dest = tl.load(dest_ptrs + (rank + i) % world).to(tl.pointer_type(out.dtype.element_ty))
            store_rows(dest, row, col, M, sent, N, BLOCK_M, BLOCK_N)
        tl.debug_barrier()  # every thread's stores before the releases (system scope, cumulative)
        for i in range(1, world):
            flag = tl.load(flag_ptrs + (rank + i) % world).to(tl.pointer_type(tl.int32))
            tl.atomic_add(flag + rank * tiles + t, 1, sem="release", scope="sys")
        total = sum_in_rank_order(sent, recv, counters, rank, world, tiles, t, M, row, col, N, target,
                                  BLOCK_M, BLOCK_N, PAIR)
        _store_out(out_desc, out, row, col, M, total, N, BLOCK_M, BLOCK_N, OUT_TMA)




def _launch(a_own, a_all, b, c, *, own_row0, own_rows, arrival, push, config, programs):
    """One launch; its first loop covers rows [own_row0, own_row0 + own_rows) of a_own, which `push` sends.

    Nothing here allocates device memory: a cudaMalloc may wait for the device, and a rank whose kernel spins on
    a peer's push must never wait for that kernel. A plain GEMM takes a program per tile by default (the SMs
    hold several of the small ones at once); a waiting one at most one per SM, so that all are resident."""
    row_major("gemm", a=a_own, a_all=a_all, b=b, c=c)
    m, k = a_all.shape
    n = b.shape[1]
    cfg = config or config_for(m, n, k)
    tma = tma_ok(a_own, a_all, b, c)
    gated = arrival is not None
    if programs is None:  # flattened loops pay across a program's tiles: persistent too
        persistent = gated or push or cfg.flatten
        programs = sm_count(c.device) if persistent else triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    push_progs = push.programs if push else 0
    gemm_progs = max(1, programs - push_progs)
    shard_rows = arrival.shard_rows if gated else max(m, 1)
    chunks = arrival.chunks if gated else 1
    a_all_desc = descriptor(a_all, [cfg.block_m, cfg.block_k], tma)
    _gemm_kernel[(gemm_progs + push_progs,)](
        descriptor(a_own, [cfg.block_m, cfg.block_k], tma) if own_rows else a_all_desc, a_all_desc,
        descriptor(b, [cfg.block_k, cfg.block_n], tma), descriptor(c, [cfg.block_m, cfg.block_n], tma),
        a_own, a_all, b, c,
        arrival.flags if gated else c, arrival.work if gated else c,  # c: unused
        push.dest_ptrs if push else c, push.flag_ptrs if push else c,
        m, n, k, own_row0, own_rows, a_own.shape[0], shard_rows, chunks, triton.cdiv(shard_rows, chunks),
        arrival.target if gated else 0, gemm_progs, push_progs, push.dest_ptrs.numel() if push else 0,
        push.shard if push else 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, TMA=tma,
        GATED=gated, PUSH=push is not None, FENCE=tma and gated, PUSH_ROWS=PUSH_ROWS, PUSH_COLS=PUSH_COLS,
        FLATTEN=cfg.flatten,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return c


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, config: GemmConfig | None = None,
         programs: int | None = None) -> torch.Tensor:
    """c = a @ b, no communication: the plain form, to be measured beside cuBLAS. With few rows and no tiles asked
    for, the decode GEMM (cuco.kernels.decode: K split over every SM) streams b faster than these tiles."""
    if config is None and programs is None and a.shape[0] <= DECODE_ROWS:
        row_major("gemm", a=a, b=b, c=c)  # refused under the name the caller used
        return gemm_decode(a, b, c)
    return _launch(a, a, b, c, own_row0=0, own_rows=a.shape[0], arrival=None, push=None, config=config,
                   programs=programs)


def gemm_gathered(a_own: torch.Tensor, b: torch.Tensor, c: torch.Tensor, arrival: Arrival,
                  push: Push | None = None, *, config: GemmConfig | None = None,
                  programs: int | None = None) -> torch.Tensor:
    """c = all-gathered A @ b, the other ranks' rows consumed as they arrive (and, with `push`, this rank's sent).

    This rank's tiles read a_own in place when its rows start and end on a tile boundary; otherwise (odd
    shapes) they are copied into a_all first, on the stream, and their counters set, so that a tile that
    straddles two shards finds all of its rows there.
    """
    cfg = config or config_for(arrival.a_all.shape[0], b.shape[1], b.shape[0])
    own_rows = a_own.shape[0]
    if arrival.own_row0 % cfg.block_m == 0 and (own_rows % cfg.block_m == 0 or
                                                 arrival.own_row0 + own_rows == arrival.a_all.shape[0]):
        return _launch(a_own, arrival.a_all, b, c, own_row0=arrival.own_row0, own_rows=own_rows, arrival=arrival,
                       push=push, config=cfg, programs=programs)
    arrival.a_all[arrival.own_row0:arrival.own_row0 + own_rows].copy_(a_own)
    shard = arrival.own_row0 // arrival.shard_rows
    arrival.flags[shard * arrival.chunks:(shard + 1) * arrival.chunks].fill_(arrival.target)
    return _launch(a_own, arrival.a_all, b, c, own_row0=arrival.own_row0, own_rows=0, arrival=arrival, push=push,
                   config=cfg, programs=programs)


def _summed(kernel, call: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, parts: Partials, rows: int,
            config: GemmConfig | None, programs: int | None, pair: bool | None = None) -> torch.Tensor:
    """One launch of a GEMM whose epilogue sums partials across ranks over `rows` rows. Grid: one program per SM
    at most (tiles wait for the peers'); nothing allocated.

    Its cost beside the plain GEMM (benchmarks/results/triton_gemm.md, the summing epilogue) is registers: the
    partials' loads and stores address every element of a tile (summed_config_for gives the tall tiles 8 warps);
    TMA descriptors for them are the other way to cut it. pair: sum_in_rank_order's PAIR (None: at world 2;
    benchmarks/fused_epilogue.py times the general sum beside it)."""
    row_major(call, a=a, b=b, out=out)
    m, k = a.shape
    n = b.shape[1]
    cfg = config or summed_config_for(rows, n, k)
    if parts.counters.numel() < parts.world * triton.cdiv(rows, cfg.block_m) * triton.cdiv(n, cfg.block_n):
        raise ValueError("Partials.counters is too small for this shape: size it with partials_counters()")
    tma = tma_ok(a, b)
    out_tma = tma_ok(out)
    programs = programs or sm_count(out.device)
    kernel[(programs,)](
        descriptor(a, [cfg.block_m, cfg.block_k], tma), descriptor(b, [cfg.block_k, cfg.block_n], tma),
        descriptor(out, [cfg.block_m, cfg.block_n], out_tma),
        a, b, out, parts.recv, parts.counters, parts.dest_ptrs, parts.flag_ptrs,
        m, n, k, rows, parts.world, parts.rank, parts.target, programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, TMA=tma,
        OUT_TMA=out_tma, PAIR=parts.world == 2 if pair is None else pair, num_stages=cfg.num_stages,
        num_warps=cfg.num_warps)
    return out


def gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, parts: Partials, *,
                        config: GemmConfig | None = None, programs: int | None = None) -> torch.Tensor:
    """out = this rank's shard of the sum over ranks of a @ b (a: this rank's K slice), the reduce-scatter done
    by the GEMM's own tiles: pushed to their owners as they finish, summed by the owner's last tiles."""
    return _summed(_gemm_rs_kernel, "gemm_reduce_scatter", a, b, out, parts, a.shape[0] // parts.world, config,
                   programs)


def gemm_all_reduce(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, parts: Partials, *,
                    config: GemmConfig | None = None, programs: int | None = None) -> torch.Tensor:
    """out = the sum over ranks of a @ b on every rank (a: this rank's K slice), the all-reduce done by the GEMM's
    own tiles: each pushed to every peer as it finishes and summed there, in rank order, with theirs."""
    return _summed(_gemm_ar_kernel, "gemm_all_reduce", a, b, out, parts, a.shape[0], config, programs)
