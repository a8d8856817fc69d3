"""docs/cli.md is the whole interface on one page, generated from --help; it must not drift.

Regenerate with: python tests/test_cli_docs.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"


def _commands() -> list[list[str]]:
    """cuco itself, then every command it registers: a new one cannot be left out of the page."""
    from cuco.cli import app

    return [[]] + [[info.name or info.callback.__name__.replace("_", "-")] for info in app.registered_commands]


COMMANDS = _commands()


def render() -> str:
    """In this process, as typer's test runner invokes the app: a process per command cost seconds each."""
    from typer.testing import CliRunner

    from cuco.cli import app

    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    parts = ["# cuco command line", "",
             "Generated from `--help` by `python tests/test_cli_docs.py`; checked by the tests.", ""]
    for cmd in COMMANDS:
        out = CliRunner().invoke(app, [*cmd, "--help"], env=env, prog_name="cuco").output
        out = "\n".join(line.rstrip() for line in out.splitlines()).strip("\n")
        parts += [f"## cuco {' '.join(cmd)}".rstrip(), "", "```", out, "```", ""]
    from cuco.errors import MEANING

    parts += ["## Exit codes", "", "The same for every command (`cuco.errors.ExitCode`).", "",
              "| code | | meaning |", "|---|---|---|"]
    parts += [f"| {int(code)} | {short} | {text} |" for code, (short, text) in MEANING.items()]
    return "\n".join(parts) + "\n"


def _surface(text: str) -> set[str]:
    """Options and commands: what must match (the box drawing varies between typer releases)."""
    import re

    return set(re.findall(r"--[a-z][a-z-]*", text)) | set(re.findall(r"^## cuco.*$", text, flags=re.M))


def test_cli_doc_is_current():
    doc, now = DOC.read_text(), render()
    assert _surface(doc) == _surface(now), "docs/cli.md is stale: run python tests/test_cli_docs.py"
    codes = doc.split("## Exit codes", 1)[-1]
    assert codes.strip() == now.split("## Exit codes", 1)[-1].strip(), "docs/cli.md's exit codes are stale"


def test_help_reads_cleanly():
    """A flag takes no value, so it shows no <bool>; a command's summary is one sentence in the command list, not
    broken where its docstring's source line ends."""
    from typer.testing import CliRunner

    from cuco.cli import app

    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    text = "".join(CliRunner().invoke(app, [*cmd, "--help"], env=env, prog_name="cuco").output for cmd in COMMANDS)
    assert "Usage: cuco evolve" in text and "--dry-run-prompt" in text
    assert "<bool>" not in text and "<list[" not in text
    for info in app.registered_commands:
        assert info.help and "\n" not in info.help, info.callback.__name__
    assert "bound, efficiency, speedups." in text  # eval's summary, once broken after "efficiency,"


if __name__ == "__main__":
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC}")
