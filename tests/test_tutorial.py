"""docs/tutorial.md as a reader runs it: its CPU steps, from its text, each ending with the exit code it states;
on a GPU machine, its GPU steps too (at world 1, as written)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "tutorial.py"


def test_tutorial_states_its_steps():
    sys.path.insert(0, str(SCRIPT.parent))
    from tutorial import TUTORIAL, steps

    found = steps(TUTORIAL.read_text())
    kinds = {s.kind for s in found}
    assert {"cpu", "gpu"} <= kinds, kinds
    cpu = [s.command.split()[:2] for s in found if s.kind == "cpu"]
    for command in (["cuco", "init"], ["cuco", "check"], ["cuco", "eval"], ["cuco", "transform"], ["cuco", "evolve"]):
        assert command in cpu, f"the tutorial's CPU steps lack {' '.join(command)}"


@pytest.mark.nvcc
def test_tutorial_cpu_steps_run_from_its_text():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.gpu(1)
@pytest.mark.nvcc
def test_tutorial_gpu_steps_run_from_its_text(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gpu", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
