"""A buffer the program updates in place (role "inout"), run for real on two CPU ranks and on a GPU: the judge
delivers it fresh for every run as it does an input, and verifies what the run leaves in it as it does an output.
A candidate that leaves it as it was, or writes what an earlier run computed, fails; one that updates it passes,
though an input changed by the run would fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload
from cuco.workload.check import check_workload

WORKLOAD = """\
name = "inplace_sum"
description = "g scaled by the input w, then all-reduced in place"
world_size = 2
params = ["N"]
baselines = ["seed"]

[[shapes]]
name = "s256"
N = 256

[[small_shapes]]
name = "odd"
N = 37

[buffers.g]
role = "inout"
dtype = "f32"
shape = ["N"]

[buffers.w]
role = "input"
dtype = "f32"
shape = ["N"]

[tolerance]
rtol = 1e-5
atol = 1e-5
norm_rtol = 1e-6
determinism = "tolerance"

[timing]
warmup = 1
iters = 4
trials = 2
timeout_s = 60.0

[bounds]
hbm_bytes = "3 * N * 4"
comm_bytes = "2 * (world - 1) * N * 4 // world"

[candidates]
seed = "seed.py"
"""

REFERENCE = '''\
import torch


def make_inputs(p, world, rank, gen, device):
    n = p["N"]
    return {"g": torch.randn(n, generator=gen, device=device), "w": torch.rand(n, generator=gen, device=device)}


def reference(p, world, rank, inputs):
    return {"g": sum(inp["g"].double() * inp["w"].double() for inp in inputs)}


def comm_alone(view):
    import torch.distributed as dist

    g = view.bufs["g"].clone()
    return lambda: dist.all_reduce(g, group=view.group)
'''

SEED = '''\
import torch.distributed as dist


def run(ctx):
    g = ctx.buffers["g"]
    g.mul_(ctx.buffers["w"])
    dist.all_reduce(g, group=ctx.group)
'''

CHEATS = {
    # leaves the buffer as delivered: what an input would have to do
    "untouched": ("def run(ctx):\n    pass\n", "L2", "out of tolerance"),
    # updates it, and the input beside it too: an input must come out as it went in
    "changes_its_input": (SEED + "    ctx.buffers['w'].zero_()\n", "L2", "input changed by the run"),
    # the first run's result, written again into every later one
    "replays_its_first_result": ('''\
import torch.distributed as dist

kept = []


def run(ctx):
    g = ctx.buffers["g"]
    if kept:
        g.copy_(kept[0])
        return
    g.mul_(ctx.buffers["w"])
    dist.all_reduce(g, group=ctx.group)
    kept.append(g.clone())
''', "L2", "out of tolerance"),
}


def _workload(tmp_path: Path) -> Path:
    root = tmp_path / "inplace_sum"
    root.mkdir()
    (root / "workload.toml").write_text(WORKLOAD)
    (root / "reference.py").write_text(REFERENCE)
    (root / "seed.py").write_text(SEED)
    return root


def _opts(tmp_path: Path, device: str = "cpu") -> EvalOptions:
    return EvalOptions(device=device, shapes=["s256"], small_shapes=["odd"], work_dir=tmp_path / "w", timeout_s=60)


def test_a_buffer_updated_in_place_is_delivered_and_verified(tmp_path):
    root = _workload(tmp_path)
    assert check_workload(root) == []  # make_inputs gives g, reference returns it
    spec = load_workload(root)
    rec = evaluate(spec, root / "seed.py", _opts(tmp_path))
    assert rec.ok and rec.level_reached == "L4", rec.error


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_buffer_updated_in_place_cannot_be_skipped(tmp_path, name):
    source, level, words = CHEATS[name]
    root = _workload(tmp_path)
    (root / f"{name}.py").write_text(source)
    rec = evaluate(load_workload(root), root / f"{name}.py", _opts(tmp_path))
    assert not rec.ok and rec.failed_level == level and words in rec.error, rec.error


@pytest.mark.gpu
def test_a_buffer_updated_in_place_on_the_gpu(tmp_path):
    """The GPU path: the buffer unsealed with the inputs inside the timed region, snapshotted with the outputs."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    root = _workload(tmp_path)
    text = (root / "workload.toml").read_text().replace("world_size = 2", "world_size = 1")
    (root / "workload.toml").write_text(text)
    spec = load_workload(root)
    rec = evaluate(spec, root / "seed.py", _opts(tmp_path, "cuda"))
    assert rec.ok and rec.level_reached == "L4", rec.error
    (root / "untouched.py").write_text(CHEATS["untouched"][0])
    rec = evaluate(spec, root / "untouched.py", _opts(tmp_path, "cuda"))
    assert not rec.ok and rec.failed_level == "L2" and "out of tolerance" in rec.error, rec.error
