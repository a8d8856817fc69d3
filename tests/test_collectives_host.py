"""cuco_collectives.cuh's copy and reduction loops, compiled by nvcc and run on the CPU thread by thread: every
alignment of source and destination, tails, unroll edges and thread counts, against numpy and torch."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from conftest import ROOT

from cuco.runner.build.nvcc import build

pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def lib():
    res = build(ROOT / "tests" / "cuda" / "collectives_host.cu")
    assert res.ok, res.log
    return ctypes.CDLL(str(res.library))


def _aligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` starting on a 64-byte boundary, so that the offsets the tests add decide every alignment
    (offset 0 takes the 16-byte path, whatever the allocator did)."""
    buf = np.empty(a.nbytes + 64, dtype=np.uint8)
    start = -buf.ctypes.data % 64
    out = buf[start:start + a.nbytes].view(a.dtype)
    out[:] = a
    assert out.ctypes.data % 64 == 0
    return out


def _addr(a: np.ndarray, offset: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data + offset)


def _copy(lib, pairs: list[tuple[np.ndarray, int, np.ndarray, int]], n: int, threads: int) -> None:
    """pairs: (destination, its byte offset, source, its byte offset)."""
    dst = (ctypes.c_void_p * len(pairs))(*[_addr(d, off) for d, off, _, _ in pairs])
    src = (ctypes.c_void_p * len(pairs))(*[_addr(s, off) for _, _, s, off in pairs])
    assert lib.cuco_test_copy(dst, src, len(pairs), ctypes.c_size_t(n), ctypes.c_size_t(threads)) == 0


def _check(dst: np.ndarray, off: int, src: np.ndarray, src_off: int, n: int, fill: int) -> None:
    assert np.array_equal(dst[off:off + n], src[src_off:src_off + n])
    assert (dst[:off] == fill).all() and (dst[off + n:] == fill).all()  # nothing written outside


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 64, 65, 1000, 4099])
@pytest.mark.parametrize("threads", [1, 3, 64])
def test_copy_every_alignment(lib, n, threads):
    rng = np.random.default_rng(n * 7 + threads)
    for src_off in range(16):
        for dst_off in (0, 1, 2, 4, 8, 9, 15):
            src = _aligned(rng.integers(0, 256, n + 64, dtype=np.uint8))
            dst = _aligned(np.full(n + 64, 0xAB, dtype=np.uint8))
            _copy(lib, [(dst, dst_off, src, src_off)], n, threads)
            _check(dst, dst_off, src, src_off, n, 0xAB)


OFFSETS = [(0, 0, 0, 0), (16, 32, 0, 48), (8, 24, 8, 8), (1, 17, 3, 5), (2, 4, 6, 0)]
OFFSET_IDS = ["aligned", "aligned-16", "aligned-8", "mixed-odd", "mixed-even"]


@pytest.mark.parametrize("offsets", OFFSETS, ids=OFFSET_IDS)
@pytest.mark.parametrize("n", [0, 5, 16, 1000, 4099])
def test_copy_one_source_to_several_destinations(lib, offsets, n):
    """The all-gather's copy: one source, every rank's slot."""
    rng = np.random.default_rng(n)
    src = _aligned(rng.integers(0, 256, n + 64, dtype=np.uint8))
    dsts = [(_aligned(np.full(n + 64, 0xCD, dtype=np.uint8)), off) for off in offsets[:3]]
    _copy(lib, [(d, off, src, offsets[3]) for d, off in dsts], n, 7)
    for d, off in dsts:
        _check(d, off, src, offsets[3], n, 0xCD)


@pytest.mark.parametrize("offsets", OFFSETS, ids=OFFSET_IDS)
@pytest.mark.parametrize("n", [0, 5, 16, 1000, 4099])
def test_copy_pairs_together(lib, offsets, n):
    """The all-to-all's copy: block p of one send buffer to rank p, every pair in the same pass."""
    rng = np.random.default_rng(n + 1)
    send = _aligned(rng.integers(0, 256, 3 * (n + 64), dtype=np.uint8))
    dsts = [_aligned(np.full(n + 64, 0xEF, dtype=np.uint8)) for _ in range(3)]
    pairs = [(d, offsets[i], send, i * (n + 64) + offsets[3]) for i, d in enumerate(dsts)]
    _copy(lib, pairs, n, 5)
    for d, off, s, s_off in pairs:
        _check(d, off, s, s_off, n, 0xEF)


