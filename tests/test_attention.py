"""cuco.kernels.attention: ring attention's block and the fused log-sum-exp merge.

On CPUs: the CPU path against an fp32 reference (causal and full blocks, grouped-query heads, odd lengths, the
log-sum-exp too), and the merge kernel in Triton's interpreter against torch's separate ops (fp16 blocks there, as
the other interpreted kernel tests use). On a GPU: cuDNN and flash against the reference and each other, bitwise
deterministic, and the same merge tests compiled, with bf16 blocks.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at the import below
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from cuco.kernels import attention  # noqa: E402
from cuco.kernels.attention import block_attention, choose_backend, merge_lse_  # noqa: E402

DEVICE = torch.device("cuda" if gpu_count() else "cpu")
BLOCK_DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16  # a block's O, as the merge reads it

# (Lq, Lk, H, KV, D, causal): grouped-query (4 and 8 query heads a KV head), multi-head and multi-query, odd lengths,
# one token, and full blocks of unequal lengths (a query chunk against a block of two chunks).
SHAPES = [(7, 7, 8, 2, 16, True), (13, 13, 4, 1, 32, True), (5, 5, 4, 4, 32, False), (1, 1, 8, 2, 32, True),
          (13, 29, 8, 2, 32, False), (24, 48, 8, 2, 64, False), (37, 37, 32, 8, 128, True),
          (37, 37, 32, 8, 128, False)]
IDS = [f"{lq}x{lk}-h{h}kv{kv}-d{d}-{'causal' if c else 'full'}" for lq, lk, h, kv, d, c in SHAPES]
# Llama-3-8B heads at lengths a GPU kernel tiles unevenly, and the workload's small shapes' chunks.
GPU_SHAPES = SHAPES + [(L, L, 32, 8, 128, c) for L in (100, 1000, 2048) for c in (True, False)] + \
    [(24, 24, 8, 2, 64, True), (5, 5, 4, 1, 32, True), (5, 10, 4, 1, 32, False)]
GPU_IDS = [f"{lq}x{lk}-h{h}kv{kv}-d{d}-{'causal' if c else 'full'}" for lq, lk, h, kv, d, c in GPU_SHAPES]


def _inputs(lq, lk, h, kv, d, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, d, generator=gen).to(device=device, dtype=torch.bfloat16)
            for n, heads in ((lq, h), (lk, kv), (lk, kv))]


def _reference(q, k, v, causal, scale):
    """fp32 attention with each KV head repeated for its query heads: (O [Lq, H, D], log-sum-exp [H, Lq])."""
    group = q.shape[1] // k.shape[1]
    kf, vf = (x.float().repeat_interleave(group, dim=1) for x in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if causal:
        s.masked_fill_(torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vf), torch.logsumexp(s, -1)


def _assert_close(o, lse, want_o, want_lse, o_rtol=2e-2):
    """O to bf16's rounding (relative to the whole output), the log-sum-exp as tightly as the workload holds it."""
    assert o.shape == want_o.shape and lse.shape == want_lse.shape
    assert lse.dtype == torch.float32
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    err = ((o.float() - want_o).norm() / want_o.norm()).item()
    assert err < o_rtol, err
    assert torch.allclose(lse, want_lse, rtol=1e-4, atol=1e-4), (lse - want_lse).abs().max().item()


@pytest.mark.parametrize("lq,lk,h,kv,d,causal", SHAPES, ids=IDS)
def test_the_cpu_block_matches_fp32_attention(lq, lk, h, kv, d, causal):
    q, k, v = _inputs(lq, lk, h, kv, d, device="cpu")
    scale = 1 / math.sqrt(d)
    o, lse = block_attention(q, k, v, causal, scale)
    assert o.dtype == torch.bfloat16
    _assert_close(o, lse, *_reference(q, k, v, causal, scale))


def test_the_cpu_block_repeats_kv_heads_where_torch_cannot_group_them(monkeypatch):
    """torch before 2.9: the CPU kernel gets the KV heads repeated, with the same result."""
    q, k, v = _inputs(13, 13, 8, 2, 32, device="cpu")
    monkeypatch.setattr(attention, "CPU_GQA", False)
    _assert_close(*block_attention(q, k, v, True, 0.2), *_reference(q, k, v, True, 0.2))


