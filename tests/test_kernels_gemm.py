"""cuco.kernels.gemm: the Triton GEMM of the fused placement, plain, gated on arrival flags, and pushing rows.

Without a GPU the kernels run in Triton's interpreter (in fp16: the interpreter mistranslates bf16), which checks
the tile schedule, the masks, the flag indices and the pushes; on a GPU the same tests run compiled, in bf16, and
two emulated ranks on one GPU wait on each other's pushes for real.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at the import below
torch = pytest.importorskip("torch")
from kernel_tensors import partials_for  # noqa: E402

triton = pytest.importorskip("triton")
from cuco.kernels.gemm import (  # noqa: E402
    Arrival,
    GemmConfig,
    Partials,
    Push,
    gemm,
    gemm_all_reduce,
    gemm_gathered,
    gemm_reduce_scatter,
    partials_counters,
)

DEVICE = torch.device("cuda" if gpu_count() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
SMALL = GemmConfig(32, 32, 32, 2, 2, 4)  # the interpreter's cost grows with the tile; the GPU takes it as well


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(DTYPE)


def _nan(*shape: int, dtype=None) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype or DTYPE)


def _rel_err(c: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(c).any(), "an element of the output was never written"
    return ((c.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("m,k,n", [(96, 264, 100), (64, 64, 64), (33, 40, 17), (1, 72, 40)])
def test_plain_gemm(m, k, n):
    """Right, and the same bits whichever programs take which tiles."""
    a, b, c = _rand(m, k), _rand(k, n), _nan(m, n)
    gemm(a, b, c, config=SMALL, programs=3)
    assert _rel_err(c, a.float() @ b.float()) < 1e-2
    first = c.clone()
    gemm(a, b, c.fill_(float("nan")), config=SMALL)
    assert torch.equal(c, first)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("m,k,n,chunks", [(128, 64, 48, 2), (96, 72, 40, 3), (90, 40, 24, 4)])
def test_gathered_rank_of_two(rank, m, k, n, chunks):
    """Rank `rank` of two: the peer's shard is already in a_all (its counters at the target), its own rows are
    pushed into the peer's a_all and released there; 90 rows (45 a shard) are not tile-aligned."""
    shard, target = m // 2, 1  # a first run: the work counter starts at zero
    A, b = _rand(m, k), _rand(k, n)
    own, peer = slice(rank * shard, (rank + 1) * shard), slice((1 - rank) * shard, (2 - rank) * shard)
    a_all = _nan(m, k)
    a_all[peer] = A[peer]
    flags = torch.zeros(2 * chunks, dtype=torch.int32, device=DEVICE)
    flags[(1 - rank) * chunks:(2 - rank) * chunks] = target
    peer_all = _nan(m, k)
    peer_flags = torch.full((2 * chunks,), target - 1, dtype=torch.int32, device=DEVICE)
    c = _nan(m, n)
    push = Push(torch.tensor([peer_all[own].data_ptr()], device=DEVICE),
                torch.tensor([peer_flags.data_ptr()], device=DEVICE), shard=rank, programs=2)
    work = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    gemm_gathered(A[own].clone(), b, c, Arrival(a_all, rank * shard, shard, chunks, flags, target, work), push,
                  config=SMALL, programs=5)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    assert _rel_err(c, A.float() @ b.float()) < 1e-2
    assert torch.equal(peer_all[own], A[own])
    assert torch.isnan(peer_all[peer]).all(), "a push wrote outside this rank's rows"
    expect = [target - 1] * (2 * chunks)
    expect[rank * chunks:(rank + 1) * chunks] = [target] * chunks
    assert peer_flags.tolist() == expect


SUMS = {"reduce_scatter": gemm_reduce_scatter, "all_reduce": gemm_all_reduce}


@pytest.mark.parametrize("op", SUMS)
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("m,k,n", [(128, 64, 48), (96, 72, 40), (90, 40, 24)])
def test_summed_rank_of_two(op, rank, m, k, n):
    """Rank `rank` of two: the peer's partial of the rows this rank sums already landed (its counters at the
    target); this rank's partial of the rows the peer sums is pushed into the peer's slot for it, one release per
    tile. A reduce-scatter sums this rank's shard; an all-reduce every row, on both ranks."""
    world, target, peer = 2, 3, 1 - rank
    rows = m // 2 if op == "reduce_scatter" else m
    mine = slice(rank * rows, (rank + 1) * rows) if op == "reduce_scatter" else slice(0, m)
    theirs = slice(peer * rows, (peer + 1) * rows) if op == "reduce_scatter" else slice(0, m)
    a, b = _rand(m, k), _rand(k, n)
    peer_part = _rand(m, n)  # the peer's a @ b, as it would send it
    recv = _nan(world, rows, n)
    recv[peer] = peer_part[mine]
    counters = torch.full((partials_counters(world, rows, n),), target, dtype=torch.int32, device=DEVICE)
    peer_recv = _nan(world, rows, n)
    peer_counters = torch.zeros(partials_counters(world, rows, n), dtype=torch.int32, device=DEVICE)
    out = _nan(rows, n)
    SUMS[op](a, b, out, partials_for(rank, world, recv, counters, {rank: recv, peer: peer_recv},
                                      {rank: counters, peer: peer_counters}, target), config=SMALL, programs=3)
    full = a.float() @ b.float()
    assert _rel_err(out, full[mine] + peer_part[mine].float()) < 1e-2
    assert _rel_err(peer_recv[rank], full[theirs]) < 1e-2
    assert torch.isnan(peer_recv[peer]).all(), "a push wrote into the slot of another sender"
    tiles = triton.cdiv(rows, SMALL.block_m) * triton.cdiv(n, SMALL.block_n)
    assert peer_counters[rank * tiles:(rank + 1) * tiles].tolist() == [1] * tiles
    assert not peer_counters[(rank + 1) * tiles:].any() and not peer_counters[:rank * tiles].any()


