"""The decode GEMM: C = A @ B with few rows in A (a step's tokens), where the time is reading B (the weights) once.

With M <= 128 a GEMM has too few output tiles to keep every SM streaming B (N = 8192 in 64-wide columns is 128
tiles for 132 SMs, each with one tile's loads in flight), so the reduction dimension is split as well: program
(tile, s) multiplies columns `tile` over the s-th slice of K, and the partial products of one tile are summed by
whichever of its programs finishes last, in split order, so that the result has the same bits whatever order the
programs finish in. A split's program stores its fp32 partial in a workspace that stays in L2 (at M = 32, N = 8192
and 2 splits: 2 MB), then counts itself done on the tile's counter (acq_rel: the partial before the count; the
last one's later loads after every count); the last resets the counter for the next launch.

Splits of one tile are adjacent programs, so they run at the same time and their partials are read back from L2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cuco.kernels.common import descriptor, row_major, sm_count, tma_ok

# Up to 128 rows the split-K kernel is as fast as the tiled GEMM (cuco.kernels.gemm) or faster: at 128 x 8192 x 4096
# on an H200, 26 us against the tiles' 31 (benchmarks/results/decode_gemm.md).
MAX_ROWS = 128


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int
    block_k: int
    split_k: int  # slices of K; 1 stores straight into C
    num_stages: int
    num_warps: int
    num_ctas: int = 1  # CTAs of one Hopper cluster that split a program's tile between them


def decode_config_for(m: int, n: int, k: int, sms: int) -> DecodeConfig:
    """64 columns of B a program, K split as far as one program per SM: the sweep's fastest by row count
    (benchmarks/results/decode_gemm.md). More splits only add partial sums (M x N in fp32 each); fewer leave SMs
    idle. Up to 8 rows, six stages of 128-deep blocks keep the most loads in flight; up to 32, 256-deep blocks and
    8 warps; above, the 128-row tile's four stages take 192 KB of shared memory (Hopper's 227 KB hold them)."""
    block_k, stages, warps = (128, 6, 4) if m <= 8 else (256, 4, 8) if m <= 32 else (128, 4, 4)
    return DecodeConfig(64, block_k, split_k_for(triton.cdiv(n, 64), k, block_k, sms), num_stages=stages,
                        num_warps=warps)


def split_k_for(tiles: int, k: int, block_k: int, sms: int) -> int:
    """K's slices for `tiles` column tiles: doubled while the programs stay within one per SM, up to 8, each slice
    at least 4 blocks deep."""
    split = 1
    while split < 8 and tiles * split * 2 <= sms and k >= split * 2 * 4 * block_k:
        split *= 2
    return split


@triton.jit
def slice_product(a_desc, a_ptr, b_desc, b_ptr, col, k0, k1, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """The fp32 product of all rows of A (M <= BLOCK_M) and columns [col, col + BLOCK_N) of B over K in [k0, k1)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        for k in range(k0, k1, BLOCK_K):  # TMA zero-fills the rows past M and the columns past K
            acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, col]), acc)
    else:
        rm = tl.arange(0, BLOCK_M)
        rn = col + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        for k in range(k0, k1, BLOCK_K):
            kk = k + rk
            a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k1), other=0.0)
            b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < k1) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["M"])