def test_blocks_are_checked_and_the_cpu_takes_its_own_kernel():
    q, k, v = _inputs(8, 8, 4, 2, 16, device="cpu")
    assert choose_backend(q, k, True) == "cpu"
    with pytest.raises(ValueError, match="diagonal"):
        block_attention(q, k[:4], v[:4], True)
    with pytest.raises(ValueError, match="multiple"):
        block_attention(q, k[:, :1].expand(8, 3, 16), v[:, :1].expand(8, 3, 16), False)
    with pytest.raises(ValueError, match="unknown backend"):
        block_attention(q, k, v, False, backend="fa9")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rows", [8, 16, 64])
def test_a_block_split_by_query_rows_is_the_whole_block(rows, causal):
    """The split schedule over the CPU kernel, at a length no chunk divides (and one chunk for all of it): each causal
    chunk's diagonal merged with the keys before it, each full chunk against every key."""
    q, k, v = _inputs(37, 37, 8, 2, 32, device="cpu")
    o, lse = attention.split_rows(q, k, v, causal, 0.2, rows, base=attention._cpu)
    assert o.dtype == q.dtype
    _assert_close(o, lse, *_reference(q, k, v, causal, 0.2))


def test_a_measured_cudnn_choice_is_not_taken_where_cudnn_is_not(monkeypatch):
    """A GPU block (only its shape read) whose measured choice runs on cuDNN: flash where cuDNN does not take it."""
    q, k = SimpleNamespace(is_cuda=True, shape=(8, 4, 16)), SimpleNamespace(shape=(8, 2, 16))
    monkeypatch.setattr(attention, "CHOICE", {(4, 2, 16, True, 8, 8): "cudnn_split4096"})
    monkeypatch.setattr(attention, "cudnn_fits", lambda q, k: False)
    assert choose_backend(q, k, True) == "flash"
    monkeypatch.setattr(attention, "cudnn_fits", lambda q, k: True)
    assert choose_backend(q, k, True) == "cudnn_split4096"


def _merge_case(rows, heads, d, device=DEVICE, seed=0):
    """A running (acc, acc_lse) and a block's (o, lse), in the ring's layouts: acc [L, H, D] fp32, the log-sum-exps
    [H, L] as slices of wider buffers (a query chunk's columns of the lse output), o strided as a backend's may be."""
    gen = torch.Generator().manual_seed(seed)
    acc = torch.randn(rows, heads, d, generator=gen).to(device)
    acc_lse = (torch.randn(heads, 2 * rows + 1, generator=gen) * 3).to(device)[:, 1:rows + 1]
    o = torch.randn(heads, rows, d, generator=gen).to(device=device, dtype=BLOCK_DTYPE).transpose(0, 1)
    lse = (torch.randn(heads, rows + 3, generator=gen) * 3).to(device)[:, 2:rows + 2]
    return acc, acc_lse, o, lse


