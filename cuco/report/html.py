"""`cuco report RUN_DIR`: one self-contained HTML page for a search: the numbers, a plot, the lineage, the best code.

No template engine and no plotting library: the page is small, the plot is a hand-made SVG, and every
value from the database is escaped.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from cuco.evolve.database import Candidate
from cuco.evolve.run import comparisons, strongest_baseline
from cuco.evolve.rundir import RunDir
from cuco.report.console import fmt_ms

PLOT_W, PLOT_H, PAD = 720, 260, 40



def _speed_of_light(best: Candidate | None, shape: str | None) -> float | None:
    """The best program's speed of light at the search's shape, from its stored record (GPUs with ceilings)."""
    if best is None or not best.record or not best.median_ms:
        return None
    bound = (json.loads(best.record).get("shapes", {}).get(shape or "", {}).get("bound") or {})
    return bound.get("speed_of_light_ms")


def _plot(done: list[Candidate], bound: float | None) -> str:
    """Time of each evaluation in the order it finished, the running best, the bound; failures along the top."""
    ok = [(i, c.median_ms) for i, c in enumerate(done) if c.ok and c.median_ms]
    if not ok:
        return "<p>No correct evaluation to plot.</p>"
    hi = max(v for _, v in ok) * 1.05
    lo = min([v for _, v in ok] + ([bound] if bound else [])) * 0.95
    n = max(len(done) - 1, 1)

    def x(i: int) -> float:
        return PAD + (PLOT_W - 2 * PAD) * i / n

    def y(v: float) -> float:
        return PLOT_H - PAD - (PLOT_H - 2 * PAD) * (v - lo) / ((hi - lo) or 1)

    parts = [f'<svg width="{PLOT_W}" height="{PLOT_H}" role="img" aria-label="time per evaluation">',
             f'<line x1="{PAD}" y1="{PLOT_H - PAD}" x2="{PLOT_W - PAD}" y2="{PLOT_H - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{PLOT_H - PAD}" stroke="#999"/>',
             f'<text x="{PLOT_W - PAD}" y="{PLOT_H - 10}" font-size="11" text-anchor="end">evaluation</text>',
             f'<text x="{PAD - 4}" y="{y(hi):.1f}" font-size="10" text-anchor="end">{hi:.3f}</text>',
             f'<text x="{PAD - 4}" y="{y(lo):.1f}" font-size="10" text-anchor="end">{lo:.3f}</text>']
    if bound:
        parts.append(f'<line class="bound" x1="{PAD}" y1="{y(bound):.1f}" x2="{PLOT_W - PAD}" y2="{y(bound):.1f}" '
                     f'stroke="#2a7" stroke-dasharray="4 3"/><text x="{PLOT_W - PAD}" y="{y(bound) - 4:.1f}" '
                     f'font-size="10" text-anchor="end" fill="#2a7">bound {bound:.4f}</text>')
    best, path = None, []
    for i, v in ok:
        best = v if best is None else min(best, v)
        path.append(f"{x(i):.1f},{y(best):.1f}")
    parts.append(f'<polyline class="best" fill="none" stroke="#36c" points="{" ".join(path)}"/>')
    for i, c in enumerate(done):
        tip = escape(f"#{c.id} {c.label or ''} {fmt_ms(c.median_ms)} ms" if c.ok
                     else f"#{c.id} failed at {c.failed_level}")
        if c.ok and c.median_ms:
            parts.append(f'<circle class="ok" cx="{x(i):.1f}" cy="{y(c.median_ms):.1f}" r="3.5" fill="#36c">'
                         f"<title>{tip}</title></circle>")
        else:
            parts.append(f'<circle class="failed" cx="{x(i):.1f}" cy="{PAD / 2 + 6}" r="3.5" fill="#c33">'
                         f"<title>{tip}</title></circle>")
    return "".join(parts) + "</svg>"


def _lineage(cands: list[Candidate]) -> str:
    children: dict[int | None, list[Candidate]] = {}
    for c in cands:
        children.setdefault(c.parent_id, []).append(c)

    def node(c: Candidate) -> str:
        outcome = f"{fmt_ms(c.median_ms)} ms" if c.ok else (f"failed at {c.failed_level}" if c.status == "done"
                                                          else c.status)
        kids = "".join(node(k) for k in children.get(c.id, []))
        return (f"<li><a href='#c{c.id}'>#{c.id}</a> {escape(c.label or '-')} <small>({escape(c.proposer)}, "
                f"{escape(outcome)})</small>{f'<ul>{kids}</ul>' if kids else ''}</li>")

    return "<ul class='lineage'>" + "".join(node(c) for c in children.get(None, [])) + "</ul>"


def render_report(run_dir: RunDir | Path) -> str:
    db = RunDir.of(run_dir).open(readonly=True)  # it only reads: a run it may not write opens too
    try:
        meta: dict[str, Any] = db.get_meta("run") or {}
        cands = db.all()
        done = list(db.iter_done())
        best = db.best()
        seed = cands[0] if cands else None
        llm = db.llm_totals()
        fails = db.failures_by_level()
        strongest = strongest_baseline(db)
        measured, rounds_error = comparisons(db)
    finally:
        db.close()
    bound = best.bound_ms if best else None
    speed = f", {seed.median_ms / best.median_ms:.2f}x the seed" if best and seed and seed.median_ms else ""
    if best and strongest:  # the number that says whether the search won, before the seed's
        speed = f", {strongest[1] / best.median_ms:.2f}x the strongest baseline of this run ({strongest[0]})" + speed
    if speed:
        speed += " (one evaluation each, not side by side)"
    beats = " (beats the library)" if best and best.bound_ms and best.median_ms < best.bound_ms else ""
    light = _speed_of_light(best, meta.get("shape"))
    light = f"; speed of light {fmt_ms(light)} ms ({light / best.median_ms:.2f} of it)" if light else ""
    head = [("workload", meta.get("workload", "?")), ("shape", meta.get("shape", "?")),
            ("world size", meta.get("world", "?")), ("device", meta.get("device", "?")),
            ("evaluations", f"{len(done)} ({sum(1 for c in done if not c.ok)} failed: "
                            f"{', '.join(f'{k} {v}' for k, v in sorted(fails.items())) or 'none'})"),
            ("best", f"#{best.id} {best.label or '-'}: {fmt_ms(best.median_ms)} ms, library bound "
                     f"{fmt_ms(best.bound_ms)} ms, efficiency {best.score:.2f}{beats}{speed}{light}" if best
             else "none correct yet")]
    head += [("side by side", c.words()) for c in measured]
    if rounds_error:
        head.append(("side by side", f"not measured: {rounds_error}"))
    if llm["calls"]:
        head.append(("LLM", f"{llm['calls']} calls, {llm['input_tokens']} + {llm['output_tokens']} tokens, "
                            f"${llm['cost_usd']:.2f}"))
    rows = []
    for c in cands:
        outcome = "ok" if c.ok else (f"failed at {c.failed_level}" if c.status == "done" else c.status)
        text = (json.loads(c.directive).get("text", "") if c.directive else "")
        rows.append(f"<tr id='c{c.id}' class='{'ok' if c.ok else 'bad'}'><td>{c.id}</td><td>{c.parent_id or ''}</td>"
                    f"<td>{c.island}</td><td>{escape(c.phase)}</td><td>{escape(c.proposer)}</td>"
                    f"<td>{escape(c.label or '-')}</td><td>{escape(outcome)}</td><td>{fmt_ms(c.median_ms)}</td>"
                    f"<td>{f'{c.score:.2f}' if c.score else '-'}</td>"
                    f"<td>{escape((c.error or text)[:300])}</td></tr>")
    code = f"<h2>Best program (#{best.id})</h2><pre>{escape(best.code)}</pre>" if best else ""
    title = escape(f"cuco: {meta.get('workload', '')} at {meta.get('shape', '')}")
    summary = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in head)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left; }}
tr.bad td {{ color: #a22; }} pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }}
.lineage {{ font-family: ui-monospace, monospace; font-size: 12px; }}
</style></head><body>
<h1>{title}</h1>
<table class="summary">{summary}</table>
<h2>Time per evaluation</h2>
<p>Slowest rank, median, in ms; the blue line is the best so far, red dots along the top are failures.</p>
{_plot(done, bound)}
<h2>Lineage</h2>{_lineage(cands)}
<h2>Every candidate</h2>
<table class="candidates"><tr><th>id</th><th>parent</th><th>island</th><th>phase</th><th>proposer</th>
<th>design point</th><th>outcome</th><th>median ms</th><th>efficiency</th><th>error or directive</th></tr>
{''.join(rows)}</table>
{code}
</body></html>
"""
