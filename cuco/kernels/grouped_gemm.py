"""The MoE layer's expert GEMMs, all experts in one launch, with the group sizes on the GPU.

Rows of X are sorted by expert (expert e's are [offs[e], offs[e + 1])); expert e's rows are multiplied by W[e]
([E, K, N], row-major, as the workloads store w13 and w2). offs is an int32 tensor in device memory, read by the
kernel itself: nothing is brought to the host, so the launch can follow the routing on the stream without a
synchronisation (cuBLAS's per-expert calls need every size on the host first).

Scheduling: a persistent grid, a program or two per SM, takes tiles (expert, row block, column block) in turn. Each
program derives every expert's tile count from offs (a prefix sum over E values in registers) and finds a tile's
expert by counting the prefix ends at or below it, so a hot expert's many row blocks spread over every SM like
any other tiles. Within an expert, a column band's row blocks are consecutive, so programs running side by side
share that band of W from L2 and W is read from HBM about once. A tile is computed by one program with a fixed K
order, so the result is the same bits whatever program takes it.

Epilogues: a plain store (w2), and SwiGLU (w13): a tile computes the gate columns [j, j + BN) and the up columns
[FF + j, FF + j + BN) together and stores silu(gate) * up, in fp32 until it is rounded to bf16 once, so the w13
launch writes the FF-wide hidden activation directly (the workload's tolerance assumes exactly that rounding: the
hidden activation in bf16 before the down projection).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cuco.kernels.common import descriptor, interpreted, row_major, sm_count, tma_ok

MIN_DOT = 16  # tl.dot's smallest tile edge
MIN_EXPERT_LANES = 16  # the offsets' vector is at least this long: one- or two-element tensors are a corner of
# Triton's layouts that the kernel need not visit (the lanes past E are masked)


@dataclass(frozen=True)
class GroupedConfig:
    block_m: int  # rows of an expert per tile
    block_n: int  # output columns per tile (SwiGLU: reads 2 * block_n columns of W, gate and up)
    block_k: int
    num_stages: int  # loads in flight per program: what covers HBM latency when W streams (decode)
    num_warps: int
    programs_per_sm: int = 1  # 2 lets one program's loads run while the other's tile starts or ends
    flatten: bool = False  # pipeline across a program's tiles (the next tile's loads under this one's epilogue)


def config_for(rows: int, experts: int, n: int, k: int, swiglu: bool = False) -> GroupedConfig:
    """Tile shape by the average rows per expert (rows / experts, known on the host without reading offs).

    Every row of a tile past its expert's last is a wasted multiply, and an expert's rows rarely fill its last tile:
    with 128 rows an expert (prefill, 4096 tokens x top-8 over 256 experts) 128-row tiles compute about 1.5x the
    rows, 64-row ones about 1.25x, so tiles are about half as tall as an expert's rows until they reach the 128 of
    the large Hopper tile. Few rows (decode: 128 tokens give 4 an expert): tiles 16 rows tall, and W, the bulk of
    the bytes, streams through 128-deep K steps with about 100 KB in flight per SM (an H200 SM needs about
    36 GB/s x 2 us of HBM latency in flight). Accumulators 256 output columns wide where rows allow (SwiGLU:
    two of 128), as cuco.kernels.gemm's large tiles."""
    per_expert = rows / max(experts, 1)
    if per_expert <= 16:  # w2's tiles are short (K = FF): two programs an SM, so one streams while one starts
        cfg = GroupedConfig(16, 64, 128, 4, 4) if swiglu else GroupedConfig(16, 128, 128, 4, 4, programs_per_sm=2)
    elif per_expert <= 48:
        cfg = GroupedConfig(32, 64 if swiglu else 128, 128, 4, 4)
    elif per_expert <= 192:
        cfg = GroupedConfig(64, 128 if swiglu else 256, 64, 4, 4)
    else:  # an expert-parallel rank's prefill (256 rows an expert): benchmarks/grouped_tiles.py's fastest tiles
        cfg = GroupedConfig(128, 128, 64, 3, 8) if swiglu else GroupedConfig(128, 256, 64, 3, 8, flatten=True)
    return fit(cfg, n, k)