@pytest.mark.parametrize("rows,heads,d", [(5, 3, 24), (13, 4, 32), (33, 8, 64), (2, 32, 128)])
@pytest.mark.parametrize("first", [False, True])
def test_the_fused_merge_matches_torchs_separate_ops(rows, heads, d, first):
    fused = _merge_case(rows, heads, d)
    unfused = [x.clone() for x in fused[:2]]
    merge_lse_(*fused, first=first, fused=True)
    merge_lse_(*unfused, *fused[2:], first=first, fused=False)
    assert torch.allclose(fused[0], unfused[0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(fused[1], unfused[1], rtol=1e-6, atol=1e-6)


def test_the_fused_merge_keeps_empty_rows_empty():
    """A running row with no keys yet (-inf) takes the block's row; two empty rows stay empty, not NaN."""
    acc, acc_lse, o, lse = _merge_case(4, 2, 16)
    acc_lse[0] = float("-inf")
    lse[0, 0] = float("-inf")
    merge_lse_(acc, acc_lse, o, lse, fused=True)
    assert torch.equal(acc[1:, 0], o[1:, 0].float()) and torch.equal(acc_lse[0, 1:], lse[0, 1:])
    assert torch.equal(acc[0, 0], torch.zeros_like(acc[0, 0])) and acc_lse[0, 0] == float("-inf")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_blocks_merged_by_the_log_sum_exp_make_the_whole_attention(causal, fused):
    """A query chunk against keys cut into three blocks (the last the diagonal one when causal), merged one by one:
    the attention of the chunk to all the keys, its log-sum-exp included."""
    c, h, kv, d = 11, 8, 2, 32
    q, k, v = _inputs(c, 3 * c, h, kv, d)
    scale = 1 / math.sqrt(d)
    acc = torch.empty(c, h, d, device=DEVICE)
    acc_lse = torch.empty(h, c, device=DEVICE)
    for j in range(3):
        keys = slice(j * c, (j + 1) * c)
        o, lse = block_attention(q, k[keys], v[keys], causal and j == 2, scale)
        merge_lse_(acc, acc_lse, o.to(BLOCK_DTYPE) if fused and DEVICE.type == "cpu" else o, lse, first=j == 0,
                   fused=fused)
    # the whole: queries at positions 2c..3c-1 (causal: each sees every key up to its own position)
    q_whole = torch.cat([torch.zeros(2 * c, h, d, device=DEVICE, dtype=q.dtype), q])
    want_o, want_lse = _reference(q_whole, k, v, causal, scale)
    _assert_close(acc, acc_lse, want_o[2 * c:], want_lse[:, 2 * c:])


gpu = pytest.mark.gpu(1)


@gpu
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
@pytest.mark.parametrize("lq,lk,h,kv,d,causal", GPU_SHAPES, ids=GPU_IDS)
def test_each_gpu_backend_matches_fp32_attention_and_repeats_its_bits(backend, lq, lk, h, kv, d, causal):
    q, k, v = _inputs(lq, lk, h, kv, d)
    if backend == "cudnn" and not attention.cudnn_fits(q, k):
        pytest.skip("torch's cuDNN attention does not take this shape")
    scale = 1 / math.sqrt(d)
    o, lse = block_attention(q, k, v, causal, scale, backend=backend)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape
    _assert_close(o, lse, *_reference(q, k, v, causal, scale))
    again = block_attention(q, k, v, causal, scale, backend=backend)
    assert torch.equal(o, again[0]) and torch.equal(lse, again[1])


@gpu
@pytest.mark.parametrize("lq,lk,h,kv,d,causal", GPU_SHAPES, ids=GPU_IDS)
def test_cudnn_and_flash_agree(lq, lk, h, kv, d, causal):
    q, k, v = _inputs(lq, lk, h, kv, d)
    if not attention.cudnn_fits(q, k):
        pytest.skip("torch's cuDNN attention does not take this shape")
    o1, lse1 = block_attention(q, k, v, causal, backend="cudnn")
    o2, lse2 = block_attention(q, k, v, causal, backend="flash")
    assert ((o1.float() - o2.float()).norm() / o2.float().norm()).item() < 1e-2
    assert torch.allclose(lse1, lse2, rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_the_split_cudnn_block_matches_fp32_attention_and_repeats_its_bits(causal):
    """cuDNN by 384 query rows at 1000 tokens (the last chunk short), as the long blocks run it."""
    q, k, v = _inputs(1000, 1000, 32, 8, 128)
    if not attention.cudnn_fits(q, k):
        pytest.skip("torch's cuDNN attention does not take this shape")
    o, lse = attention.split_rows(q, k, v, causal, None, 384)
    _assert_close(o, lse, *_reference(q, k, v, causal, 128 ** -0.5))
    again = attention.split_rows(q, k, v, causal, None, 384)
    assert torch.equal(o, again[0]) and torch.equal(lse, again[1])


@gpu
def test_auto_takes_cudnn_on_a_gpu_that_has_it():
    q, k, _ = _inputs(256, 256, 32, 8, 128)
    assert choose_backend(q, k, True) == ("cudnn" if attention.cudnn_fits(q, k) else "flash")