@pytest.mark.parametrize("op", SUMS)
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_summed_rank_of_three(op, rank):
    """Rank `rank` of three (the rank-order sum of any world, where two ranks add own + peer): both peers'
    partials landed, this rank's pushed to each peer's slot for it."""
    m, k, n, world, target = 96, 72, 40, 3, 2
    rows = m // world if op == "reduce_scatter" else m
    mine = slice(rank * rows, (rank + 1) * rows) if op == "reduce_scatter" else slice(0, m)
    a, b = _rand(m, k), _rand(k, n)
    peers = [s for s in range(world) if s != rank]
    parts = {s: _rand(m, n) for s in peers}
    recv = _nan(world, rows, n)
    for s in peers:
        recv[s] = parts[s][mine]
    counters = torch.full((partials_counters(world, rows, n),), target, dtype=torch.int32, device=DEVICE)
    peer_recv = {s: _nan(world, rows, n) for s in peers}
    peer_counters = {s: torch.zeros(partials_counters(world, rows, n), dtype=torch.int32, device=DEVICE)
                     for s in peers}
    out = _nan(rows, n)
    SUMS[op](a, b, out, partials_for(rank, world, recv, counters, {rank: recv, **peer_recv},
                                      {rank: counters, **peer_counters}, target), config=SMALL, programs=3)
    full = a.float() @ b.float()
    assert _rel_err(out, full[mine] + sum(parts[s][mine].float() for s in peers)) < 1e-2
    for s in peers:
        theirs = slice(s * rows, (s + 1) * rows) if op == "reduce_scatter" else slice(0, m)
        assert _rel_err(peer_recv[s][rank], full[theirs]) < 1e-2


@pytest.mark.parametrize("op", SUMS)
def test_too_few_counters_is_refused(op):
    """Counters sized for a smaller shape would index past their end on the peers: refused before any launch."""
    m, k, n = 64, 32, 48
    few = torch.zeros(partials_counters(2, 16, 16), dtype=torch.int32, device=DEVICE)
    parts = partials_for(0, 2, _nan(2, m, n), few, {1: _nan(2, m, n)}, {1: few}, 1)
    with pytest.raises(ValueError, match="partials_counters"):
        SUMS[op](_rand(m, k), _rand(k, n), _nan(m, n), parts, config=SMALL)


