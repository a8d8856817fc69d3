"""Prompts are data: every template renders, a missing value is an error, and the example prompts under
docs/prompts/ are what a GEMM+AllGather run would send first. Regenerate: python tests/test_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco.evolve.prompting import KINDS, TEMPLATES, example_prompts, render
from cuco.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "prompts"
# The machine facts that `cuco doctor` recorded on the 2x H200 (benchmarks/results).
RESULTS = ROOT / "benchmarks" / "results" / "gemm_allgather-w2-NVIDIA_H200-20261122.json"


def recorded_machine() -> dict:
    meta = json.loads(RESULTS.read_text())["meta"]
    return {"gpus": [{"name": "NVIDIA H200", "sm_count": 132}] * 2, "links": meta["links"],
            "peer_bw_gbps": meta["peer_bw_gbps"], "gemm_bf16_tflops": meta["gemm_bf16_tflops"]}


def generate() -> dict[str, str]:
    spec = load_workload(ROOT / "cuco" / "workloads" / "gemm_allgather")
    return example_prompts(spec, "8k", recorded_machine())


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
