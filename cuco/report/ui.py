"""`cuco ui RUN_DIR`: the report as a live page, rebuilt from the store on every request, refreshing itself,
so a running search can be watched from a browser; /candidate/ID shows one candidate's program and record."""

from __future__ import annotations

import json
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cuco.evolve.rundir import RunDir
from cuco.report.html import render_report

REFRESH_S = 10


def _candidate_page(run_dir: RunDir, cid: int) -> str | None:
    db = run_dir.open(readonly=True)
    try:
        rows = [c for c in db.all() if c.id == cid]
    finally:
        db.close()
    if not rows:
        return None
    c = rows[0]
    record = json.dumps(json.loads(c.record), indent=1) if c.record else "not evaluated yet"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>candidate {c.id}</title></head><body "
            f"style='font: 14px system-ui; margin: 2em'><p><a href='/'>back</a></p><h1>#{c.id} "
            f"{escape(c.label or '-')}</h1><p>parent {c.parent_id or '-'}, island {c.island}, {escape(c.phase)}, "
            f"{escape(c.proposer)}</p><h2>Program</h2><pre>{escape(c.code)}</pre><h2>Record</h2>"
            f"<pre>{escape(record)}</pre></body></html>")


def make_server(run_dir: RunDir | Path, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    run_dir = RunDir.of(run_dir)
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            try:
                self._get()
            except Exception as exc:  # one line on the page, not a dropped connection
                self._send(500, f"<p>error: {escape(type(exc).__name__)}: {escape(str(exc))}</p>")

        def _get(self) -> None:
            if self.path in ("/", "/index.html"):
                page = render_report(run_dir).replace(
                    "<head>", f"<head><meta http-equiv='refresh' content='{REFRESH_S}'>", 1)
                page = page.replace("href='#c", "href='/candidate/").replace(
                    "<tr id='c", "<tr onclick=\"location='/candidate/'+this.id.slice(1)\" id='c")
                return self._send(200, page)
            if self.path.startswith("/candidate/") and self.path.split("/")[-1].isdigit():
                page = _candidate_page(run_dir, int(self.path.split("/")[-1]))
                if page is not None:
                    return self._send(200, page)
            self._send(404, "<p>not found</p>")

        def _send(self, status: int, page: str) -> None:
            data = page.encode()
            self.send_response(status)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ThreadingHTTPServer((host, port), Handler)