def _decode_kernel(a_desc, b_desc, a, b, c, partials, counters, M, N, K, k_per_split,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                   TMA: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    s = pid % SPLIT_K
    col = tile * BLOCK_N
    k0 = s * k_per_split
    acc = slice_product(a_desc, a, b_desc, b, col, k0, tl.minimum(k0 + k_per_split, K), M, N, K,
                         BLOCK_M, BLOCK_N, BLOCK_K, TMA)
    store_split(acc, c, partials, counters, tile, s, col, M, N, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def store_split(acc, c, partials, counters, tile, s, col, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SPLIT_K: tl.constexpr):
    """Slice s's fp32 product of a tile into C: straight where K is not split, else through the workspace, the
    tile's last slice to finish summing them all in split order."""
    rm = tl.arange(0, BLOCK_M)
    rn = col + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None] * N + rn[None, :]
    if SPLIT_K == 1:
        tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)
    else:
        tl.store(partials + s * M * N + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial stored before the count that publishes it
        done = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
        if done == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for r in tl.static_range(SPLIT_K):  # split order, whoever finished last: the same bits every run
                if r == s:
                    total += acc
                else:  # .cg: from L2, where the other programs' stores are, never a stale line of this SM's L1
                    total += tl.load(partials + r * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(c + offs, total.to(c.dtype.element_ty), mask=mask)
            tl.atomic_xchg(counters + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@dataclass
class DecodeWorkspace:
    """fp32 partials ([split_k, M, N] at the most) and one counter per column tile, zero between launches (each
    launch leaves them so). Launches that may run at the same time need workspaces of their own."""

    partials: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def create(cls, device: torch.device, partial_elems: int, tiles: int) -> DecodeWorkspace:
        return cls(torch.empty(max(partial_elems, 1), device=device, dtype=torch.float32),
                   torch.zeros(max(tiles, 1), device=device, dtype=torch.int32))

    def fits(self, partial_elems: int, tiles: int) -> bool:
        return self.partials.numel() >= partial_elems and self.counters.numel() >= tiles


_cached: dict[tuple[torch.device, int], DecodeWorkspace] = {}


def _stream_workspace(device: torch.device, partial_elems: int, tiles: int) -> DecodeWorkspace:
    """The workspace of the current stream (launches on one stream run one after another, so they may share it),
    grown as shapes need. None is made inside a CUDA graph's capture (the capture stream is new, and its zeroing
    would be captured): there a workspace made beforehand is passed."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    ws = _cached.get((device, stream))
    if ws is None or not ws.fits(partial_elems, tiles):
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError("gemm_decode: inside a CUDA graph's capture, pass a workspace made before it "
                             "(decode_workspace())")
        ws = _cached[device, stream] = DecodeWorkspace.create(device, partial_elems, tiles)
    return ws


def decode_workspace(m: int, n: int, k: int, device: torch.device,
                     config: DecodeConfig | None = None) -> DecodeWorkspace:
    """A workspace for gemm_decode of an [m, k] by [k, n] product under `config` (the default one if None)."""
    cfg = config or decode_config_for(m, n, k, sm_count(device))
    return DecodeWorkspace.create(device, cfg.split_k * m * n if cfg.split_k > 1 else 0, triton.cdiv(n, cfg.block_n))


def gemm_decode(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, config: DecodeConfig | None = None,
                workspace: DecodeWorkspace | None = None) -> torch.Tensor:
    """c = a @ b for a with at most MAX_ROWS rows, reading b once across all SMs (split-K, fixed-order sum).
    Without `workspace`, the current stream's."""
    row_major("gemm_decode", a=a, b=b, c=c)
    m, k = a.shape
    n = b.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"gemm_decode: a has {m} rows; at most {MAX_ROWS} (use cuco.kernels.gemm.gemm)")
    cfg = config or decode_config_for(m, n, k, sm_count(c.device))
    if cfg.num_ctas > 1 and cfg.split_k > 1:  # every CTA of a cluster would count the program's partial as done
        raise ValueError(f"gemm_decode: a cluster of {cfg.num_ctas} CTAs needs split_k 1 (got {cfg.split_k})")
    block_m = max(16, triton.next_power_of_2(m))  # tl.dot's least tile edge is 16
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k)))
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), block_k) * block_k  # slices start on a block
    tiles = triton.cdiv(n, cfg.block_n)
    tma = tma_ok(a, b)
    need = cfg.split_k * m * n if cfg.split_k > 1 else 0
    if workspace is None:
        workspace = _stream_workspace(c.device, need, tiles)
    elif not workspace.fits(need, tiles):
        raise ValueError("gemm_decode: the workspace is too small for this shape: make it with decode_workspace()")
    _decode_kernel[(tiles * cfg.split_k,)](
        descriptor(a, [block_m, block_k], tma), descriptor(b, [block_k, cfg.block_n], tma), a, b, c,
        workspace.partials, workspace.counters, m, n, k, k_per_split,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, SPLIT_K=cfg.split_k, TMA=tma,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps, num_ctas=cfg.num_ctas)
    return c
