"""cuco.kernels.decode_allgather: the decode GEMM whose programs gather the rows first, in the same launch.

Without a GPU the kernel runs in Triton's interpreter (fp16) as one rank of two whose peer has already delivered
(its rows in the buffer, every count in), which checks the shares of the copy, where they land, the counts and the
product; on a GPU two emulated ranks on one GPU wait on each other for real.
"""

from __future__ import annotations

import pytest
from kernel_tensors import DEVICE, nan, ptrs, rand, rel_err

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
from cuco.kernels.decode import DecodeConfig, DecodeWorkspace  # noqa: E402
from cuco.kernels.decode_allgather import Gather, gathered_decode_workspace, gemm_decode_gathered  # noqa: E402
from cuco.kernels.decode_allreduce import summed_decode_config_for  # noqa: E402


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("rows,k,n", [(2, 200, 80), (8, 64, 64), (5, 4104, 40)])
def test_rank_of_two(rows, k, n, rank, split_k):
    """Rank `rank` of two, its peer ahead: the peer's rows are in this rank's buffer and every count is in. This
    rank's rows land in the peer's buffer, shared among the programs (4104 x 5 elements: a share that
    is not a whole number of steps), each program counts itself once on both ranks, and C is all the rows by B."""
    world, target, peer = 2, 4, 1 - rank
    cfg = DecodeConfig(block_n=32, block_k=32, split_k=split_k, num_stages=2, num_warps=4)
    programs = triton.cdiv(n, cfg.block_n) * split_k
    m = rows * world
    A, b = rand(m, k), rand(k, n)
    own, theirs = slice(rank * rows, (rank + 1) * rows), slice(peer * rows, (peer + 1) * rows)
    gathered, peer_gathered = nan(m, k), nan(m, k)
    gathered[theirs] = A[theirs]
    # The interpreter runs the programs one after another: a program's tile may read rows a later program copies,
    # which on a GPU its wait for every count prevents; so this rank's rows are in its buffer already, and their
    # copy is checked in the peer's.
    gathered[own] = A[own]
    arrived = torch.full((1,), target * world * programs, dtype=torch.int32, device=DEVICE)
    peer_arrived = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    bufs, counters = {rank: gathered, peer: peer_gathered}, {rank: arrived, peer: peer_arrived}
    gather = Gather(gathered, rank * rows, ptrs([bufs[s][rank * rows].data_ptr() for s in range(world)]),
                    ptrs([counters[s].data_ptr() for s in range(world)]), arrived, target)
    ws = DecodeWorkspace.create(DEVICE, split_k * m * n, triton.cdiv(n, cfg.block_n))
    c = nan(m, n)
    gemm_decode_gathered(A[own].clone(), b, c, gather, ws, split_k=split_k, config=cfg)
    assert rel_err(c, A.float() @ b.float()) < 1e-2
    assert torch.equal(peer_gathered[own], A[own])
    assert torch.isnan(peer_gathered[theirs]).all(), "a program wrote outside this rank's rows"
    assert peer_arrived.item() == programs and arrived.item() == target * world * programs + programs
    assert not ws.counters.any(), "the split counters were not left at zero for the next launch"


def test_refusals():
    m, k, n = 16, 64, 64
    one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    gather = Gather(nan(m, k), 0, ptrs([0, 0]), ptrs([0, 0]), one, 1)
    with pytest.raises(ValueError, match="at most 128"):
        gemm_decode_gathered(rand(65, k), rand(k, n), nan(130, n), Gather(nan(130, k), 0, ptrs([0, 0]),
                                                                            ptrs([0, 0]), one, 1),
                             gathered_decode_workspace(130, n, k, DEVICE))
    with pytest.raises(ValueError, match="workspace is too small"):
        gemm_decode_gathered(rand(8, k), rand(k, n), nan(m, n), gather, gathered_decode_workspace(m, n, k, DEVICE),
                             split_k=2)


@pytest.mark.gpu(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("rows,k,n,split_k,prefetch_rows", [(64, 8192, 4096, 2, 0), (64, 8192, 4096, 2, 512),
                                                            (64, 8192, 4096, 1, 0), (4, 8192, 4096, 2, 512),
                                                            (48, 264, 200, 1, 512)])
def test_two_ranks_at_once(rows, k, n, split_k, prefetch_rows):
    """Two ranks' kernels at once on one GPU (tiles as wide as it takes for both to be resident), over two gathered
    buffers by run parity, fresh rows each run: right every run (with B's first rows prefetched too, more of them
    than a slice of K has at the odd shape)."""
    world = 2
    m = rows * world
    half = torch.cuda.get_device_properties(DEVICE).multi_processor_count // world
    cfg = summed_decode_config_for(m, n, k, half, split_k)
    bufs = [[nan(m, k) for _ in range(2)] for _ in range(world)]
    arrived = [torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    flags = ptrs([arrived[s].data_ptr() for s in range(world)])
    dests = {(r, par): ptrs([bufs[s][par][r * rows].data_ptr() for s in range(world)])
             for r in range(world) for par in range(2)}
    ws = [DecodeWorkspace.create(DEVICE, split_k * m * n, triton.cdiv(n, cfg.block_n)) for _ in range(world)]
    streams = [torch.cuda.Stream() for _ in range(world)]
    programs = triton.cdiv(n, cfg.block_n) * split_k

    def launch(r, A, b, c, run):
        with torch.cuda.stream(streams[r]):
            gemm_decode_gathered(A[r * rows:(r + 1) * rows], b, c, Gather(bufs[r][run % 2], r * rows, dests[r, run % 2],
                                                                          flags, arrived[r], run), ws[r],
                                 split_k=split_k, prefetch_rows=prefetch_rows, config=cfg)

    A, b = rand(m, k), rand(k, n)
    for r in range(world):  # load the kernel alone first: every count already in
        arrived[r].fill_(world * programs)
        torch.cuda.synchronize()
        launch(r, A, b, nan(m, n), 1)
        torch.cuda.synchronize()
    for x in arrived:
        x.zero_()
    for run in range(1, 4):
        A, bs = rand(m, k), [rand(k, n) for _ in range(world)]
        cs = [nan(m, n) for _ in range(world)]
        torch.cuda.synchronize()
        for r in range(world):
            launch(r, A, bs[r], cs[r], run)
        torch.cuda.synchronize()
        for r in range(world):
            assert rel_err(cs[r], A.float() @ bs[r].float()) < 1e-2, f"rank {r}, run {run}"
