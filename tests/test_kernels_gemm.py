"""cuco.kernels.gemm: the Triton GEMM of the fused placement, plain, gated on arrival flags, and pushing rows.

Without a GPU the kernels run in Triton's interpreter (in fp16: the interpreter mistranslates bf16), which checks
the tile schedule, the masks, the flag indices and the pushes; on a GPU the same tests run compiled, in bf16, and
two emulated ranks on one GPU wait on each other's pushes for real.
"""

from __future__ import annotations

import os

import pytest

from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at the import below
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from cuco.kernels.gemm import Arrival, GemmConfig, Push, gemm, gemm_gathered  # noqa: E402

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
    shard, target = m // 2, 5
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
    gemm_gathered(A[own].clone(), b, c, Arrival(a_all, rank * shard, shard, chunks, flags, target), push,
                  config=SMALL, programs=5)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    assert _rel_err(c, A.float() @ b.float()) < 1e-2
    assert torch.equal(peer_all[own], A[own])
    assert torch.isnan(peer_all[peer]).all(), "a push wrote outside this rank's rows"
    expect = [target - 1] * (2 * chunks)
    expect[rank * chunks:(rank + 1) * chunks] = [target] * chunks
    assert peer_flags.tolist() == expect


@pytest.mark.gpu(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("m,k,n,chunks", [(8192, 1024, 2048, 4), (1024, 512, 384, 1), (96, 264, 200, 2)])
def test_two_ranks_wait_on_each_other(m, k, n, chunks):
    """Two ranks' fused kernels at once on one GPU, each on half the SMs: each pushes its shard into the other's
    a_all and computes the other's rows only once they have arrived. Three epochs over two a_all buffers with
    fresh inputs each: counters only grow, and a buffer is rewritten only after the kernel that read it ended.

    Everything is allocated and each kernel loaded (a solo run against preset counters) before two kernels run
    at once: a cudaMalloc or a lazy module load may wait for the device, i.e. for a kernel that spins on a push
    the other rank has not been launched to make."""
    world, shard = 2, m // 2
    half = torch.cuda.get_device_properties(DEVICE).multi_processor_count // world
    a_all = [[_nan(m, k) for _ in range(2)] for _ in range(world)]
    flags = [torch.zeros(world * chunks, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    push = {(r, buf): Push(torch.tensor([a_all[1 - r][buf][r * shard].data_ptr()], device=DEVICE),
                           torch.tensor([flags[1 - r].data_ptr()], device=DEVICE), shard=r, programs=2)
            for r in range(world) for buf in range(2)}
    streams = [torch.cuda.Stream() for _ in range(world)]

    def launch(r, A, b, c, buf, target):
        with torch.cuda.stream(streams[r]):
            gemm_gathered(A[r * shard:(r + 1) * shard], b, c, Arrival(a_all[r][buf], r * shard, shard, chunks,
                                                                      flags[r], target), push[r, buf], programs=half)

    A, b, c = _rand(m, k), _rand(k, n), _nan(m, n)
    for r in range(world):
        flags[r][(1 - r) * chunks:(2 - r) * chunks] = 1
        torch.cuda.synchronize()
        launch(r, A, b, c, 0, 1)
        torch.cuda.synchronize()
    for f in flags:
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