def fit(cfg: GroupedConfig, n: int, k: int) -> GroupedConfig:
    """Tiles no wider or deeper than the problem (the small shapes of the CPU tests): the interpreter's cost, and a
    GPU's wasted loads, grow with the tile."""
    bn = min(cfg.block_n, max(MIN_DOT, triton.next_power_of_2(n)))
    bk = min(cfg.block_k, max(MIN_DOT, triton.next_power_of_2(k)))
    return GroupedConfig(cfg.block_m, bn, bk, cfg.num_stages, cfg.num_warps, cfg.programs_per_sm, cfg.flatten)


@dataclass(frozen=True)
class ExpertLayout:
    """Token-expert pairs sorted by expert: sorted row i is pair order[i] (token order[i] // topk, its pick
    order[i] % topk); expert e's rows are [offs[e], offs[e + 1]). Both on the device."""

    order: torch.Tensor  # int64, [pairs]
    offs: torch.Tensor  # int32, [experts + 1]


def sorted_place(order: torch.Tensor) -> torch.Tensor:
    """where[order[i]] = i: the sorted row at which each pair's output lies (the combine's `where`)."""
    where = torch.empty_like(order)
    where[order] = torch.arange(len(order), device=order.device)
    return where


def sort_by_expert(expert_ids: torch.Tensor, experts: int) -> ExpertLayout:
    """The sorted layout of a routing ([tokens, topk] expert ids, or any shape: flattened), on the device with no
    synchronisation: a stable sort (pairs of one expert stay in token order, so the layout is the same every run)
    and the offsets by a binary search of each expert's first row. torch.bincount is not used: on a GPU it reads
    the largest id on the host to size its output."""
    flat = expert_ids.flatten()
    order = torch.argsort(flat, stable=True)
    firsts = torch.arange(experts + 1, device=flat.device, dtype=flat.dtype)
    return ExpertLayout(order, torch.searchsorted(flat[order], firsts, out_int32=True))


@triton.jit
def _tile_of(t, ends, tiles, lo, hi, idx):
    """Tile t's expert, its index among that expert's tiles, and the expert's rows [row0, row_end)."""
    e = tl.sum((ends <= t).to(tl.int32), axis=0)
    mine = idx == e
    first = tl.sum(tl.where(mine, ends - tiles, 0), axis=0)
    row0 = tl.sum(tl.where(mine, lo, 0), axis=0)
    row_end = tl.sum(tl.where(mine, hi, 0), axis=0)
    return e, t - first, row0, row_end


@triton.jit
def _load_w(w_desc, w, e, k, col, limit, K, N_W, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """Rows [k, k + BLOCK_K) and columns [col, col + BLOCK_N) of W[e] (columns from `limit` on read as zero)."""
    if TMA:  # W as [E * K, N_W]: K is a multiple of BLOCK_K here, so a box never reaches the next expert
        return w_desc.load([e * K + k, col])
    rk = k + tl.arange(0, BLOCK_K)
    rn = col + tl.arange(0, BLOCK_N)
    base = w + e.to(tl.int64) * K * N_W  # beyond 2**31 elements at DeepSeek-V3's size
    return tl.load(base + rk[:, None].to(tl.int64) * N_W + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < limit),
                   other=0.0)


@triton.jit
def _load_x(x_desc, x, src, row, row_end, k, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr,
            GATHER: tl.constexpr):
    """Rows [row, row + BLOCK_M) of the sorted rows, those of this expert only on the pointer path: X's own rows,
    or (GATHER) rows src[row], src[row + 1], ... of X. TMA reads the next expert's rows past row_end (or zeros past
    the last row): they make rows of the tile that are never stored."""
    if TMA:
        return x_desc.load([row, k])
    rm = row + tl.arange(0, BLOCK_M)
    rk = k + tl.arange(0, BLOCK_K)
    if GATHER:
        rm = tl.load(src + rm, mask=rm < row_end, other=0)
    return tl.load(x + rm[:, None].to(tl.int64) * K + rk[None, :],
                   mask=((row + tl.arange(0, BLOCK_M))[:, None] < row_end) & (rk[None, :] < K), other=0.0)