@pytest.mark.gpu(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("m,k,n,chunks", [(8192, 1024, 2048, 4), (1024, 512, 384, 1), (96, 264, 200, 2)])
def test_two_ranks_wait_on_each_other(m, k, n, chunks):
    """Two ranks' fused kernels at once on one GPU, each on half the SMs: each pushes its shard into the other's
    a_all and computes the other's rows only once they have arrived. Three epochs over two a_all buffers with
    fresh inputs each: counters only grow, and a buffer is rewritten only after the kernel that read it ended.
    Each rank's pushers join its GEMM once their rows are out (the shared work counter).

    Everything is allocated and each kernel loaded (a solo run against preset counters) before two kernels run
    at once: a cudaMalloc or a lazy module load may wait for the device, i.e. for a kernel that spins on a push
    the other rank has not been launched to make."""
    world, shard = 2, m // 2
    half = torch.cuda.get_device_properties(DEVICE).multi_processor_count // world
    a_all = [[_nan(m, k) for _ in range(2)] for _ in range(world)]
    flags = [torch.zeros(world * chunks, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    work = [torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    push = {(r, buf): Push(torch.tensor([a_all[1 - r][buf][r * shard].data_ptr()], device=DEVICE),
                           torch.tensor([flags[1 - r].data_ptr()], device=DEVICE), shard=r, programs=2)
            for r in range(world) for buf in range(2)}
    streams = [torch.cuda.Stream() for _ in range(world)]

    def launch(r, A, b, c, buf, target):
        with torch.cuda.stream(streams[r]):
            gemm_gathered(A[r * shard:(r + 1) * shard], b, c, Arrival(a_all[r][buf], r * shard, shard, chunks,
                                                                      flags[r], target, work[r]), push[r, buf],
                          programs=half)

    A, b, c = _rand(m, k), _rand(k, n), _nan(m, n)
    for r in range(world):
        flags[r][(1 - r) * chunks:(2 - r) * chunks] = 1
        torch.cuda.synchronize()
        launch(r, A, b, c, 0, 1)
        torch.cuda.synchronize()
    for f in flags + work:
        f.zero_()
    for epoch in range(1, 4):
        A, bs = _rand(m, k), [_rand(k, n) for _ in range(world)]
        cs = [_nan(m, n) for _ in range(world)]
        torch.cuda.synchronize()  # the inputs were drawn on the default stream
        for r in range(world):
            launch(r, A, bs[r], cs[r], epoch % 2, epoch)
        torch.cuda.synchronize()
        for r in range(world):
            assert _rel_err(cs[r], A.float() @ bs[r].float()) < 1e-2, f"rank {r}, epoch {epoch}"


@pytest.mark.gpu(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", SUMS)
@pytest.mark.parametrize("m,k,n", [(8192, 1024, 2048), (256, 512, 384), (96, 136, 200), (8, 4096, 8192),
                                   (128, 4096, 8192)])  # the last: 8-warp tiles (summed_config_for)
def test_two_ranks_sum_at_once(op, m, k, n):
    """Two ranks' fused GEMM + reduce-scatter (or all-reduce) kernels at once on one GPU, each on half the SMs,
    over two recv buffers by run parity: right every run, the same bits when the same inputs come again, and,
    for the all-reduce, the same bits on both ranks."""
    world = 2
    rows = m // world if op == "reduce_scatter" else m
    half = torch.cuda.get_device_properties(DEVICE).multi_processor_count // world
    recv = [[_nan(world, rows, n) for _ in range(2)] for _ in range(world)]
    counters = [torch.zeros(partials_counters(world, rows, n), dtype=torch.int32, device=DEVICE)
                for _ in range(world)]
    parts = {(r, buf): partials_for(r, world, recv[r][buf], counters[r], {s: recv[s][buf] for s in range(world)},
                                     dict(enumerate(counters)), 0) for r in range(world) for buf in range(2)}
    streams = [torch.cuda.Stream() for _ in range(world)]
    outs = [_nan(rows, n) for _ in range(world)]

    def launch(r, a, b, buf, target):
        with torch.cuda.stream(streams[r]):
            SUMS[op](a, b, outs[r], dataclasses.replace(parts[r, buf], target=target), programs=half)

    a = [_rand(m, k) for _ in range(world)]
    b = [_rand(k, n) for _ in range(world)]
    for r in range(world):  # load the kernel alone first: peer counters preset to the target
        counters[r].fill_(1)
        torch.cuda.synchronize()
        launch(r, a[r], b[r], 0, 1)
        torch.cuda.synchronize()
    for c in counters:
        c.zero_()
    seen = []
    for run in range(1, 4):
        if run < 3:
            a = [_rand(m, k) for _ in range(world)]
            b = [_rand(k, n) for _ in range(world)]
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        for r in range(world):
            launch(r, a[r], b[r], run % 2, run)
        torch.cuda.synchronize()
        total = sum(a[r].float() @ b[r].float() for r in range(world))
        for r in range(world):
            want = total[r * rows:(r + 1) * rows] if op == "reduce_scatter" else total
            assert _rel_err(outs[r], want) < 1e-2, f"rank {r}, run {run}"
        if op == "all_reduce":
            assert torch.equal(outs[0], outs[1]), "the ranks' all-reduced results differ"
        seen.append([o.clone() for o in outs])
    assert all(torch.equal(x, y) for x, y in zip(seen[1], seen[2])), "the same inputs gave other bits"


@pytest.mark.parametrize("call", ["gemm", "gemm_reduce_scatter"])
def test_a_strided_view_is_refused_by_name(call):
    """The kernels read row r at r * columns: a transposed operand is refused, not computed on wrongly."""
    a, b_t, c = _rand(64, 32), _rand(48, 32).t(), torch.empty(64, 48, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match=rf"^{call}: b must be a dense row-major 2-D tensor .* pass b\.contiguous\(\)"):
        if call == "gemm":
            gemm(a, b_t, c)
        else:
            parts = Partials(recv=c, counters=torch.zeros(1, dtype=torch.int32, device=DEVICE),
                             dest_ptrs=torch.zeros(1, dtype=torch.int64, device=DEVICE),
                             flag_ptrs=torch.zeros(1, dtype=torch.int64, device=DEVICE), rank=0, world=1, target=1)
            gemm_reduce_scatter(a, b_t, c, parts)
