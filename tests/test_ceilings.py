"""The machine's ceilings: datasheet figures by GPU name, the streaming kernels (Triton's interpreter on the CPU),
the refusal of ceilings measured on a busy GPU, and on a GPU the ceilings themselves against the datasheet."""

from __future__ import annotations

import os

import pytest
from conftest import gpu_count

if gpu_count() == 0:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at the import below
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from cuco.ceilings import Busy, Ceiling, datasheet, measure, to_facts  # noqa: E402
from cuco.ceilings.stream import read_all, write_all  # noqa: E402
from cuco.doctor import rows  # noqa: E402


def test_datasheet_by_name():
    assert datasheet("NVIDIA H100 80GB HBM3")["hbm_gbps"] == 3350.0
    assert datasheet("NVIDIA H200")["hbm_gbps"] == 4800.0
    assert datasheet("NVIDIA H100 PCIe")["tensor_bf16_tflops"] == 756.0
    assert datasheet("NVIDIA A10") == {}


def test_stream_kernels_read_and_write_every_element():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.rand(3 * 4096 + 5, device=dev)  # a ragged tail, and more blocks than programs on the CPU
    partial = torch.zeros(4096, device=dev)
    assert torch.allclose(read_all(src, partial).sum(), src.sum(), rtol=1e-4)
    dst = torch.zeros_like(src)
    assert bool((write_all(dst, 2.5) == 2.5).all())


def _rates(sheet):
    return {"hbm_read_gbps": Ceiling(3000.0, "GB/s", "test", sheet.get("hbm_gbps"))}


def test_ceilings_keep_their_share_of_the_datasheet():
    probe = iter([700.0, 690.0]).__next__
    got = measure("NVIDIA H100 80GB HBM3", probe=probe, others=lambda: [], rates=_rates)
    facts = to_facts(got)
    assert facts["hbm_read_gbps"]["share"] == pytest.approx(3000 / 3350)
    line = dict(rows({"ceilings": facts}))["HBM read"]
    assert line.startswith("3000 GB/s, 90% of the datasheet's 3350: test")


@pytest.mark.parametrize("others, probe, words", [
    ([["123, python"], []], [700.0, 700.0], "other processes hold the GPU (123, python)"),
    ([[], ["456, train.py"]], [700.0, 700.0], "started on the GPU while measuring (456, train.py)"),
    ([[], []], [700.0, 600.0], "ran at 700 before measuring and 600 after"),
])
def test_busy_gpu_gives_no_ceilings(others, probe, words):
    with pytest.raises(Busy, match=words.replace("(", r"\(").replace(")", r"\)")):
        measure("NVIDIA H200", probe=iter(probe).__next__, others=iter(others).__next__, rates=_rates)


@pytest.mark.gpu(1)
def test_ceilings_on_this_gpu_are_near_the_datasheet():
    name = torch.cuda.get_device_name(0)
    got = measure(name)
    for key in ("tensor_bf16_tflops", "hbm_read_gbps", "hbm_write_gbps", "hbm_copy_gbps"):
        c = got[key]
        assert c.value > 0 and c.method, key
        if c.datasheet:  # measured below the datasheet, but not far: the microbenchmarks are the best cuco has
            assert 0.6 < c.share <= 1.02, (key, c)
    sustained = got["tensor_bf16_sustained_tflops"]  # under the power cap: below the burst rate, not far below
    assert 0.5 * got["tensor_bf16_tflops"].value < sustained.value <= 1.02 * got["tensor_bf16_tflops"].value