@triton.jit
def _grouped_kernel(x_desc, w_desc, x, src, w, y, offs, E, K, N_OUT, N_W, programs,
                    E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SWIGLU: tl.constexpr, TMA: tl.constexpr, TMA_X: tl.constexpr, GATHER: tl.constexpr,
                    FLATTEN: tl.constexpr):
    """Y[rows of e] = X[rows of e] @ W[e] for every expert e (SWIGLU: silu(X W[e][:, :N_OUT]) * X W[e][:, N_OUT:]);
    with GATHER, sorted row r of X is X[src[r]]."""
    pid = tl.program_id(0)
    idx = tl.arange(0, E_PAD)
    lo = tl.load(offs + idx, mask=idx < E, other=0)
    hi = tl.load(offs + idx + 1, mask=idx < E, other=0)
    blocks_n = tl.cdiv(N_OUT, BLOCK_N)
    tiles = tl.cdiv(hi - lo, BLOCK_M) * blocks_n
    ends = tl.cumsum(tiles, axis=0)
    total = tl.sum(tiles, axis=0)
    for t in tl.range(pid, total, programs, flatten=FLATTEN):
        e, local, row0, row_end = _tile_of(t, ends, tiles, lo, hi, idx)
        blocks_m = tl.cdiv(row_end - row0, BLOCK_M)
        row = row0 + (local % blocks_m) * BLOCK_M  # a column band's row blocks side by side: W shared from L2
        col = (local // blocks_m) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = _load_x(x_desc, x, src, row, row_end, k, K, BLOCK_M, BLOCK_K, TMA_X, GATHER)
            acc = tl.dot(a, _load_w(w_desc, w, e, k, col, N_OUT, K, N_W, BLOCK_K, BLOCK_N, TMA), acc)
            if SWIGLU:
                up = tl.dot(a, _load_w(w_desc, w, e, k, N_OUT + col, N_W, K, N_W, BLOCK_K, BLOCK_N, TMA), up)
        if SWIGLU:
            acc = acc * tl.sigmoid(acc) * up
        rm = row + tl.arange(0, BLOCK_M)
        rn = col + tl.arange(0, BLOCK_N)
        tl.store(y + rm[:, None].to(tl.int64) * N_OUT + rn[None, :], acc.to(y.dtype.element_ty),
                 mask=(rm[:, None] < row_end) & (rn[None, :] < N_OUT))


def _check(call: str, x: torch.Tensor, offs: torch.Tensor, w: torch.Tensor, y: torch.Tensor, n_out: int,
           rows: torch.Tensor | None) -> None:
    """The kernel addresses X, W and Y as dense row-major and reads offs as E + 1 int32 values (and rows, where
    given, as one index into X per row of Y): anything else would be read wrongly, so it is refused by name."""
    row_major(call, x=x, y=y)
    if rows is not None and (rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64)
                             or not rows.is_contiguous() or rows.shape[0] != y.shape[0]):
        raise ValueError(f"{call}: rows must be a dense int32 or int64 vector with one index into x per row of the "
                         f"output ({y.shape[0]}) (got {rows.dtype}, shape {tuple(rows.shape)})")
    if w.dim() != 3 or not w.is_contiguous():
        raise ValueError(f"{call}: w must be a dense row-major [E, K, N] tensor (got shape {tuple(w.shape)}, strides "
                         f"{w.stride()}): pass w.contiguous()")
    if w.shape[1] != x.shape[1] or y.shape != (x.shape[0] if rows is None else rows.shape[0], n_out):
        raise ValueError(f"{call}: shapes do not chain: x {tuple(x.shape)}, w {tuple(w.shape)}, y {tuple(y.shape)}")
    if offs.dtype != torch.int32 or offs.shape != (w.shape[0] + 1,):
        raise ValueError(f"{call}: offs must be int32 of E + 1 = {w.shape[0] + 1} values (got {offs.dtype}, "
                         f"{tuple(offs.shape)})")