def _reduce(lib, dtype, arrays, outs, lo, hi, threads, elem_offset=0):
    ins = (ctypes.c_void_p * len(arrays))(*[_addr(a, elem_offset * a.itemsize) for a in arrays])
    out = (ctypes.c_void_p * len(outs))(*[_addr(o, elem_offset * o.itemsize) for o in outs])
    fn = lib.cuco_test_reduce_bf16 if dtype == "bf16" else lib.cuco_test_reduce_f32
    assert fn(ins, len(arrays), out, len(outs), ctypes.c_size_t(lo), ctypes.c_size_t(hi), ctypes.c_size_t(threads)) == 0


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 7), (0, 1000), (8, 1000), (3, 517)])
@pytest.mark.parametrize("elem_offset", [0, 1])  # 1: pointers off 16-byte alignment, the element path
def test_reduce_sums_in_rank_order(lib, dtype, ranks, lo, hi, elem_offset):
    threads = 5
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(ranks * 1000 + hi)
    xs = [torch.randn(hi + 8, generator=gen).to(torch_dtype) for _ in range(ranks)]
    arrays = [_aligned(x.view(torch.int16).numpy() if dtype == "bf16" else x.numpy()) for x in xs]
    outs = [_aligned(np.full_like(arrays[0], -1)) for _ in range(2)]
    _reduce(lib, dtype, arrays, outs, lo, hi, threads, elem_offset)
    acc = torch.zeros(hi + 8, dtype=torch.float32)
    for x in xs:  # fp32, rank 0 first: what the kernels promise
        acc += x.float()
    want = acc.to(torch_dtype)
    want = want.view(torch.int16).numpy() if dtype == "bf16" else want.numpy()
    for o in outs:
        s = slice(elem_offset + lo, elem_offset + hi)
        assert np.array_equal(o[s], want[s])  # inputs are offset as much as the outputs
        assert (o[:elem_offset + lo] == -1).all() and (o[elem_offset + hi:] == -1).all()


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 63, 64, 1000006, 33554432 // 2])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 64, 65])
@pytest.mark.parametrize("kn", [4, 8])
def test_pack_slices_cover_every_element_once_from_aligned_starts(lib, count, parts, kn):
    """How all-reduce splits ranks' slices and reduceScatterPush splits CTAs' ranges and their chunks."""
    lo, hi = (ctypes.c_size_t * parts)(), (ctypes.c_size_t * parts)()
    assert lib.cuco_test_pack_slice(ctypes.c_size_t(count), ctypes.c_size_t(kn), ctypes.c_size_t(parts), lo, hi) == 0
    assert lo[0] == 0 and hi[parts - 1] == count
    for i in range(parts):
        assert lo[i] <= hi[i] and lo[i] % kn == 0
        if i:
            assert lo[i] == hi[i - 1]
    # Balanced to within one pack, but for the tail the last part takes.
    sizes = [hi[i] - lo[i] for i in range(parts - 1)]
    assert not sizes or max(sizes) - min(sizes) <= kn


# (lines, columns, ld, ranks, CTAs, threads a CTA, pieces): shapes of the all-reduce fusion knob's pieces, by every
# emulated rank, CTA and thread. m1 has fewer lines than ranks (each rank a share of the columns); lines fewer than
# the CTAs, and more; an ld past the columns, or off 16 bytes (the element path); CTAs that do not divide evenly.
PIECE_CASES = [(24, 40, 40, 2, 64, 16, 2), (7, 72, 72, 2, 4, 8, 4), (1, 8192, 8192, 2, 64, 16, 4),
               (3, 200, 200, 4, 8, 8, 4), (128, 256, 256, 8, 64, 4, 2), (5, 100, 104, 2, 3, 7, 3),
               (9, 37, 43, 3, 5, 3, 2)]


@pytest.mark.parametrize("lines, cols, ld, ranks, ctas, threads, pieces", PIECE_CASES)
def test_an_all_reduce_cut_by_columns_sums_every_element_of_every_piece(lib, lines, cols, ld, ranks, ctas, threads,
                                                                        pieces):
    """allReducePieceKernel's share (pieceShare) over every piece the GEMM is cut into: every element of the
    columns summed by exactly one rank and group of CTAs, written on every rank with the sum in rank order, nothing
    past them; pieces cut as packSlice cuts them."""
    gen = torch.Generator().manual_seed(lines * 100 + cols + ranks)
    xs = [torch.randn(lines * ld, generator=gen).to(torch.bfloat16) for _ in range(ranks)]
    arrays = [_aligned(x.view(torch.int16).numpy()) for x in xs]
    outs = [_aligned(np.full_like(arrays[0], -1)) for _ in range(ranks)]
    ins = (ctypes.c_void_p * ranks)(*[_addr(a) for a in arrays])
    out = (ctypes.c_void_p * ranks)(*[_addr(o) for o in outs])
    lo, hi = (ctypes.c_size_t * pieces)(), (ctypes.c_size_t * pieces)()
    assert lib.cuco_test_pack_slice(ctypes.c_size_t(cols), ctypes.c_size_t(8), ctypes.c_size_t(pieces), lo, hi) == 0
    counts = np.zeros(lines * ld, dtype=np.int32)
    for j in range(pieces):
        sizes = [ctypes.c_size_t(v) for v in (ld, lines, lo[j], hi[j], ctas, threads)]
        assert lib.cuco_test_piece_sum_bf16(ins, out, ranks, *sizes) == 0
        assert lib.cuco_test_piece_cover(ranks, *sizes, counts.ctypes.data_as(ctypes.POINTER(ctypes.c_int))) == 0
    assert (counts.reshape(lines, ld)[:, :cols] == 1).all() and (counts.reshape(lines, ld)[:, cols:] == 0).all()
    acc = torch.zeros(lines * ld, dtype=torch.float32)
    for x in xs:
        acc += x.float()
    want = acc.to(torch.bfloat16).view(torch.int16).numpy().reshape(lines, ld)
    for o in outs:
        got = o.reshape(lines, ld)
        assert np.array_equal(got[:, :cols], want[:, :cols])
        assert (got[:, cols:] == -1).all()
