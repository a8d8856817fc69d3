"""One configuration: run.toml and --set typed by the same annotations, eval settings shared by every command,
and every environment variable cuco reads documented in one place."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from cuco.environment import VARIABLES
from cuco.errors import CucoError
from cuco.evolve.config import RunConfig, apply_overrides, load_config


def test_set_values_are_coerced_from_the_annotations():
    cfg = apply_overrides(RunConfig(), ["llm.models=a, b", "llm.send_temperature=no", "eval.iters=5",
                                        "search.power_law_alpha=2", "llm.pricing={m = [1, 2.5]}"])
    assert cfg.llm.models == ["a", "b"] and cfg.llm.send_temperature is False
    assert cfg.eval.iters == 5 and cfg.search.power_law_alpha == 2.0 and cfg.llm.pricing == {"m": [1.0, 2.5]}
    assert apply_overrides(cfg, ["eval.iters=none"]).eval.iters is None  # back to the workload's


@pytest.mark.parametrize("item,message", [
    ("llm.send_temperature=maybe", "llm.send_temperature: expected bool, got str 'maybe'"),
    ("search.islands=x", "search.islands: expected int, got str 'x'"),
    ("llm.models=[1]", "llm.models: expected str, got int 1"),
    ("eval.device=gpu", "eval.device: expected auto, cuda or cpu"),
    ("search.backend=slurm", "search.backend: expected local or ray, got 'slurm'"),
    ("ray.retries=-1", "ray.retries: must be >= 0, got -1"),
    ("search.nope=1", "unknown key 'search.nope'"),
    ("config.x=1", "unknown key 'config.x'"),
    ("islands", "expected SECTION.KEY=VALUE"),
])
def test_bad_set_values_are_one_line_errors(item, message):
    with pytest.raises(CucoError, match=re.escape(message)):
        apply_overrides(RunConfig(), [item])


def test_run_toml_is_checked_against_the_same_annotations(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[llm]\nmodels = ["a", 3]\n')
    with pytest.raises(CucoError, match=r"run.toml: llm.models: expected str, got int 3"):
        load_config(path)
    path.write_text("[eval]\nwarmup = 1\n")
    assert load_config(path).eval.warmup == 1 and load_config(path).eval.iters is None


def test_eval_settings_default_to_the_workload_for_every_command(monkeypatch):
    """evolve and eval build their options from one EvalConfig: unset fields are the workload's [timing]."""
    import cuco.runner.cascade as cascade
    from cuco.cli import _eval_config
    from cuco.evolve.slots import local_evaluator

    ecfg = _eval_config(None)
    assert (ecfg.warmup, ecfg.iters, ecfg.timeout_s) == (None, None, None)
    seen = {}

    def capture(spec, src, opts, baselines=None):
        seen.update(warmup=opts.warmup, iters=opts.iters, timeout_s=opts.timeout_s)
        return {}

    monkeypatch.setattr(cascade, "evaluate", capture)
    local_evaluator("cpu", RunConfig().eval, "tiny")(None, ROOT, type("Slot", (), {"gpus": ()})(), ROOT)
    assert seen == {"warmup": None, "iters": None, "timeout_s": None}


def test_every_environment_variable_read_is_documented():
    """Variables cuco reads (a subscript that is not assigned to, or .get); those it only sets for a candidate's
    process (TMPDIR, PYTHONDONTWRITEBYTECODE) are not its configuration."""
    read = set()
    for path in (ROOT / "cuco").rglob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"""environ\.get\(["']([A-Z_]+)["']""", text))
        read |= set(re.findall(r"""environ\[["']([A-Z_]+)["']\](?!\s*=[^=])""", text))
        read |= set(re.findall(r"""_key\(cfg, ["']([A-Z_]+)["']""", text))
    names = {v.name for v in VARIABLES}
    documented = (ROOT / "docs" / "configuration.md").read_text()
    assert read <= names, read - names
    assert all(f"`{n}`" in documented for n in names), [n for n in names if f"`{n}`" not in documented]


def test_every_run_toml_key_is_documented():
    from dataclasses import fields

    from cuco.evolve.config import EvalConfig, RayConfig, SearchConfig
    from cuco.llm.config import LLMConfig

    documented = (ROOT / "docs" / "configuration.md").read_text()
    for section, cls in (("search", SearchConfig), ("eval", EvalConfig), ("llm", LLMConfig), ("ray", RayConfig)):
        part = documented.split(f"### [{section}]")[1].split("###")[0]
        assert all(f"| `{f.name}` |" in part for f in fields(cls)), section


def test_doctor_shows_the_variables_set_and_never_a_key(monkeypatch):
    from cuco.doctor import rows

    monkeypatch.setenv("CUCO_CUDA_ARCH", "90")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    line = dict(rows({}))["environment"]
    assert "CUCO_CUDA_ARCH=90" in line and "ANTHROPIC_API_KEY=(set)" in line and "sk-secret" not in line
