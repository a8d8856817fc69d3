"""cuco.kernels.decode: the split-K decode GEMM. Without a GPU it runs in Triton's interpreter (fp16: the interpreter
mistranslates bf16), which checks the slices of K, the masks and the last program's fixed-order sum; on a GPU the
same tests run compiled in bf16, and the shipped decode shapes are checked against cuBLAS."""

from __future__ import annotations

import os

import pytest
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at the import below
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from cuco.kernels.decode import (  # noqa: E402
    MAX_ROWS,
    DecodeConfig,
    decode_config_for,
    decode_workspace,
    gemm_decode,
)
from cuco.kernels.gemm import gemm  # noqa: E402

DEVICE = torch.device("cuda" if gpu_count() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16


def _operands(m: int, k: int, n: int):
    a = torch.randn(m, k, device=DEVICE).to(DTYPE)
    b = torch.randn(k, n, device=DEVICE).to(DTYPE)
    return a, b, torch.full((m, n), float("nan"), device=DEVICE, dtype=DTYPE)


def _rel_err(c: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(c).any(), "an element of the output was never written"
    return ((c.float() - ref).norm() / ref.norm()).item()


# K not a multiple of the block, N not a multiple of the tile, more splits than K has blocks (empty slices), one row.
@pytest.mark.parametrize("m,k,n,split", [(1, 72, 40, 2), (8, 300, 100, 4), (3, 40, 24, 1), (32, 64, 48, 3),
                                         (5, 16, 16, 8)])
def test_right_and_the_same_bits_every_run(m, k, n, split):
    cfg = DecodeConfig(32, 32, split, 2, 4)
    a, b, c = _operands(m, k, n)
    ws = decode_workspace(m, n, k, DEVICE, cfg)
    gemm_decode(a, b, c, config=cfg, workspace=ws)
    assert _rel_err(c, a.float() @ b.float()) < 1e-2
    assert int(ws.counters.abs().sum()) == 0, "a launch must leave its tile counters at zero for the next"
    first = c.clone()
    gemm_decode(a, b, c.fill_(float("nan")), config=cfg, workspace=ws)
    assert torch.equal(c, first)


def test_the_stream_workspace_is_shared_by_launches_one_after_another():
    cfg = DecodeConfig(32, 32, 2, 2, 4)
    a, b, c = _operands(4, 96, 64)
    a2, b2, c2 = _operands(6, 160, 96)  # a larger shape grows the workspace
    gemm_decode(a, b, c, config=cfg)
    gemm_decode(a2, b2, c2, config=cfg)
    assert _rel_err(c, a.float() @ b.float()) < 1e-2 and _rel_err(c2, a2.float() @ b2.float()) < 1e-2


def test_refusals_name_what_is_wrong():
    a, b, c = _operands(MAX_ROWS + 1, 32, 32)
    with pytest.raises(ValueError, match="at most"):
        gemm_decode(a, b, c)
    a, b, c = _operands(4, 64, 64)
    small = decode_workspace(1, 16, 64, DEVICE, DecodeConfig(16, 32, 2, 2, 4))
    with pytest.raises(ValueError, match="workspace is too small"):
        gemm_decode(a, b, c, config=DecodeConfig(16, 32, 4, 2, 4), workspace=small)
    with pytest.raises(ValueError, match="dense row-major"):
        gemm_decode(a, b.t(), c)
    with pytest.raises(ValueError, match="a cluster of 2 CTAs needs split_k 1"):
        gemm_decode(a, b, c, config=DecodeConfig(16, 32, 2, 2, 4, num_ctas=2))


def test_the_plain_gemm_takes_the_decode_path_for_few_rows():
    a, b, c = _operands(2, 64, 48)
    gemm(a, b, c)
    assert _rel_err(c, a.float() @ b.float()) < 1e-2


def test_the_default_keeps_one_program_per_sm():
    """Among the sweep's fastest (benchmarks/results/decode_gemm.md): 128 programs on 132 SMs at N = 8192 and 4096."""
    for m in (1, 8, 32, 128):
        for n, k, split in ((8192, 8192, 1), (8192, 4096, 1), (4096, 8192, 2)):
            cfg = decode_config_for(m, n, k, 132)
            assert (cfg.block_n, cfg.split_k) == (64, split)
    assert decode_config_for(8, 200, 272, 132).split_k == 1  # a short K is not cut into slices of a block or two


@pytest.mark.gpu(1)
@pytest.mark.parametrize("m", [1, 8, 32, 100, 128])
@pytest.mark.parametrize("k,n", [(8192, 8192), (4096, 8192), (8192, 4096)])
def test_decode_shapes_match_cublas(m, k, n):
    a, b, c = _operands(m, k, n)
    gemm_decode(a, b, c)
    ref = torch.matmul(a, b)
    assert _rel_err(c, ref.float()) < 1e-2
    first = c.clone()
    gemm_decode(a, b, c.fill_(float("nan")))
    assert torch.equal(c, first)
