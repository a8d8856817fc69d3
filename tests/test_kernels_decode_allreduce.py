"""cuco.kernels.decode_allreduce: the decode GEMM that all-reduces in its tail, one-shot or two-shot.

Without a GPU the kernel runs in Triton's interpreter (fp16: the interpreter mistranslates bf16) as one rank of two
whose peer has already delivered (its counters at the target), which checks the tiles' owners, the waves, what
goes to the peer and where; on a GPU two emulated ranks on one GPU wait on each other for real.
"""

from __future__ import annotations

import dataclasses

import pytest
from kernel_tensors import DEVICE, DTYPE, nan, partials_for, rand, rel_err

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
from cuco.kernels.decode import DecodeConfig  # noqa: E402
from cuco.kernels.decode_allreduce import gemm_all_reduce_decode, summed_decode_config_for  # noqa: E402
from cuco.kernels.gemm import Partials, partials_counters  # noqa: E402


def _columns(tiles: list[int], block_n: int, n: int) -> torch.Tensor:
    cols = torch.zeros(n, dtype=torch.bool)
    for t in tiles:
        cols[t * block_n:(t + 1) * block_n] = True
    return cols


@pytest.mark.parametrize("two_shot,waves", [(False, 1), (False, 2), (True, 1)], ids=["one_shot", "waves", "two_shot"])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("m,k,n", [(3, 200, 80), (16, 64, 64)])
def test_rank_of_two(m, k, n, rank, two_shot, waves):
    """Rank `rank` of two, its peer ahead: what the peer sends has landed. One-shot: this rank's tile goes to the
    peer's slot for it, one release per tile, and every tile is summed here. Two-shot: the tiles this rank owns
    (tile % 2 == rank) are summed here and the sum sent back; of the others this rank sends its tile and takes the
    owner's sum. Two waves of three tiles leave the second program one."""
    world, target, peer = 2, 5, 1 - rank
    cfg = DecodeConfig(block_n=32, block_k=32, split_k=1, num_stages=2, num_warps=4)
    tiles = triton.cdiv(n, cfg.block_n)
    mine = _columns([t for t in range(tiles) if not two_shot or t % world == rank], cfg.block_n, n)
    a, b = rand(m, k), rand(k, n)
    own = (a.float() @ b.float()).to(DTYPE)  # this rank's partial, rounded as sent
    peer_part = rand(m, n)
    total = (own.float() + peer_part.float()) if rank == 0 else (peer_part.float() + own.float())
    recv = nan(world, m, n)
    recv[peer] = torch.where(mine, peer_part, total.to(DTYPE))  # the peer's partial, or the owner's sum
    counters = torch.full((partials_counters(world, m, n),), target, dtype=torch.int32, device=DEVICE)
    peer_recv = nan(world, m, n)
    peer_counters = torch.zeros(partials_counters(world, m, n), dtype=torch.int32, device=DEVICE)
    out = nan(m, n)
    parts = partials_for(rank, world, recv, counters, {rank: recv, peer: peer_recv},
                         {rank: counters, peer: peer_counters}, target)
    gemm_all_reduce_decode(a, b, out, parts, two_shot=two_shot, waves=waves, config=cfg)
    assert rel_err(out, total) < 1e-2
    sent = torch.where(mine, total.to(DTYPE), own) if two_shot else own
    assert rel_err(peer_recv[rank], sent.float()) < 1e-2
    assert torch.isnan(peer_recv[peer]).all(), "a push wrote into the slot of another sender"
    if waves > 1:  # this rank's own copy waited in its own slot
        assert rel_err(recv[rank], own.float()) < 1e-2
    assert peer_counters[rank * tiles:(rank + 1) * tiles].tolist() == [1] * tiles
    assert not peer_counters[:rank * tiles].any() and not peer_counters[(rank + 1) * tiles:].any()
    first = out.clone()
    peer_counters.zero_()
    gemm_all_reduce_decode(a, b, out.fill_(float("nan")), parts, two_shot=two_shot, waves=waves, config=cfg)
    assert torch.equal(out, first), "the same inputs gave other bits"


