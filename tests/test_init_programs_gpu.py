"""Users' own programs from tests/init_programs, end to end on a GPU: `cuco init` converts each, the user's half
(reference.py, below, as a user writes it) is added, and the judge verifies the seed on fresh inputs at both shapes
(an all-to-all loop, a config struct filled by an argument parser, cuBLASLt with its chosen algorithm and a bias
attached to the descriptor, a pipeline stage whose receive and send run under an `if`)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.scaffold import create_workload
from cuco.workload import load_workload

PROGRAMS = ROOT / "tests" / "init_programs"
HEAD = "import torch\n\n\n"
REFERENCES = {
    "ep_alltoall": HEAD + '''def make_inputs(p, world, rank, gen, device):
    return {"send": torch.randn(p["tokens"], p["hidden"], generator=gen, device=device).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    rows = p["tokens"] // world  # block q of rank q's send lands in block q of this rank's receive
    return {"recv": torch.cat([inp["send"][rank * rows:(rank + 1) * rows] for inp in inputs]).float() * 0.5}
''',
    "config_parser": HEAD + '''def make_inputs(p, world, rank, gen, device):
    shape = (p["batch"], p["seq"], p["hidden"])
    return {"emb": torch.randn(shape, generator=gen, device=device),
            "gain": torch.randn(p["hidden"], generator=gen, device=device)}


def reference(p, world, rank, inputs):
    return {"out": sum(inp["emb"].double() * inp["gain"].double() for inp in inputs)}
''',
    "lt_heuristic_bias": HEAD + '''def make_inputs(p, world, rank, gen, device):
    k = p["in_features"] // world
    return {"x": torch.randn(p["tokens"], k, generator=gen, device=device).to(torch.bfloat16),
            "w": (torch.randn(k, p["out_features"], generator=gen, device=device) / k ** 0.5).to(torch.bfloat16),
            "bias": (0.1 * torch.randn(p["out_features"], generator=gen, device=device)).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    return {"y": sum(i["x"].float() @ i["w"].float() + i["bias"].float() for i in inputs)}
''',
    "pipeline_stage": HEAD + '''def make_inputs(p, world, rank, gen, device):
    return {"act_in": torch.randn(p["M"], p["H"], generator=gen, device=device).to(torch.bfloat16),
            "weight": (torch.randn(p["H"], p["H"], generator=gen, device=device) / p["H"] ** 0.5).to(torch.bfloat16)}


def reference(p, world, rank, inputs):
    act = inputs[0]["act_in"].float()  # stage r receives what stage r - 1 computed in the same step
    for r in range(rank):
        act = (act @ inputs[r]["weight"].float()).to(torch.bfloat16).float()
    return {"act_in": act, "act_out": act @ inputs[rank]["weight"].float()}
''',
}


@pytest.mark.gpu(1)
@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_converted_program_with_its_reference_passes_the_judge(name, tmp_path):
    root = create_workload(name, PROGRAMS / f"{name}.cu", tmp_path).root
    (root / "reference.py").write_text(REFERENCES[name])
    spec = load_workload(root, 1)
    rec = evaluate(spec, root / "seed.cu", EvalOptions(device="cuda", max_level="L3", gpus=[0],
                                                       work_dir=tmp_path / "w"))
    assert rec.ok, rec.error
