"""What a person watches during `cuco evolve`: a live table on a terminal, one line per event otherwise. What
candidates and proposers wrote (labels, errors, names) goes in as Text, never as markup (report/console.py)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cuco.evolve.database import Candidate
from cuco.evolve.run import Event, Evolution, comparisons, strongest_baseline
from cuco.report.console import fmt_ms


def _outcome(c: Candidate) -> str:
    if c.status != "done":
        return c.status
    return "ok" if c.ok else f"failed {c.failed_level}"


class EvolveDisplay:
    def __init__(self, console: Console, target: int) -> None:
        self.console, self.target = console, target
        self.live: Live | None = None
        self.t0 = time.monotonic()
        self.seed_ms: float | None = None
        self.round = ""  # the rounds at the search's end: the last one timed

    def __enter__(self) -> EvolveDisplay:
        if self.console.is_terminal:
            self.live = Live(Table(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def __call__(self, event: Event, evo: Evolution) -> None:
        c = event.candidate
        if c is not None and c.proposer == "seed" and c.median_ms:
            self.seed_ms = c.median_ms
        if event.kind == "round":
            self.round = event.text
        if self.live:
            self.live.update(self.render(evo))
            return
        done = evo.db.count("done")
        if event.kind == "start" and c is not None:
            self.console.print(f"start #{c.id} [{c.phase}] {c.label or '-'}", highlight=False, markup=False)
        elif event.kind == "done" and c is not None:
            eff = f"efficiency {c.score:.2f}" if c.score else (c.error or "")[:120]
            self.console.print(f"done #{c.id} ({done}/{self.target}) {_outcome(c)} {fmt_ms(c.median_ms)} ms {eff}",
                               highlight=False, markup=False)
        else:
            self.console.print(f"{event.kind}: {event.text}", highlight=False, markup=False)

    def render(self, evo: Evolution) -> Group:
        db = evo.db
        done = db.count("done")
        best = db.best()
        head = Table.grid(padding=(0, 2))
        head.add_row("evaluations", f"{done}/{self.target}", "running", str(db.count("running")))
        if best:
            speed = f", {self.seed_ms / best.median_ms:.2f}x the seed, one evaluation each" \
                if self.seed_ms and best.median_ms else ""
            head.add_row("best", Text(f"#{best.id} {best.label or '-'}"), "time",
                         f"{fmt_ms(best.median_ms)} ms (bound {fmt_ms(best.bound_ms)}, "
                         f"efficiency {best.score:.2f}{speed})")
        fails = db.failures_by_level()
        head.add_row("failures", ", ".join(f"{k}: {v}" for k, v in sorted(fails.items())) or "none",
                     "per candidate", f"{(time.monotonic() - self.t0) / max(done, 1):.1f} s")
        if self.round:
            head.add_row("side by side", Text(f"round {self.round}"), "", "")
        recent = Table(title="recent candidates", title_justify="left")
        for col in ("id", "phase", "design point", "parent", "outcome", "median ms", "efficiency"):
            recent.add_column(col)
        for c in db.all()[-10:]:
            recent.add_row(str(c.id), Text(c.phase), Text(c.label or "-"), str(c.parent_id or "-"), Text(_outcome(c)),
                           fmt_ms(c.median_ms), f"{c.score:.2f}" if c.score else "-")
        return Group(head, recent)


def summary_table(evo: Evolution, top: int = 8) -> Table:
    db = evo.db
    strongest = strongest_baseline(db)
    title = f"{evo.spec.name} at {evo.shape}: best of {db.count('done')} evaluations"
    if strongest:
        title += f"; strongest baseline measured in this run: {strongest[0]}, {fmt_ms(strongest[1])} ms"
    caption = "vs: one evaluation of each" + "".join(f"\nside by side: {c.words()}" for c in comparisons(db)[0])
    t = Table(title=Text(title, style="table.title"), title_justify="left", caption=Text(caption),
              caption_justify="left")
    for col in ("rank", "id", "design point", "median ms", "bound ms", "efficiency", "vs strongest baseline",
                "vs seed", "found at evaluation"):
        t.add_column(col)
    done = list(db.iter_done())
    order = {c.id: i + 1 for i, c in enumerate(done)}
    seed_ms = next((c.median_ms for c in done if c.proposer == "seed" and c.median_ms), None)
    for i, c in enumerate(db.scored()[:top], 1):
        vs_seed = f"{seed_ms / c.median_ms:.2f}x" if seed_ms and c.median_ms else "-"
        vs_best = f"{strongest[1] / c.median_ms:.2f}x" if strongest and c.median_ms else "-"
        t.add_row(str(i), str(c.id), Text(c.label or "-"), fmt_ms(c.median_ms), fmt_ms(c.bound_ms), f"{c.score:.2f}",
                  vs_best, vs_seed, str(order.get(c.id, "-")))
    return t