def test_refusals():
    """More rows than the decode kernel takes, counters sized for a smaller shape, waves with two-shot, a
    configuration that splits K: each refused by name before a launch."""
    m, k, n = 16, 64, 64
    few = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    parts = Partials(0, 2, nan(2, m, n), few, torch.zeros(2, dtype=torch.int64, device=DEVICE),
                     torch.zeros(2, dtype=torch.int64, device=DEVICE), 1)
    with pytest.raises(ValueError, match="at most 128"):
        gemm_all_reduce_decode(rand(129, k), rand(k, n), nan(129, n), parts)
    with pytest.raises(ValueError, match="partials_counters"):
        gemm_all_reduce_decode(rand(m, k), rand(k, n), nan(m, n), parts)
    parts = dataclasses.replace(parts, counters=torch.zeros(partials_counters(2, m, n), dtype=torch.int32,
                                                             device=DEVICE))
    with pytest.raises(ValueError, match="waves of tiles are one-shot"):
        gemm_all_reduce_decode(rand(m, k), rand(k, n), nan(m, n), parts, two_shot=True, waves=2)
    with pytest.raises(ValueError, match="K is not split"):
        gemm_all_reduce_decode(rand(m, k), rand(k, n), nan(m, n), parts,
                               config=DecodeConfig(block_n=32, block_k=32, split_k=2, num_stages=2, num_warps=4))


@pytest.mark.parametrize("m,split_k,waves", [(1, 1, 1), (8, 2, 1), (32, 4, 1), (128, 1, 1), (128, 2, 1), (128, 1, 2),
                                             (1, 1, 4)])
def test_config_keeps_every_program_on_an_sm(m, split_k, waves):
    """At the shipped decode shape (world 2: K 4096, N 8192) on a 132-SM Hopper: tiles widen with the splits (the
    gathering kernel's) so that every program has an SM, narrow with the waves, and the stages fit in shared
    memory."""
    cfg = summed_decode_config_for(m, 8192, 4096, 132, split_k, waves)
    assert triton.cdiv(triton.cdiv(8192, cfg.block_n), waves) * split_k <= 132
    block_m = max(16, triton.next_power_of_2(m))
    assert (block_m * cfg.block_k + cfg.block_k * cfg.block_n) * 2 * cfg.num_stages <= 192 * 1024


@pytest.mark.gpu(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("two_shot,waves", [(False, 1), (True, 1), (False, 2)], ids=["one_shot", "two_shot", "waves"])
@pytest.mark.parametrize("m,k,n", [(1, 4096, 8192), (8, 4096, 8192), (128, 4096, 8192), (32, 4096, 8192),
                                   (3, 272, 200)])
def test_two_ranks_at_once(m, k, n, two_shot, waves):
    """Two ranks' kernels at once on one GPU (tiles as wide as it takes for both to be resident), over two receive
    buffers by run parity: right every run, the same bits on both ranks, and the same bits when the same inputs
    come again."""
    world = 2
    half = torch.cuda.get_device_properties(DEVICE).multi_processor_count // world
    cfg = summed_decode_config_for(m, n, k, half, waves=waves)
    recv = [[nan(world, m, n) for _ in range(2)] for _ in range(world)]
    counters = [torch.zeros(partials_counters(world, m, n), dtype=torch.int32, device=DEVICE) for _ in range(world)]
    parts = {(r, buf): partials_for(r, world, recv[r][buf], counters[r], {s: recv[s][buf] for s in range(world)},
                                    dict(enumerate(counters)), 0) for r in range(world) for buf in range(2)}
    streams = [torch.cuda.Stream() for _ in range(world)]
    outs = [nan(m, n) for _ in range(world)]

    def launch(r, a, b, buf, target):
        with torch.cuda.stream(streams[r]):
            gemm_all_reduce_decode(a, b, outs[r], dataclasses.replace(parts[r, buf], target=target),
                                   two_shot=two_shot, waves=waves, config=cfg)

    a = [rand(m, k) for _ in range(world)]
    b = [rand(k, n) for _ in range(world)]
    for r in range(world):  # load the kernel alone first: the counters preset to the target
        for c in counters:
            c.fill_(1)
        torch.cuda.synchronize()
        launch(r, a[r], b[r], 0, 1)
        torch.cuda.synchronize()
    for c in counters:
        c.zero_()
    seen = []
    for run in range(1, 4):
        if run < 3:
            a = [rand(m, k) for _ in range(world)]
            b = [rand(k, n) for _ in range(world)]
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        for r in range(world):
            launch(r, a[r], b[r], run % 2, run)
        torch.cuda.synchronize()
        total = sum(a[r].float() @ b[r].float() for r in range(world))
        for r in range(world):
            assert rel_err(outs[r], total) < 1e-2, f"rank {r}, run {run}"
        assert torch.equal(outs[0], outs[1]), "the ranks' all-reduced results differ"
        seen.append([o.clone() for o in outs])
    assert all(torch.equal(x, y) for x, y in zip(seen[1], seen[2])), "the same inputs gave other bits"
