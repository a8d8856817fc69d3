"""Prompts are data: every template renders, a missing value is an error, and the example prompts under
docs/prompts/ are what a GEMM+AllGather run would send first. Regenerate: python tests/test_prompts.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuco.evolve.prompting import KINDS, example_prompts
from cuco.program.prompts import TEMPLATES, render
from cuco.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "prompts"
# The machine facts `cuco doctor` measured on a 2x H200 (NVLink NV18), as the GEMM+AllGather results record them.
MACHINE = {"gpus": [{"name": "NVIDIA H200", "sm_count": 132}] * 2, "links": "GPU0-GPU1: NV18",
           "peer_bw_gbps": 367.8407411318933, "gemm_bf16_tflops": 806.2051567545376}


def generate() -> dict[str, str]:
    spec = load_workload(ROOT / "cuco" / "builtin" / "gemm_allgather")
    return example_prompts(spec, "8k", MACHINE)


@pytest.mark.parametrize("name", TEMPLATES)
def test_missing_placeholder_is_an_error(name):
    with pytest.raises(ValueError, match=f"{name}.txt: no value for placeholder"):
        render(name)


def test_example_prompts_are_current():
    for kind, text in generate().items():
        assert "$" not in text.split("# User")[0].replace("$0", "")  # no unfilled placeholder in the system part
        assert (DOCS / f"gemm_allgather-{kind}.md").read_text() == text, "run python tests/test_prompts.py"
    assert set(KINDS) == {"diff", "rewrite", "crossover"}


if __name__ == "__main__":
    DOCS.mkdir(parents=True, exist_ok=True)
    for kind, text in generate().items():
        (DOCS / f"gemm_allgather-{kind}.md").write_text(text)
    print(f"wrote {len(KINDS)} prompts to {DOCS}")
