"""What candidates, workloads and proposers wrote reaches the terminal as text: brackets that rich would take for
markup (a closing tag that matches nothing stops it with a MarkupError) and :names: it would take for emoji codes are
printed as they are, on every table and line that shows them."""

from __future__ import annotations

import json
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from cuco.evolve.database import Database
from cuco.report.console import analysis_table, baseline_table, print_record
from cuco.report.live import EvolveDisplay, summary_table
from cuco.runner.results.record import EvalRecord

HOSTILE = "[/bold] [red]x[/red] [/"


def _record(**kw) -> EvalRecord:
    return EvalRecord.from_dict({"workload": "gemm_allgather", "candidate": "c.py", "candidate_name": "c",
                                 "language": "python", "world": 2, "device": "cpu", **kw})


def _text(*renderables) -> str:
    console = Console(record=True, width=300, emoji=True)
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_an_error_with_markup_is_printed_as_it_is():
    console = Console(record=True, width=300)
    print_record(_record(ok=False, failed_level="L2", error=HOSTILE, note=f"note {HOSTILE}",
                         candidate_name=f"c{HOSTILE}"), console)
    out = console.export_text()
    assert f"L2: {HOSTILE}" in out and f"note: note {HOSTILE}" in out and f"c{HOSTILE}" in out, out


def test_names_and_timings_of_a_record_are_printed_as_they_are():
    timing = {"median_ms": 1.0, "per_rank_median_ms": [1.0, 1.0], "note": f"a note {HOSTILE}"}
    rec = _record(ok=True, level_reached="L4", incomplete=f"only {HOSTILE}",
                  shapes={f"s{HOSTILE}": {"params": {"M": 8}, "timing": timing, "speedup": {f"b{HOSTILE}": 1.5}}})
    console = Console(record=True, width=400)
    print_record(rec, console)
    out = console.export_text()
    assert f"only {HOSTILE}" in out and f"s{HOSTILE}" in out and f"b{HOSTILE} 1.50x" in out, out
    assert f"note: a note {HOSTILE}" in out, out
    out = _text(baseline_table(f"w{HOSTILE}", {f"b{HOSTILE}": rec}))
    assert f"w{HOSTILE}: baselines" in out and f"b{HOSTILE}" in out, out


def test_an_analysed_program_is_printed_as_it_is():
    op = SimpleNamespace(index=0, line=3, function=f"f{HOSTILE}", loops=[], kind="nccl", name="ncclSend",
                         reads=[f"buf{HOSTILE}"], writes=[":fire:"], stream=None, args={"count": HOSTILE})
    analysis = SimpleNamespace(path=f"/p/{HOSTILE}.cu", nccl=[op], edges=[], carried=[], ops=[op])
    out = _text(analysis_table(analysis))
    assert f"/p/{HOSTILE}.cu" in out and f"f{HOSTILE}" in out and f"buf{HOSTILE}" in out, out
    assert f"count={HOSTILE}" in out and ":fire:" in out, out


def test_the_search_tables_print_labels_as_they_are(tmp_path):
    db = Database(tmp_path / "cuco.db")
    cid = db.add(code="x", code_hash="h", language="python", parent_id=None, island=0, generation=0,
                 proposer="seed", phase="seed", directive=None, label=f"point {HOSTILE}")
    db.finish(cid, _record(ok=True, level_reached="L4"), 0.5, 1.0, 0.5, 1.0)
    db.set_meta("baselines", {f"b{HOSTILE}": {"median_ms": 0.8}})
    evo = SimpleNamespace(db=db, spec=SimpleNamespace(name=f"w{HOSTILE}"), shape="s")
    display = EvolveDisplay(Console(record=True, width=300), 1)
    out = _text(display.render(evo), summary_table(evo))
    assert out.count(f"point {HOSTILE}") == 3 and f"w{HOSTILE} at s" in out and f"b{HOSTILE}, 0.8000 ms" in out, out
    db.close()


def test_cuco_eval_prints_an_error_with_markup_as_it_is(tmp_path, monkeypatch):
    """The command itself, its evaluation replaced by a record whose error is a candidate's own words."""
    from cuco import cli
    from cuco.runner import cascade

    monkeypatch.setattr(cascade, "evaluate", lambda *a, **kw: _record(ok=False, failed_level="L2", error=HOSTILE))
    out = tmp_path / f"{HOSTILE.replace('/', '_')}.json"
    result = CliRunner().invoke(cli.app, ["eval", "gemm_allgather", "torch_host", "--device", "cpu", "--out",
                                          str(out)])
    assert result.exit_code == 1, (result.output, result.exception)
    assert f"L2: {HOSTILE}" in result.output and str(out) in result.output.replace("\n", ""), result.output
    assert json.loads(out.read_text())["error"] == HOSTILE
