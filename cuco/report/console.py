"""Rich tables for evaluation records and baselines. Whatever a candidate, a workload or a program under analysis
wrote (errors, names, paths, source text) goes in as Text, never as markup: rich would take its brackets for tags,
eat them, or stop on a closing tag that matches nothing."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cuco.runner.results.record import EvalRecord, ShapeResult


def fmt_ms(v: float | None) -> str:
    """Milliseconds as every table shows them: four decimals under 1 ms, three above."""
    return "-" if v is None else f"{v:.4f}" if v < 1 else f"{v:.3f}"


def _param_names(shapes) -> str:
    """The shape parameters' names, as the column's header (M,K,N for a GEMM workload)."""
    first = next(iter(shapes), None)
    return ",".join(first.params) if first is not None and first.params else "params"


def verdict(record: EvalRecord) -> Text:
    """One phrase for the record's outcome, naming whose failure it was where it was not the candidate's."""
    if record.ok:
        return Text(record.incomplete, style="yellow") if record.incomplete else Text("passed", style="green")
    who = {"runner": " (cuco's own failure)", "workload": " (the workload's failure)"}.get(record.fault or "", "")
    return Text(f"failed at {record.failed_level}{who}", style="red")


def _efficiency(s: ShapeResult) -> str:
    """Library bound / median, and the finding where the time beats the library (only physics rejects a time)."""
    if not s.efficiency:
        return "-"
    return f"{s.efficiency:.2f}" + (" [green]beats the library[/]" if s.beats_library else "")


def eval_table(record: EvalRecord) -> Table:
    title = Text.assemble(f"{record.workload} / {record.candidate_name} ({record.language}, {record.device}, "
                          f"world {record.world}): ", verdict(record),
                          f", level reached {record.level_reached or '-'}", style="table.title")
    t = Table(title=title, title_justify="left")
    # "inputs ms": of the median, the run's fresh inputs arriving in the candidate's buffers (inside every time)
    for col in ("shape", _param_names(record.shapes.values()), "per-rank median ms", "median ms", "inputs ms",
                "p10-p90 ms", "spread", "library bound ms", "efficiency", "speed of light ms", "efficiency (light)",
                "speedup"):
        t.add_column(Text(col), justify="left" if col in ("shape", "speedup") else "right")
    for name, s in record.shapes.items():
        timing = s.timing
        label = Text(",".join(str(v) for v in s.params.values()))
        if not timing:
            levels = "+".join(c.level for c in s.correctness)
            t.add_row(Text(name), label, f"correct ({levels})", "", "", "", "", "", "", "", "", "")
            continue
        # The strongest baseline (the smallest speedup) first: the number that says whether the search won.
        sp = Text(", ".join(f"{k} {v:.2f}x" for k, v in sorted((s.speedup or {}).items(), key=lambda kv: kv[1])))
        t.add_row(Text(name), label, " ".join(fmt_ms(x) for x in timing.per_rank_median_ms or []),
                  fmt_ms(timing.median_ms), fmt_ms(timing.inputs_ms),
                  f"{fmt_ms(timing.p10_ms)}-{fmt_ms(timing.p90_ms)}", f"{timing.spread_pct or 0.0:.1f}%",
                  fmt_ms(record.bound_ms(name)), _efficiency(s),
                  fmt_ms(s.bound.speed_of_light_ms if s.bound else None),
                  f"{s.sol_efficiency:.2f}" if s.sol_efficiency else "-", sp)
    return t


def print_record(record: EvalRecord, console: Console | None = None) -> None:
    console = console or Console()
    table = eval_table(record)
    console.print(table if record.shapes else table.title, highlight=False)
    if record.error:
        console.print(Text.assemble((f"{record.failed_level}:", "red"), " ", record.error))
    for s in record.shapes.values():
        note = s.timing.note if s.timing else None
        if note and "CPU" not in note:
            console.print(Text.assemble(("note:", "yellow"), " ", note))
            break
    if record.note:
        console.print(Text.assemble(("note:", "yellow"), " ", record.note))


def baseline_table(workload: str, records: dict[str, EvalRecord]) -> Table:
    """Per shape: each baseline's median, then the measured compute and collective alone, and the bound."""
    t = Table(title=Text(f"{workload}: baselines and bounds (ms, slowest rank, median)", style="table.title"),
              title_justify="left")
    names = list(records)
    t.add_column("shape")
    t.add_column(Text(_param_names(s for r in records.values() for s in r.shapes.values())))
    for n in names:
        t.add_column(Text(n), justify="right")
    for col in ("compute alone", "collective alone", "comm bound", "bound"):
        t.add_column(col, justify="right")
    shapes: dict[str, ShapeResult] = {}
    for rec in records.values():
        for sname, s in rec.shapes.items():
            if s.timing:
                shapes.setdefault(sname, s)
    for sname, any_s in shapes.items():
        row: list[str | Text] = [Text(sname), Text(",".join(str(v) for v in any_s.params.values()))]
        for n in names:
            row.append(fmt_ms(records[n].median_ms(sname)) if records[n].timing(sname) else
                       f"[red]{records[n].failed_level or '-'}[/]")
        refs, bound = any_s.references_ms, any_s.bound
        row += [fmt_ms(refs.get("compute_alone")), fmt_ms(refs.get("comm_alone")),
                fmt_ms(bound.comm_ms if bound else None), fmt_ms(bound.bound_ms if bound else None)]
        t.add_row(*row)
    return t


def analysis_table(a) -> Table:
    """The fast path's analysis: every operation in program order, what it reads and writes, its stream."""
    t = Table(title=Text(f"{a.path}: {len(a.nccl)} NCCL calls, {len(a.edges)} producer/consumer edges",
                         style="table.title"), title_justify="left")
    for col in ("#", "line", "function", "loop", "kind", "call", "reads", "writes", "stream", "details"):
        t.add_column(col)
    consumers: dict[int, list[str]] = {}
    for src, dst, buf in a.edges:
        consumers.setdefault(src, []).append(f"-> #{dst} ({buf})")
    for src, dst, buf, line in a.carried:
        consumers.setdefault(src, []).append(f"-> #{dst} ({buf}, next iteration of the loop at line {line})")
    for o in a.ops:
        details = ", ".join(f"{k}={v}" for k, v in o.args.items() if k not in ("send", "recv", "stream"))
        details += (" " if details else "") + " ".join(consumers.get(o.index, []))
        loop = f"line {o.loops[-1]}" if o.loops else ""
        cells = (str(o.index), str(o.line), o.function, loop, o.kind, o.name, ", ".join(o.reads), ", ".join(o.writes),
                 o.stream or "", details)
        t.add_row(*(Text(c) for c in cells))
    return t
