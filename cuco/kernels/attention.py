"""Ring attention's block: forward attention of one query chunk against one key/value chunk on the fastest kernel the
machine has, and the merge of a block's partial result into the running one by the log-sum-exp, fused.

Layout, the ring's buffers (a row per token): q [Lq, H, D], k and v [Lk, KV, D], H a multiple of KV (grouped-query
heads: query head h reads key/value head h // (H / KV); on GPUs they are never repeated). A block returns O
[Lq, H, D] in q's dtype and the log-sum-exp [H, Lq] in fp32 (the natural log of each row's softmax denominator over
the scaled scores): the layouts of ring_attention's outputs, so partial results merge and land without a transpose.
Causal means the diagonal block: Lq == Lk, query i sees keys 0..i.

Backends, each returning the log-sum-exp beside O:
- cudnn: torch's cuDNN attention (aten._scaled_dot_product_cudnn_attention). On an H100 with torch 2.11 it ran causal
  attention at Llama-3-8B heads at 592-614 TFLOP/s where the flash kernel ran 306-347: the library bound must use
  the fastest kernel, so it is the default wherever it takes the shape.
- flash: torch's FlashAttention-2 (aten._flash_attention_forward), which takes [B, L, H, D] as the buffers hold it.
- cpu: torch's CPU flash kernel (CI, the CPU path). It takes grouped-query heads from torch 2.9; before that the
  key/value heads are repeated, since the older kernel would read past the last one.
- cudnn_split<R>: cuDNN called on R queries at a time. A causal block becomes, per chunk of R queries, its diagonal
  (causal) and the keys before it (one full call), merged by the log-sum-exp; a full block, chunks of queries
  against every key. cuDNN's one causal call runs slower at 128K tokens than at 64K (549 against 589 TFLOP/s on an
  H200); the same kernel on 16K-row chunks runs the 128K sequence at 582.
`auto` picks per shape: CHOICE where benchmarks/attention.py measured another backend faster, else cuDNN where it
takes the shape, else flash.

The merge (merge_lse_): O <- O * exp(lse - new) + O_b * exp(lse_b - new), lse <- new = logaddexp(lse, lse_b), in
place, one pass over O and the log-sum-exp in a Triton kernel on GPUs. On CPUs it runs as torch's separate ops;
fused=True runs the kernel there too, in Triton's interpreter (TRITON_INTERPRET=1 at import), as the tests do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

# (H, KV, D, causal, Lq, Lk) -> backend: the block shapes at which benchmarks/results/attention.md measured a
# backend faster than the default one (cuDNN) by more than its noise, both checked against each other. Only
# exceptions are listed.
CHOICE: dict[tuple[int, int, int, bool, int, int], str] = {
    (32, 8, 128, True, 131072, 131072): "cudnn_split16384",  # 242 ms, cuDNN's one call 256 ms (H200)
}

CUDNN_MAX_HEAD_DIM = 128  # what torch's cuDNN attention takes on every GPU and cuDNN 9 (256 needs a newer cuDNN)
CUDNN_MIN_VERSION = 90000  # cuDNN 9: torch's attention through cuDNN starts there
CUDNN_TORCH = torch.__version__ >= "2.5"  # the cuDNN op's signature with attn_bias and compute_log_sumexp
CPU_GQA = torch.__version__ >= "2.9"  # torch's CPU flash kernel reads grouped-query heads itself from 2.9
MERGE_ELEMS = 4096  # elements of O one merge program handles: (row, head) pairs times the head dim, padded

Block = tuple[torch.Tensor, torch.Tensor]


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[L, heads, D] -> [1, heads, L, D], a view: the layout torch's SDPA ops name, the memory left as it is."""
    return x.transpose(0, 1).unsqueeze(0)


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> Block:
    """cuDNN takes any strides with a unit last one, so the [L, H, D] buffers go in as they are (its O is allocated
    in q's layout); its log-sum-exp comes as [1, H, L, 1] or [1, H, L] by torch's version."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        _heads_first(q), _heads_first(k), _heads_first(v), None, True, 0.0, causal, False, scale=scale)
    return out[0][0].transpose(0, 1), out[1].reshape(q.shape[1], q.shape[0])


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> Block:
    out = torch.ops.aten._flash_attention_forward(q[None], k[None], v[None], None, None, q.shape[0], k.shape[0],
                                                  0.0, causal, False, scale=scale)
    return out[0][0], out[1][0]


def _cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> Block:
    kh, vh = _heads_first(k), _heads_first(v)
    group = q.shape[1] // k.shape[1]
    if group > 1 and not CPU_GQA:
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(_heads_first(q), kh, vh, 0.0, causal,
                                                                      scale=scale)
    return out[0][0].transpose(0, 1), out[1][0]


def split_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, rows: int,
               base: Callable[..., Block] = _cudnn) -> Block:
    """`base` on `rows` queries at a time, the chunks' O and log-sum-exp written into the block's: a causal chunk is
    its diagonal merged with the keys before it (the merge in place, in O's dtype: each part rounded once)."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], device=q.device, dtype=torch.float32)
    for start in range(0, q.shape[0], rows):
        end = min(start + rows, q.shape[0])
        keys = slice(start, end) if causal else slice(None)
        merge_lse_(out[start:end], lse[:, start:end], *base(q[start:end], k[keys], v[keys], causal, scale),
                   first=True)
        if causal and start:
            merge_lse_(out[start:end], lse[:, start:end], *base(q[start:end], k[:start], v[:start], False, scale))
    return out, lse


SPLIT_ROWS = (4096, 8192, 16384)  # the query chunks benchmarks/attention.py times: the block lengths cuDNN ran fastest
BACKENDS: dict[str, Callable[..., Block]] = {
    "cudnn": _cudnn, "flash": _flash, "cpu": _cpu,
    **{f"cudnn_split{r}": functools.partial(split_rows, rows=r) for r in SPLIT_ROWS}}


@functools.cache
def _cudnn_on(device_index: int) -> bool:
    """torch (2.5 on) has cuDNN 9 and the GPU is Ampere or newer: where torch's cuDNN attention runs at all."""
    return (CUDNN_TORCH and torch.backends.cudnn.is_available()
            and (torch.backends.cudnn.version() or 0) >= CUDNN_MIN_VERSION
            and torch.cuda.get_device_capability(device_index) >= (8, 0))


def cudnn_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The shapes torch's cuDNN attention takes: fp16 or bf16, a head dim that is a multiple of 8 up to 128, more
    than one key (torch refuses a single key)."""
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[2] % 8 == 0
            and q.shape[2] <= CUDNN_MAX_HEAD_DIM and k.shape[0] > 1 and _cudnn_on(q.device.index or 0))


def choose_backend(q: torch.Tensor, k: torch.Tensor, causal: bool) -> str:
    """The backend `auto` runs for this block: the CPU kernel off GPUs, else the measured choice for the shape,
    else cuDNN where it takes the shape, else flash."""
    if not q.is_cuda:
        return "cpu"
    fits = cudnn_fits(q, k)
    measured = CHOICE.get((q.shape[1], k.shape[1], q.shape[2], causal, q.shape[0], k.shape[0]))
    if measured is not None and (fits or not measured.startswith("cudnn")):
        return measured
    return "cudnn" if fits else "flash"


def _check_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"block_attention: q must be [Lq, H, D] and k, v the same [Lk, KV, D] (got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)})")
    if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"block_attention: q's heads ({q.shape[1]}) must be a multiple of k's ({k.shape[1]}), with "
                         f"the same head dim (got {q.shape[2]} and {k.shape[2]})")
    if causal and q.shape[0] != k.shape[0]:
        raise ValueError(f"block_attention: a causal block is the diagonal one, with as many queries as keys (got "
                         f"{q.shape[0]} and {k.shape[0]})")


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None,
                    backend: str = "auto") -> Block:
    """Attention of q [Lq, H, D] to k, v [Lk, KV, D]: (O [Lq, H, D] in q's dtype, log-sum-exp [H, Lq] in fp32).
    `scale` multiplies the scores (None: 1 / sqrt(D)); `backend` is one of BACKENDS or auto (choose_backend)."""
    _check_block(q, k, v, causal)
    name = choose_backend(q, k, causal) if backend == "auto" else backend
    if name not in BACKENDS:
        raise ValueError(f"block_attention: unknown backend {name!r} (one of auto, {', '.join(BACKENDS)})")
    return BACKENDS[name](q, k, v, causal, scale)


@triton.jit
def _merge_kernel(acc, acc_lse, o, lse, pairs, heads, head_dim,
                  acc_s_row, acc_s_head, acc_lse_s_head, acc_lse_s_row, o_s_row, o_s_head, lse_s_head, lse_s_row,
                  FIRST: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    """A program merges BLOCK_P (row, head) pairs, each a row of head_dim elements of O and one log-sum-exp."""
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    live = p < pairs
    row, head = p // heads, p % heads
    d = tl.arange(0, BLOCK_D)
    mask = live[:, None] & (d < head_dim)[None, :]
    at_acc = (row * acc_s_row + head * acc_s_head)[:, None] + d[None, :]
    at_acc_lse = head * acc_lse_s_head + row * acc_lse_s_row
    b = tl.load(lse + head * lse_s_head + row * lse_s_row, mask=live, other=0.0)
    ob = tl.load(o + (row * o_s_row + head * o_s_head)[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    if FIRST:
        out = ob
        new = b
    else:
        a = tl.load(acc_lse + at_acc_lse, mask=live, other=0.0)
        top = tl.maximum(a, b)
        top = tl.where(top == float("-inf"), 0.0, top)  # two empty rows merge to an empty row, not to NaN
        wa, wb = tl.exp(a - top), tl.exp(b - top)
        total = wa + wb
        empty = total == 0.0
        total = tl.where(empty, 1.0, total)
        new = tl.where(empty, float("-inf"), top + tl.log(total))
        prev = tl.load(acc + at_acc, mask=mask, other=0.0).to(tl.float32)
        out = prev * (wa / total)[:, None] + ob * (wb / total)[:, None]
    tl.store(acc + at_acc, out.to(acc.dtype.element_ty), mask=mask)
    tl.store(acc_lse + at_acc_lse, new, mask=live)


def _check_merge(acc: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> None:
    rows, heads, _ = acc.shape
    if o.shape != acc.shape or acc_lse.shape != (heads, rows) or lse.shape != (heads, rows):
        raise ValueError(f"merge_lse_: acc and o must be [L, H, D], acc_lse and lse [H, L] (got {tuple(acc.shape)}, "
                         f"{tuple(o.shape)}, {tuple(acc_lse.shape)}, {tuple(lse.shape)})")
    if acc.stride(2) != 1 or o.stride(2) != 1:
        raise ValueError("merge_lse_: acc and o must have a unit stride along the head dim")
    if acc_lse.dtype != torch.float32 or lse.dtype != torch.float32:
        raise ValueError("merge_lse_: the log-sum-exps must be fp32")


def _merge_torch_(acc: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, first: bool) -> None:
    """The same merge as torch's separate ops: a pass over O for each of them."""
    if first:
        acc.copy_(o)
        acc_lse.copy_(lse)
        return
    new = torch.logaddexp(acc_lse, lse)
    acc.mul_(torch.exp(acc_lse - new).t().unsqueeze(-1)).add_(o.float() * torch.exp(lse - new).t().unsqueeze(-1))
    acc_lse.copy_(new)


def merge_lse_(acc: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, first: bool = False,
               fused: bool | None = None) -> None:
    """Merge a block's (o [L, H, D], lse [H, L]) into the running (acc, acc_lse) of the same rows, in place (any
    strides, a unit one along D; acc in fp32 or the output's dtype, the log-sum-exps in fp32). first: acc holds
    nothing yet, the block is copied in. fused: the Triton kernel (default on GPUs) or torch's separate ops
    (default elsewhere)."""
    _check_merge(acc, acc_lse, o, lse)
    if not (acc.is_cuda if fused is None else fused):
        _merge_torch_(acc, acc_lse, o, lse, first)
        return
    rows, heads, dim = acc.shape
    block_d = triton.next_power_of_2(dim)
    block_p = max(1, MERGE_ELEMS // block_d)
    if rows * heads == 0:
        return
    _merge_kernel[(triton.cdiv(rows * heads, block_p),)](
        acc, acc_lse, o, lse, rows * heads, heads, dim, acc.stride(0), acc.stride(1), *acc_lse.stride(),
        o.stride(0), o.stride(1), *lse.stride(), FIRST=first, BLOCK_P=block_p, BLOCK_D=block_d, num_warps=4)
