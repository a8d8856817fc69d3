"""cuco report: one HTML page per search, built from the store, with every value escaped."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from html.parser import HTMLParser

from conftest import GEMM_AG, ROOT
from test_evolve_run import fake_evaluator

from cuco.evolve.config import RunConfig
from cuco.evolve.run import Evolution
from cuco.evolve.slots import Slot
from cuco.report.html import render_report
from cuco.workload import load_workload


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _run(tmp_path, generations=12):
    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape = generations, "8k"

    calls = itertools.count()

    def evaluator(spec, src, slot, work, name=None):
        rec = fake_evaluator(spec, src, slot, work)
        if next(calls) % 4 == 1:  # a failure every fourth evaluation, whatever the code's hash
            rec.ok, rec.level_reached, rec.failed_level = False, "L2", "L2"
        if not rec.ok:
            rec.error = "<script>alert(1)</script> planted failure"
        rec.shapes["8k"].bound.speed_of_light_ms = 0.25
        return rec

    evo = Evolution(load_workload(GEMM_AG), cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    cands = evo.db.all()
    evo.db.close()
    return cands


def test_report_shows_every_evaluation(tmp_path):
    cands = _run(tmp_path)
    page = render_report(tmp_path)
    p = Tags()
    p.feed(page)
    circles = [a for t, a in p.tags if t == "circle"]
    assert len(circles) == len(cands) == 12
    failed = [c for c in cands if not c.ok]
    assert len([a for a in circles if a.get("class") == "failed"]) == len(failed)
    rows = [a["id"] for t, a in p.tags if t == "tr" and a.get("id", "").startswith("c")]
    assert rows == [f"c{c.id}" for c in cands]
    assert page.count("<li>") == len(cands)  # the lineage holds every candidate once
    assert "<script>" not in page and "&lt;script&gt;" in page
    best = max((c for c in cands if c.ok), key=lambda c: c.score)
    assert f"Best program (#{best.id})" in page and any(t == "polyline" for t, _ in p.tags)
    assert f"speed of light 0.2500 ms ({0.25 / best.median_ms:.2f} of it)" in page


def test_cli_report(tmp_path):
    _run(tmp_path, generations=3)
    env = {**os.environ, "CUCO_HOME": str(tmp_path / "h")}
    proc = subprocess.run([sys.executable, "-m", "cuco", "report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0 and (tmp_path / "report.html").is_file()
    proc = subprocess.run([sys.executable, "-m", "cuco", "report", str(tmp_path / "nothing")], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr


def test_live_ui_serves_the_report_and_each_candidate(tmp_path):
    import threading
    import urllib.error
    import urllib.request

    from cuco.report.ui import make_server

    cands = _run(tmp_path, generations=4)
    server = make_server(tmp_path, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "http-equiv='refresh'" in page and "href='/candidate/1'" in page
        one = urllib.request.urlopen(base + f"/candidate/{cands[1].id}", timeout=10).read().decode()
        assert f"#{cands[1].id}" in one and "Program" in one
        try:
            urllib.request.urlopen(base + "/candidate/999", timeout=10)
            raise AssertionError("expected 404")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    finally:
        server.shutdown()
        server.server_close()


def _only_read_only_opens(monkeypatch) -> list[str]:
    """sqlite3 as a store in a folder cuco may not write and closed cleanly (no -shm beside it) behaves: a writable
    open fails at its first write (journal_mode), and mode=ro alone cannot make the -shm file. What opened is listed."""
    import sqlite3

    real, opened = sqlite3.connect, []

    def connect(database, *args, uri=False, **kwargs):
        opened.append(str(database))
        if not (uri and "mode=ro" in str(database)):
            raise sqlite3.OperationalError("attempt to write a readonly database")
        if "immutable=1" not in str(database):
            raise sqlite3.OperationalError("unable to open database file")
        return real(database, *args, uri=uri, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    return opened


def test_report_and_ui_only_read_the_store(tmp_path, monkeypatch):
    import threading
    import urllib.request

    from typer.testing import CliRunner

    from cuco.cli import app
    from cuco.report.ui import make_server

    cands = _run(tmp_path / "run", generations=3)
    opened = _only_read_only_opens(monkeypatch)
    assert "Best program" in render_report(tmp_path / "run")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    assert "Best program" in (tmp_path / "page.html").read_text() and not (tmp_path / "run" / "report.html").exists()
    server = make_server(tmp_path / "run", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert "Best program" in urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "Program" in urllib.request.urlopen(base + f"/candidate/{cands[0].id}", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert opened and all("mode=ro" in uri for uri in opened), opened


def test_the_read_only_store_refuses_writes(tmp_path):
    import sqlite3

    import pytest

    from cuco.evolve.database import Database

    _run(tmp_path, generations=2)
    db = Database(tmp_path / "cuco.db", readonly=True)
    try:
        assert len(db.all()) == 2 and db.missing_migrations() == []
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.set_meta("x", 1)
    finally:
        db.close()


def test_report_on_a_run_directory_it_cannot_write(tmp_path):
    """The real thing, where permissions hold (not for root): a run directory and store without write bits."""
    import pytest

    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits")
    _run(tmp_path / "run", generations=2)
    for p in (tmp_path / "run").rglob("*"):
        p.chmod(0o555 if p.is_dir() else 0o444)
    (tmp_path / "run").chmod(0o555)
    try:
        env = {**os.environ, "CUCO_HOME": str(tmp_path / "h")}
        proc = subprocess.run([sys.executable, "-m", "cuco", "report", str(tmp_path / "run"), "--out",
                               str(tmp_path / "page.html")], cwd=ROOT, capture_output=True, text=True, env=env)
        assert proc.returncode == 0 and "Best program" in (tmp_path / "page.html").read_text(), proc.stderr
        proc = subprocess.run([sys.executable, "-m", "cuco", "report", str(tmp_path / "run")], cwd=ROOT,
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and "--out" in proc.stderr, proc.stderr
    finally:
        (tmp_path / "run").chmod(0o755)


def test_the_ui_answers_a_broken_store_with_an_error_page(tmp_path):
    import threading
    import urllib.error
    import urllib.request

    from cuco.report.ui import make_server

    _run(tmp_path, generations=2)
    server = make_server(tmp_path, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "cuco.db").write_text("not a database")
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10)
        raise AssertionError("expected 500")
    except urllib.error.HTTPError as exc:
        assert exc.code == 500 and "error:" in exc.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def test_cli_refuses_what_is_not_a_store(tmp_path):
    env = {**os.environ, "CUCO_HOME": str(tmp_path / "h")}
    (tmp_path / "cuco.db").write_text("")  # an empty file: no store at all
    proc = subprocess.run([sys.executable, "-m", "cuco", "report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and "not a store of cuco evolve" in proc.stderr, proc.stderr
    assert (tmp_path / "cuco.db").read_text() == ""  # and it was left as it was
