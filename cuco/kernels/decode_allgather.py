"""The decode GEMM that gathers its rows in the same launch: an all-gather + GEMM layer at decode in one kernel.

Every program first stores its share of this rank's rows of A into every rank's gathered buffer (this rank's own
too) and counts itself on every rank's counter (release, system scope); once this rank's counter says that every
program of every rank has (the run's number times world times programs: counters only grow), the programs multiply
the gathered rows by their columns of B over their slice of K, as the decode GEMM (cuco.kernels.decode) does, so
that every SM streams the weights. The gather (1 / world of A from each peer: 1 MB at 128 x 8192 in bf16) is not
hidden: every block of K needs every row. Its gain over a gather and a GEMM is the launch, the host and the
collective's protocol in between.

Every program is resident at once (at most one per SM), so none waits for an SM a sender needs. Gathered rows
alternate between two buffers by run parity (a peer one run ahead never overwrites rows still read; two runs
ahead it cannot be, having waited for this rank's rows of the run between).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cuco.kernels.common import descriptor, interpreted, row_major, sm_count, tma_ok
from cuco.kernels.decode import MAX_ROWS, DecodeConfig, DecodeWorkspace, slice_product, store_split
from cuco.kernels.decode_allreduce import summed_decode_config_for

COPY = 4096  # elements a program copies a step: 8 KiB of bf16, 16-byte accesses from 128 threads


@dataclass
class Gather:
    """This run's gathered rows and where this rank's go.

    gathered is this rank's [M, K] buffer for the run; this rank's rows start at row own_row0 of every rank's.
    dest_ptrs[s] is the address, on rank s, of that row in its buffer for this run (this rank's entry: its own);
    flag_ptrs[s] the address of rank s's counter, `arrived` this rank's."""

    gathered: torch.Tensor
    own_row0: int
    dest_ptrs: torch.Tensor  # int64, one per rank
    flag_ptrs: torch.Tensor  # int64, one per rank
    arrived: torch.Tensor  # int32, one counter; it only grows
    target: int  # this run's number, 1, 2, ...


@triton.jit(do_not_specialize=["own_rows", "world", "target"])
def _gathered_kernel(a_own, g_desc, gathered, b_desc, b, c, partials, split_counters, dest_ptrs, flag_ptrs, arrived,
                     M, N, K, k_per_split, own_rows, world, target,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     TMA: tl.constexpr, COPY: tl.constexpr, PREFETCH_ROWS: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tile = pid // SPLIT_K
    s = pid % SPLIT_K
    col = tile * BLOCK_N
    k0 = s * k_per_split
    total = own_rows * K
    share = tl.cdiv(tl.cdiv(total, programs), COPY) * COPY
    end = tl.minimum(pid * share + share, total)
    for off in range(pid * share, end, COPY):
        idx = off + tl.arange(0, COPY)
        rows = tl.load(a_own + idx, mask=idx < end)
        for r in range(world):
            dest = tl.load(dest_ptrs + r).to(tl.pointer_type(a_own.dtype.element_ty))
            tl.store(dest + idx, rows, mask=idx < end)
    tl.debug_barrier()  # every thread's stores before the counts that publish them
    for r in range(world):
        flag = tl.load(flag_ptrs + r).to(tl.pointer_type(tl.int32))
        tl.atomic_add(flag, 1, sem="release", scope="sys")
    if PREFETCH_ROWS > 0:  # the first rows of this program's B into L2 while the rows cross the link
        kk = tl.minimum(k0 + tl.arange(0, PREFETCH_ROWS), K - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [b + kk * N + col],
                                  dtype=tl.int32, is_pure=False, pack=1)
    while tl.atomic_add(arrived, 0, sem="acquire", scope="sys") < target * world * programs:
        pass
    if TMA:  # the rows were stored through the generic proxy; TMA reads through the async one
        tl.inline_asm_elementwise("fence.proxy.async.global;\n mov.u32 $0, $1;", "=r,r", [target],
                                  dtype=tl.int32, is_pure=False, pack=1)
    acc = slice_product(g_desc, gathered, b_desc, b, col, k0, tl.minimum(k0 + k_per_split, K), M, N, K,
                        BLOCK_M, BLOCK_N, BLOCK_K, TMA)
    store_split(acc, c, partials, split_counters, tile, s, col, M, N, BLOCK_M, BLOCK_N, SPLIT_K)


def gathered_decode_workspace(m: int, n: int, k: int, device: torch.device, split_k: int = 1) -> DecodeWorkspace:
    """The split slices' fp32 partials and per-tile counters of one gemm_decode_gathered shape (m: every rank's rows),
    made before the first run: a run allocates nothing (a cudaMalloc may wait for a kernel spinning on a peer)."""
    cfg = summed_decode_config_for(m, n, k, sm_count(device), split_k)
    return DecodeWorkspace.create(device, split_k * m * n if split_k > 1 else 0, triton.cdiv(n, cfg.block_n))


def gemm_decode_gathered(a_own: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather: Gather,
                         workspace: DecodeWorkspace, *, split_k: int = 1, prefetch_rows: int = 0,
                         config: DecodeConfig | None = None) -> torch.Tensor:
    """c = (every rank's rows of A, gathered) @ b, the gather done by the decode GEMM's own programs first. With
    prefetch_rows (a power of two), each program asks L2 for the first rows of its slice of b (a line each: its
    tile's columns) before it waits for the rows: the weights start streaming under the gather."""
    row_major("gemm_decode_gathered", a_own=a_own, gathered=gather.gathered, b=b, c=c)
    m, k = gather.gathered.shape
    n = b.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"gemm_decode_gathered: {m} gathered rows; at most {MAX_ROWS} "
                         "(use cuco.kernels.gemm.gemm_gathered)")
    sms = sm_count(c.device)
    cfg = config or summed_decode_config_for(m, n, k, sms, split_k)
    tiles = triton.cdiv(n, cfg.block_n)
    programs = tiles * cfg.split_k
    if programs > sms and not interpreted():  # the interpreter runs programs one after another
        raise ValueError(f"gemm_decode_gathered: {programs} programs ({tiles} tiles x {cfg.split_k} splits) are more "
                         f"than the {sms} SMs: a waiting program could hold the SM a sender needs")
    if not workspace.fits(cfg.split_k * m * n if cfg.split_k > 1 else 0, tiles):
        raise ValueError("gemm_decode_gathered: the workspace is too small: make it with gathered_decode_workspace()")
    block_m = max(16, triton.next_power_of_2(m))  # tl.dot's least tile edge is 16
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k)))
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), block_k) * block_k  # slices start on a block
    tma = tma_ok(gather.gathered, b)
    _gathered_kernel[(programs,)](
        a_own, descriptor(gather.gathered, [block_m, block_k], tma), gather.gathered,
        descriptor(b, [block_k, cfg.block_n], tma), b, c, workspace.partials, workspace.counters,
        gather.dest_ptrs, gather.flag_ptrs, gather.arrived, m, n, k, k_per_split, a_own.shape[0],
        gather.dest_ptrs.numel(), gather.target,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, SPLIT_K=cfg.split_k, TMA=tma, COPY=COPY,
        PREFETCH_ROWS=0 if interpreted() else prefetch_rows,  # PTX: the interpreter runs none
        num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return c