def _launch(call: str, x, offs, w, y, n_out: int, swiglu: bool, config: GroupedConfig | None,
            programs: int | None, src: torch.Tensor | None = None) -> torch.Tensor:
    """One launch of the kernel over every expert; a grid of `programs` (default: programs_per_sm per SM). src:
    the row of x each sorted row is (None: x's rows are sorted already)."""
    _check(call, x, offs, w, y, n_out, src)
    rows, k = y.shape[0], x.shape[1]
    experts, _, n_w = w.shape
    if rows == 0 or n_out == 0:
        return y
    if interpreted() and torch.bfloat16 in (x.dtype, w.dtype):
        # Triton's interpreter misreads bf16 (it computes garbage); fp32 copies hold the same values exactly.
        out = torch.empty(y.shape, dtype=torch.float32, device=y.device)
        _launch(call, x.float(), offs, w.float(), out, n_out, swiglu, config, programs, src)
        return y.copy_(out)
    cfg = fit(config, n_out, k) if config else config_for(rows, experts, n_out, k, swiglu)
    w_rows = w.view(experts * k, n_w)  # W as [E * K, N]: one descriptor over every expert
    tma = tma_ok(x, w_rows) and k % cfg.block_k == 0  # then W's boxes never straddle two experts
    tma_x = tma and src is None  # Hopper's TMA cannot gather rows: gathered ones take the pointer path
    if programs is None:
        programs = sm_count(y.device) * cfg.programs_per_sm
    x_desc = descriptor(x, [cfg.block_m, cfg.block_k], tma_x)
    w_desc = descriptor(w_rows, [cfg.block_k, cfg.block_n], tma)
    _grouped_kernel[(programs,)](
        x_desc, w_desc, x, x if src is None else src, w, y, offs, experts, k, n_out, n_w, programs,
        E_PAD=max(MIN_EXPERT_LANES, triton.next_power_of_2(experts)), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SWIGLU=swiglu, TMA=tma, TMA_X=tma_x, GATHER=src is not None, FLATTEN=cfg.flatten,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return y


def grouped_gemm(x: torch.Tensor, offs: torch.Tensor, w: torch.Tensor, y: torch.Tensor, *,
                 config: GroupedConfig | None = None, programs: int | None = None) -> torch.Tensor:
    """y[offs[e]:offs[e + 1]] = x[offs[e]:offs[e + 1]] @ w[e] for every expert e, in one launch. Rows past
    offs[E] are left as they are."""
    return _launch("grouped_gemm", x, offs, w, y, w.shape[2], False, config, programs)


def grouped_swiglu(x: torch.Tensor, offs: torch.Tensor, w13: torch.Tensor, h: torch.Tensor, *,
                   rows: torch.Tensor | None = None, config: GroupedConfig | None = None,
                   programs: int | None = None) -> torch.Tensor:
    """h[rows of e] = silu(x W_gate) * (x W_up) with w13[e] = [W_gate | W_up] ([K, 2 FF]): the FF-wide hidden
    activation, rounded to h's dtype once. rows: sorted row r is x[rows[r]] (the dispatch's gather, read in the
    kernel's loads instead of written out first); None: x is sorted already."""
    if w13.shape[-1] % 2:
        raise ValueError(f"grouped_swiglu: w13 must be [E, K, 2 FF] (got {tuple(w13.shape)})")
    return _launch("grouped_swiglu", x, offs, w13, h, w13.shape[2] // 2, True, config, programs, rows)


def moe_experts(x: torch.Tensor, offs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *,
                rows: torch.Tensor | None = None, out: torch.Tensor | None = None,
                configs: tuple[GroupedConfig | None, ...] = (None, None), programs: int | None = None) -> torch.Tensor:
    """Every expert's SwiGLU FFN on its sorted rows (offs as in ExpertLayout): x's own rows, or x[rows[r]] for
    sorted row r (grouped_swiglu's gather). Two launches, w13 with the SwiGLU epilogue into a bf16 hidden
    activation, then w2. Rows past offs[E] are left as they are."""
    n_rows, ff = x.shape[0] if rows is None else rows.shape[0], w2.shape[1]
    h = torch.empty(n_rows, ff, dtype=x.dtype, device=x.device)
    if out is None:
        out = torch.empty(n_rows, w2.shape[2], dtype=x.dtype, device=x.device)
    grouped_swiglu(x, offs, w13, h, rows=rows, config=configs[0], programs=programs)
    return grouped_gemm(h, offs, w2, out, config=configs[1], programs=programs)
