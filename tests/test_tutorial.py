"""docs/tutorial.md as a reader runs it: its CPU steps, from its text, each ending with the exit code it states;
on a GPU machine, its GPU steps too (at world 1, as written)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "tutorial.py"
TUTORIAL = ROOT / "docs" / "tutorial.md"


def test_tutorial_states_its_steps():
    sys.path.insert(0, str(SCRIPT.parent))
    from tutorial import TUTORIAL, steps

    found = steps(TUTORIAL.read_text())
    kinds = {s.kind for s in found}
    assert {"cpu", "gpu"} <= kinds, kinds
    cpu = [s.command.split()[:2] for s in found if s.kind == "cpu"]
    # the second example: a host file, its kernels and a header, read as one program
    assert any(s.command.startswith("cuco init") and s.command.count("--from") == 3 for s in found if s.kind == "cpu")
    assert "gpu x2" in kinds
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


def _cuco(args: list[str], cwd, home) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "CUCO_HOME": str(home), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "cuco", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_tool_says_what_the_tutorial_says(tmp_path):
    """Steps 1 to 3 and --explain as the tutorial runs them: init names the next steps the tutorial takes (cuco check
    among them), and the reasons --explain gives are the lines the tutorial quotes."""
    import re
    import shutil

    shutil.copytree(ROOT / "examples" / "tutorial", tmp_path / "examples" / "tutorial")
    made = _cuco(["init", "scaled_sum", "--from", "examples/tutorial/scaled_sum.cu", "--dir", "ws"], tmp_path,
                 tmp_path / "home")
    assert made.returncode == 0, made.stderr
    root = tmp_path / "ws" / "scaled_sum"
    assert f"cuco check {root}; then on the GPUs: cuco eval {root} seed" in " ".join(made.stdout.split()), made.stdout
    for name in ("workload.toml", "reference.py"):
        shutil.copy(tmp_path / "examples" / "tutorial" / name, root / name)
    explain = _cuco(["transform", "ws/scaled_sum", "--explain"], tmp_path, tmp_path / "home")
    assert explain.returncode == 0, explain.stderr
    quoted = re.search(r"cuco transform ws/scaled_sum --explain\n```\n\n```text\n(.*?)```", TUTORIAL.read_text(),
                       re.S)
    assert quoted, "the tutorial quotes --explain's lines in a text block after the command"
    said = [line.rstrip() for line in explain.stdout.splitlines()]
    for line in quoted.group(1).splitlines():
        assert line in said, f"the tutorial quotes {line!r}; cuco transform --explain says:\n{explain.stdout}"


def test_the_tutorials_configurations_exist_and_load():
    """Every --config a tutorial command names is a file it ships (the LLM step's run.toml), and it loads."""
    from cuco.evolve.config import load_config

    sys.path.insert(0, str(SCRIPT.parent))
    from tutorial import steps

    configs = [c.split("--config ", 1)[1].split()[0] for c in (s.command for s in steps(TUTORIAL.read_text()))
               if "--config " in c]
    assert configs, "the tutorial's LLM step names its configuration"
    for path in configs:
        assert (ROOT / path).is_file(), f"{path}: the tutorial never creates it"
        assert load_config(ROOT / path).search.proposer == "llm"


def test_transform_suggests_the_world_size_it_was_given(tmp_path, monkeypatch):
    """Unverified on a machine without GPUs, `cuco transform --world 1` suggests the eval and the search at world 1."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import cuco.fastpath.pipeline
    from cuco.cli import app

    made = SimpleNamespace(rewrites=[], rules_stopped=None, llm_stages=[], evolve_blocks=1, record=None)
    monkeypatch.setattr(cuco.fastpath.pipeline, "transform", lambda *args, **kwargs: made)  # no nvcc build here
    target, workload = tmp_path / "t.cu", str(tmp_path / "scaled_sum")
    (tmp_path / "scaled_sum").mkdir()
    for name, to in (("workload.toml",) * 2, ("reference.py",) * 2, ("scaled_sum.cu", "seed.cu")):
        (tmp_path / "scaled_sum" / to).write_text((ROOT / "examples" / "tutorial" / name).read_text())
    result = CliRunner().invoke(app, ["transform", workload, "--world", "1", "--device", "cpu", "--out", str(target)])
    assert result.exit_code == 4, result.output
    text = " ".join(result.output.split())
    assert f"cuco eval {workload} {target} --world 1)" in text, text
    assert f"cuco evolve {workload} --world 1 --set search.start={target}" in text, text


def test_the_readme_starts_from_a_clone_and_says_which_torch():
    readme = (ROOT / "README.md").read_text()
    assert readme.split("```bash", 1)[0].strip() == "# cuco", "the README starts with its two commands"
    after = readme.split("```bash", 1)[1].split("```", 2)[1].split("\n\n", 2)[1]  # the paragraph right after them
    assert "git clone" in after and "`cd`" in after, "the commands run in a clone: say so beside them"
    assert "`torch==2.13.0` is the CPU build" in after and "unpinned" in after and "CUDA build" in after
