"""The `cuco` command. Every failure ends in one line on stderr and an exit code of `ExitCode`: bad input 2,
cuco's own failure 3, a machine without the GPUs asked for 4. Every path is made absolute here, where it enters."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from cuco.errors import MEANING, CucoError, CucoFailure, ExitCode, NeedsGPU
from cuco.language import is_cuda, language_of
from cuco.machine import gpus_in_words, resolve_device
from cuco.paths import absolute, atomic_write_json, baselines_file

if TYPE_CHECKING:  # the scaffold is imported where a command needs it
    from cuco.scaffold.create import Created


class _FlagsWithoutType:
    """typer shows a flag's type as <bool>, though a flag takes no value: its type column stays empty."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)  # the typer class this is mixed into
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class _Command(_FlagsWithoutType, TyperCommand):
    pass


class _Group(_FlagsWithoutType, TyperGroup):
    pass


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Compute-communication co-design for multi-GPU programs: verified, measured, searched.",
                  epilog="Exit codes of every command: " + ", ".join(
                      f"{int(code)} {short}" for code, (short, _) in MEANING.items()) + " (docs/cli.md).")
# Text that is not cuco's own (paths, names, errors, labels, source) is printed as text: markup=False, Text, or
# escape() inside cuco's own markup; rich would take its brackets for tags, and without emoji=False its :names: for
# emoji codes.
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, emoji=False)


def _spec(workload: str, world: int | None):
    """The workload, at --world's size where given (checked here: a bad flag is not the workload's fault)."""
    from cuco.workload import load_workload, resolve_workload

    if world is not None and world < 1:
        raise CucoError("--world", f"must be at least 1, got {world}")
    return load_workload(resolve_workload(workload), world)


def _candidate(spec, candidate: str) -> Path:
    if candidate in spec.candidates:
        return spec.candidates[candidate]
    p = absolute(candidate)
    if not p.is_file():
        known = ", ".join(spec.candidates)
        raise CucoError(candidate, f"no such candidate file, nor a candidate of {spec.name} (known: {known})")
    language_of(p, candidate)
    return p


def _eval_config(config: Path | None, device: str | None = None, timeout: float | None = None,
                 warmup: int | None = None, iters: int | None = None):
    """run.toml's [eval], then the command's flags: the settings every command evaluates candidates with."""
    from cuco.evolve.config import load_config

    cfg = load_config(absolute(config) if config else None).eval
    for flag, key, value in (("--device", "device", device), ("--timeout", "timeout_s", timeout),
                             ("--warmup", "warmup", warmup), ("--iters", "iters", iters)):
        if value is not None:
            setattr(cfg, key, value)
            cfg.check(flag)
    return cfg


def _options(spec, device: str, shapes: list[str], small: list[str], level: str, gpus: str | None, ecfg):
    from cuco.runner.cascade import LEVELS, EvalOptions

    if level not in LEVELS:
        raise CucoError("--level", f"expected one of {', '.join(LEVELS)}, got {level!r}")
    for s in shapes + small:
        spec.shape(s)  # raises with the known names
    if device == "cpu" and not shapes:
        if not spec.small_shapes:
            raise CucoError(str(spec.source), "no [[small_shapes]] to run on the CPU; pass --shape")
        shapes = [spec.small_shapes[0].name]
    if level == "L4":  # a timed shape needs a bound (a small one timed on the CPU or named by --shape too)
        for name in shapes or [full.name for full in spec.shapes]:
            spec.check_bounds(spec.shape(name))
    gpu_list: list[int] = []
    if gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",")]
        except ValueError:
            raise CucoError("--gpus", f"expected a comma-separated list of GPU indices, got {gpus!r}") from None
        if len(gpu_list) != spec.world_size:
            raise CucoError("--gpus", f"{len(gpu_list)} GPUs given for world size {spec.world_size}")
    elif device == "cuda":
        gpu_list = list(range(spec.world_size))
    if device == "cuda":
        from cuco.machine import ensure_bound_facts

        ensure_bound_facts(lambda line: console.print(f"[dim]{escape(line)}[/]"))
    return EvalOptions(device=device, shapes=shapes or None, small_shapes=small or None, max_level=level,
                       gpus=gpu_list, timeout_s=ecfg.timeout_s, warmup=ecfg.warmup, iters=ecfg.iters)


def _exit_code(record) -> ExitCode:
    """A record's verdict as the command's exit code: whose fault a failure was decides between 1, 2 and 3."""
    if record.ok:
        return ExitCode.INCOMPLETE if record.incomplete else ExitCode.OK
    return {"runner": ExitCode.CUCO, "workload": ExitCode.BAD_INPUT}.get(record.fault or "", ExitCode.FAILED)


def _load_baselines(spec, device: str) -> dict:
    """The baselines file of `cuco baseline` (name -> record JSON), as records: the speedups read their times."""
    from cuco.runner.results.record import EvalRecord

    p = baselines_file(spec.name, spec.world_size, device)
    if not p.is_file():
        return {}
    try:
        return {name: EvalRecord.from_dict(r) for name, r in json.loads(p.read_text()).items()}
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise CucoError(str(p), f"not a baselines file of cuco baseline ({e}); `cuco baseline {spec.name}` "
                                "writes it again") from None


def _record_path(out: Path | None, spec, name: str) -> Path:
    from cuco.paths import records_dir

    if out:
        return absolute(out)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return records_dir() / f"{stamp}-{spec.name}-{name}.json"


ShapeOpt = typer.Option([], "--shape", "-s", metavar="<name>",
                        help="Full shape(s) for L3/L4, by name (default: all; CPU: the first small one).")
SmallOpt = typer.Option([], "--small-shape", metavar="<name>", help="Small shape(s) for L2, by name (default: all).")
DeviceOpt = typer.Option(None, "--device", help="auto, cuda or cpu (default: run.toml's eval.device, else auto).")
ConfigOpt = typer.Option(None, "--config", help="A run.toml whose \\[eval] table sets how candidates are evaluated.")
WorldOpt = typer.Option(None, "--world", help="World size (default: the workload's).")
GpusOpt = typer.Option(None, "--gpus", help="Comma-separated GPU indices, one per rank (default: 0..world-1).")
TimeoutOpt = typer.Option(None, "--timeout", help="Watchdog limit in seconds for one candidate (eval.timeout_s; "
                          "default: the workload's).")
WarmupOpt = typer.Option(None, "--warmup", help="Warm-up iterations (eval.warmup; default: the workload's).")
ItersOpt = typer.Option(None, "--iters", help="Timed iterations (eval.iters; default: the workload's).")


def _version(value: bool) -> None:
    if value:
        from cuco import __version__

        print(f"cuco {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Compute-communication co-design for multi-GPU programs: verified, measured, searched."""


@app.command()
def doctor(measure: bool = typer.Option(True, help="On a GPU machine, measure peer-link bandwidth and GEMM rate."),
           as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON.")) -> None:
    """What this machine has (GPUs and links, nvcc, NCCL device API, cuBLAS, MPI, torch); measures the bounds' rates."""
    from cuco.doctor import collect, rows
    from cuco.paths import machine_file

    facts = collect(measure)
    if as_json:
        print(json.dumps(facts, indent=1))
        return
    t = Table(title="cuco doctor", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows(facts):
        t.add_row(Text(str(k)), Text(str(v)))
    console.print(t)
    console.print(f"saved to {machine_file()}", style="dim", markup=False, highlight=False)


@app.command("eval")
def eval_cmd(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
             candidate: str = typer.Argument(..., help="Candidate file (.cu or .py), or the name of one of the "
                                             "workload's."),
             device: str | None = DeviceOpt, shape: list[str] = ShapeOpt, small_shape: list[str] = SmallOpt,
             level: str = typer.Option("L4", "--level", help="Highest cascade level to run (L0..L4)."),
             world: int | None = WorldOpt, gpus: str | None = GpusOpt, timeout: float | None = TimeoutOpt,
             warmup: int | None = WarmupOpt, iters: int | None = ItersOpt, config: Path | None = ConfigOpt,
             out: Path | None = typer.Option(None, "--out", help="Where to write the JSON record."),
             as_json: bool = typer.Option(False, "--json", help="Print the record as JSON.")) -> None:
    """Run the cascade on one candidate: level reached, per-rank times, median and spread, bound, efficiency,
    speedups."""
    from cuco.report.console import print_record
    from cuco.runner.cascade import evaluate, save_record

    ecfg = _eval_config(config, device, timeout, warmup, iters)
    spec = _spec(workload, world)
    path = _candidate(spec, candidate)
    dev = resolve_device(ecfg.device, spec.world_size)
    opts = _options(spec, dev, shape, small_shape, level, gpus, ecfg)
    opts.name = candidate if candidate in spec.candidates else None
    baselines = _load_baselines(spec, dev)
    with console.status(Text(f"evaluating {path.name} on {dev}")) as status:
        opts.on_step = lambda step: status.update(Text(f"evaluating {path.name} on {dev}: {step}"))
        record = evaluate(spec, path, opts, baselines)
    saved = save_record(record, _record_path(out, spec, opts.name or path.stem))
    if as_json:
        print(json.dumps(record.to_dict(), indent=1))
    else:
        print_record(record, console)
        console.print(f"record: {saved}", style="dim", markup=False, highlight=False)
    raise typer.Exit(_exit_code(record))


@app.command("compare")
def compare_cmd(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
                first: str = typer.Argument(..., help="Candidate file (.cu or .py), or the name of one of the "
                                            "workload's."),
                second: str = typer.Argument(..., help="The program it is compared with, named the same way."),
                rounds: int = typer.Option(5, "--rounds", help="Alternating rounds, one evaluation of each per round "
                                                               "(2 to 10)."),
                shape: str | None = typer.Option(None, "--shape", "-s", metavar="<name>",
                                                 help="The shape both are timed at (default: the first full one, "
                                                      "as a search's)."),
                device: str | None = DeviceOpt, world: int | None = WorldOpt, gpus: str | None = GpusOpt,
                timeout: float | None = TimeoutOpt, warmup: int | None = WarmupOpt, iters: int | None = ItersOpt,
                config: Path | None = ConfigOpt,
                as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON.")) -> None:
    """Time two programs side by side, in alternating rounds: whether the first is faster than the second, slower,
    or within noise (the 99.9% interval of the ratio of their times holds 1.0)."""
    from cuco.runner.cascade import evaluate
    from cuco.runner.results.comparison import MAX_ROUNDS, MIN_ROUNDS, compare, pending

    if not MIN_ROUNDS <= rounds <= MAX_ROUNDS:
        raise CucoError("--rounds", f"expected {MIN_ROUNDS} to {MAX_ROUNDS}, got {rounds}")
    ecfg = _eval_config(config, device, timeout, warmup, iters)
    spec = _spec(workload, world)
    paths = [_candidate(spec, first), _candidate(spec, second)]
    dev = resolve_device(ecfg.device, spec.world_size)
    if dev == "cpu" and any(is_cuda(p) for p in paths):
        raise NeedsGPU(spec.name, f"a CUDA program is timed on {gpus_in_words(spec.world_size)}; this machine has "
                                  "none")
    target = shape or spec.shapes[0].name
    opts = _options(spec, dev, [target], [], "L4", gpus, ecfg)
    opts.small_shapes = []  # every timed run is verified: no correctness stage before
    names = [first, second] if first != second else [f"{first} (first)", f"{second} (second)"]
    times: dict[str, list[float]] = {n: [] for n in names}
    for i, name in pending(names, rounds, times):
        k = names.index(name)
        opts.name = (first, second)[k] if (first, second)[k] in spec.candidates else None
        head = f"round {i + 1}/{rounds}: {name} on {dev}"
        with console.status(Text(head)) as status:
            opts.on_step = lambda step, head=head: status.update(Text(f"{head}: {step}"))
            record = evaluate(spec, paths[k], opts)
        median = record.median_ms(target) if record.ok else None
        if median is None:
            console.print(f"round {i + 1}: {name} failed at {record.failed_level}: {record.error}",
                          highlight=False, markup=False)
            raise typer.Exit(_exit_code(record) or ExitCode.FAILED)
        times[name].append(median)
        if not as_json:
            console.print(f"round {i + 1}: {name} {median:.4f} ms", highlight=False, markup=False)
    result = compare(names[0], times[names[0]], names[1], times[names[1]])
    if as_json:
        print(json.dumps({"workload": spec.name, "shape": target, "device": dev, **result.to_dict()}, indent=1))
    else:
        console.print(f"{spec.name} at {target} on {dev}: {result.words()}", highlight=False, markup=False)


@app.command()
def check(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
          candidate: str | None = typer.Argument(None, help="A .cu candidate whose cuco_buffer and cuco_param names "
                                                "to check too (default: the seed).")) -> None:
    """Your half of a workload's contract, on the CPU: names the program uses exist in workload.toml, reference.py
    imports and runs at the small shapes, and returns the declared shapes and dtypes."""
    from cuco.workload.check import check_workload

    spec = _spec(workload, None)  # loading checks the bounds at the full shapes
    for small in spec.small_shapes:  # and a small shape is timed on the CPU, or when --shape names it
        spec.check_bounds(small)
    path = _candidate(spec, candidate) if candidate else None
    with console.status(Text(f"checking {spec.name}")):
        problems = check_workload(spec.root, path)
    for line in problems:
        console.print(f"[red]problem:[/] {escape(line)}", highlight=False)
    if problems:
        raise CucoError(str(spec.root), f"{len(problems)} problem(s) in the workload (listed above)")
    console.print(f"{spec.name}: workload.toml, the program's names and reference.py agree; reference.py runs at "
                  f"{len(spec.small_shapes)} small shape(s) on the CPU", highlight=False, markup=False)


@app.command()
def baseline(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
             device: str | None = DeviceOpt, shape: list[str] = ShapeOpt, world: int | None = WorldOpt,
             gpus: str | None = GpusOpt, timeout: float | None = TimeoutOpt, warmup: int | None = WarmupOpt,
             iters: int | None = ItersOpt, config: Path | None = ConfigOpt) -> None:
    """Run the workload's baselines and bounds for every shape; later evaluations report speedups over them."""
    from cuco.report.console import baseline_table, print_record
    from cuco.runner.cascade import evaluate, save_record

    ecfg = _eval_config(config, device, timeout, warmup, iters)
    spec = _spec(workload, world)
    if not spec.baselines:
        raise CucoError(str(spec.source), "baselines: the workload lists no baseline candidates")
    dev = resolve_device(ecfg.device, spec.world_size)
    opts = _options(spec, dev, shape, [], "L4", gpus, ecfg)
    records = {}
    for name in spec.baselines:
        path = spec.candidates[name]
        if dev == "cpu" and is_cuda(path):
            console.print(f"{name}: CUDA candidate, skipped on the CPU", style="dim", markup=False, highlight=False)
            continue
        opts.name = name
        with console.status(Text(f"baseline {name}")):
            records[name] = evaluate(spec, path, opts)
        save_record(records[name], _record_path(None, spec, f"baseline-{name}"))
        if not records[name].ok:
            print_record(records[name], console)
    if not records:
        raise NeedsGPU(spec.name, "every baseline is a CUDA program: timing them needs "
                                  f"{gpus_in_words(spec.world_size)}")
    out = atomic_write_json(baselines_file(spec.name, spec.world_size, dev),
                            {n: r.to_dict() for n, r in records.items()}, indent=1)
    console.print(baseline_table(spec.name, records))
    console.print(f"saved to {out}", style="dim", markup=False, highlight=False)
    raise typer.Exit(max(_exit_code(r) for r in records.values()))


@app.command()
def evolve(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
           generations: int | None = typer.Option(None, "--generations", "-n",
                                                     help="Evaluations in all, the seed's included (run.toml: "
                                                          "search.generations)."),
           run_dir: Path | None = typer.Option(None, "--run-dir", help="Where the database and the best program go "
                                                  "(default: cuco-runs/WORKLOAD-SHAPE); an existing one is resumed."),
           seed: int | None = typer.Option(None, "--seed", help="Seed of every proposal (search.seed)."),
           config: Path | None = typer.Option(None, "--config", help="A run.toml with \\[search] and \\[eval] tables."),
           shape: str | None = typer.Option(None, "--shape", help="Shape to optimise (search.shape)."),
           device: str | None = typer.Option(None, "--device", help="auto, cuda or cpu (eval.device)."),
           world: int | None = WorldOpt,
           overrides: list[str] = typer.Option([], "--set", metavar="<key=value>",
                                                   help="Override a run.toml key: --set search.islands=3."),
           dry_run_prompt: bool = typer.Option(False, "--dry-run-prompt",
                                               help="Print the first prompt of each kind an LLM run would send; "
                                                    "no search, no LLM call.")) -> None:
    """Evolutionary search from the workload's seed; resumable; the best program lands in the run directory."""
    from cuco.evolve.config import apply_overrides, load_config
    from cuco.machine import load_machine
    from cuco.report.live import EvolveDisplay, summary_table
    from cuco.search import prepare_search, run_search

    cfg = apply_overrides(load_config(absolute(config) if config else None), list(overrides))
    for flag, section, key, value in (("--generations", cfg.search, "generations", generations),
                                      ("--seed", cfg.search, "seed", seed), ("--shape", cfg.search, "shape", shape),
                                      ("--device", cfg.eval, "device", device)):
        if value is not None:
            setattr(section, key, value)
            cfg.check(flag)
    spec = _spec(workload, world)
    if dry_run_prompt:
        from cuco.evolve.prompting import example_prompts

        target_shape = cfg.search.shape or spec.shapes[0].name
        spec.check_bounds(spec.shape(target_shape))
        for kind, text in example_prompts(spec, target_shape, load_machine()).items():
            print(f"==================== {kind} ====================\n{text}\n")
        return
    search = prepare_search(spec, cfg, run_dir, note=_note)
    console.print(search.headline(), style="dim", markup=False, highlight=False)
    try:
        with EvolveDisplay(console, cfg.search.generations) as display:
            result = run_search(search, on_event=display)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted:[/] finished evaluations are kept; the same command resumes "
                      f"({escape(str(search.run_dir))})")
        raise typer.Exit(130) from None
    console.print(summary_table(search.evolution))
    search.close()
    _print_result(result)
    raise typer.Exit(int(result.exit_code))


def _note(line: str) -> None:
    console.print(line, highlight=False, markup=False)


def _print_result(result) -> None:
    """What the search ended with, after its table (summary.json says the same)."""
    if result.stop_reason and not result.stop_fault:
        _note(f"stopped early: {result.stop_reason}")
    llm = result.llm
    if llm["calls"]:
        _note(f"LLM: {llm['calls']} calls (ok {llm.get('ok', 0)}, rejected {llm.get('rejected', 0)}, errors "
              f"{llm.get('error', 0)}), {llm['input_tokens']} input and {llm['output_tokens']} output tokens, "
              f"${llm['cost_usd']:.2f}")
    best = result.best
    if best:
        _note(f"best: #{best.id} {best.label or '-'}, {best.median_ms:.4f} ms, efficiency {best.score:.2f}; written to "
              f"{result.run_dir.best}")
    if result.rounds_error:
        console.print(f"[yellow]warning:[/] the rounds that time the best against its rivals stopped: "
                      f"{escape(result.rounds_error)}", highlight=False)
    if result.start_failure:
        console.print(f"[yellow]warning:[/] {escape(result.start_failure)}", highlight=False)
    if result.error:
        err_console.print(f"[red]error:[/] {escape(result.error)}", highlight=False)


@app.command()
def transform(workload: str = typer.Argument(..., help="Built-in workload name or a workload directory."),
              source: Path | None = typer.Option(None, "--source", help="The host-driven program (default: the "
                                                    "workload's seed)."),
              analyze_only: bool = typer.Option(False, "--analyze-only", help="Print the analysis and stop."),
              explain: bool = typer.Option(False, "--explain", help="Print the knobs the rewrite offers a search, "
                                           "per collective, and why any placement is not offered; then stop."),
              as_json: bool = typer.Option(False, "--json", help="Print the analysis as JSON (only that, so that "
                                           "it parses) and stop."),
              out: Path | None = typer.Option(None, "--out", help="Where the device-initiated program goes "
                                                 "(default: cuco-runs/WORKLOAD-transform/transformed.cu)."),
              device: str | None = DeviceOpt, world: int | None = WorldOpt,
              llm: bool = typer.Option(False, "--llm", help="Where the rules cannot rewrite, run the LLM loop "
                                       "(stage A, stage B, a judge) configured by --config's \\[llm]."),
              config: Path | None = typer.Option(None, "--config", help="A run.toml whose \\[llm] and \\[eval] "
                                                    "tables to use."),
              tries: int = typer.Option(3, "--tries", help="LLM tries per stage.")) -> None:
    """Fast path: analyse a host-driven NCCL program and rewrite it to initiate communication from the GPU."""
    from cuco.fastpath.analyze import AnalysisError, analyze
    from cuco.fastpath.pipeline import TransformError
    from cuco.fastpath.pipeline import transform as run_transform
    from cuco.report.console import analysis_table, print_record
    from cuco.runner.cascade import evaluate
    from cuco.search import knobs_of

    ecfg = _eval_config(config, device)
    spec = _spec(workload, world)
    path = absolute(source) if source else Path(spec.seed_path or spec.source)
    if not path.is_file():
        raise CucoError(str(path), "no such source file (give --source, or a seed in [candidates])")
    if not is_cuda(path):
        raise CucoError(str(path), "the fast path analyses CUDA C++ (.cu) programs")
    try:
        analysis = analyze(path)
    except AnalysisError as exc:
        raise CucoError("", str(exc)) from None
    if as_json:
        print(analysis.to_json())
        return
    console.print(analysis_table(analysis))
    for w in analysis.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    if explain:
        for line in knobs_of(spec, analysis).explain():
            console.print(line, highlight=False, markup=False)
    if analyze_only or explain:
        return
    dev = resolve_device(ecfg.device, spec.world_size)
    opts = _options(spec, dev, [], [], "L3", None, ecfg)
    check = lambda p: evaluate(spec, p, opts)  # noqa: E731
    target = absolute(out or Path("cuco-runs") / f"{spec.name}-transform" / "transformed.cu")
    try:
        with console.status("rewriting, building" + (" and verifying" if dev == "cuda" else "")):
            result = run_transform(spec, analysis, target, _llm_fallback(config, tries, check) if llm else None,
                                   check if dev == "cuda" else None)
    except TransformError as exc:
        raise CucoError(exc.where, exc.message + ("" if llm else " (add --llm to hand it to the LLM loop)")) from None
    for line in result.rewrites:
        console.print(f"rewrote {line}", highlight=False, markup=False)
    if result.rules_stopped:
        console.print(f"the rules stop here ({result.rules_stopped}); the LLM loop wrote it", highlight=False,
                      markup=False)
    for log in result.llm_stages:
        console.print(f"stage {log.stage}: correct after {len(log.tries)} tries (prompts, replies, judge notes in "
                      f"{target.parent / 'llm'})", highlight=False, markup=False)
    console.print(f"{result.evolve_blocks} evolve blocks; re-analysis: no host collective left; built; written to "
                  f"{target}", highlight=False, markup=False)
    at = f" --world {world}" if world is not None else ""  # the commands it suggests run at the size it was given
    if result.record is None:
        console.print(f"not verified: that needs {gpus_in_words(spec.world_size)} (cuco eval {workload} {target}"
                      f"{at}); once "
                      f"it passes, cuco evolve {workload}{at} --set search.start={target} searches from it",
                      highlight=False, markup=False)
        raise typer.Exit(ExitCode.INCOMPLETE)
    print_record(result.record, console)
    if result.record.ok:
        console.print(f"verified; start a search from it: cuco evolve {workload}{at} --set search.start={target}",
                      highlight=False, markup=False)
    raise typer.Exit(_exit_code(result.record))



def _llm_fallback(config: Path | None, tries: int, check):
    from cuco.evolve.config import load_config
    from cuco.fastpath.pipeline import LLMFallback
    from cuco.llm import LLMError, make_client
    from cuco.machine import load_machine

    cfg = load_config(absolute(config) if config else None)
    try:
        client = make_client(cfg.llm)
    except LLMError as exc:
        raise CucoError("[llm]", str(exc)) from None
    console.print(f"where the rules stop: the LLM loop with {client.provider} {client.model}", highlight=False,
                  markup=False)
    return LLMFallback(client, check, tries, load_machine(), cfg.llm.max_tokens)


@app.command()
def init(name: str = typer.Argument(..., help="The new workload's name, and its directory's."),
         sources: list[Path] = typer.Option(..., "--from", metavar="<file>",
                                            help="Your host-driven program: kernels plus NCCL calls from the CPU, in "
                                            "one .cu file or several (--from host.cpp --from kernels.cu --from "
                                            "kernels.cuh)."),
         include_dirs: list[Path] = typer.Option([], "--include-dir", "-I", metavar="<dir>",
                                                 help="A folder of the program's own headers, for its macros (its "
                                                 "files' folders are searched first)."),
         defines: list[str] = typer.Option([], "--define", "-D", metavar="<NAME[=VALUE]>",
                                           help="A macro the program is built with (NAME or NAME=VALUE), as you pass "
                                           "it to nvcc."),
         parent: Path = typer.Option(Path("."), "--dir", help="Where the workload directory goes (made if missing).")
         ) -> None:
    """Scaffold a workload around your own program: seed.cu, workload.toml from its analysis, reference.py to write."""
    from cuco.scaffold import create_workload

    made = create_workload(name, [absolute(s) for s in sources], absolute(parent),
                           [absolute(d) for d in include_dirs], defines)
    for line in made.reading:
        console.print(line, highlight=False, markup=False)
    for w in made.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    sc = made.scaffold
    if made.converted:
        _converted_seed_builds(made)
    console.print(f"created {made.root}: seed.cu, workload.toml ({len(sc.buffers)} buffers over "
                  f"{', '.join(p.name for p in sc.params)}; {made.todos} lines marked TODO), reference.py (stubs)",
                  highlight=False, markup=False)
    first = "" if sc.abi else "write seed.cu's cuco_setup, cuco_run and cuco_teardown around the program's work (it " \
                                  "has none: cuco check refuses it until then), "
    console.print(f"next: {first}write reference.py's functions and settle workload.toml's TODOs, check them on the "
                  f"CPU: cuco check {made.root}; then on the GPUs: cuco eval {made.root} seed", highlight=False,
                  markup=False, soft_wrap=True)  # a command split across lines cannot be pasted


def _converted_seed_builds(made: Created) -> None:
    """The seed cuco wrote from a standalone program builds, or the command says so and fails: nvcc where this
    machine has it (the build is cached, so cuco eval reuses it)."""
    from cuco.runner.build.cuda_checks import check_and_build
    from cuco.runner.build.nvcc import first_error
    from cuco.runner.build.toolchain import find_toolchain

    seed, tc = made.root / "seed.cu", find_toolchain()
    if tc.missing():
        console.print(f"seed.cu not built here: this machine lacks {', '.join(tc.missing())}", highlight=False,
                      markup=False)
        return
    built, problems = check_and_build(seed, toolchain=tc)
    if built.ok:
        console.print("seed.cu builds (nvcc)", highlight=False, markup=False)
        return
    why = problems[0] if problems else first_error(built.log)
    kept = next((w for w in made.warnings if "seed.cu keeps #include" in w), None)
    if kept is not None:  # a header of the program's that was not given: the user's to give
        header = kept.split("seed.cu keeps #include ", 1)[1].split(":", 1)[0]
        raise CucoError(str(seed), f"seed.cu does not build: {why}; give the program's header {header} too (--from), "
                                   "so that the seed holds what it needs (the workload is left as written, to read)")
    raise CucoFailure(str(seed), f"cuco wrote a seed that does not build: {why} (the workload is left as written, "
                                 "to read; the conversion is cuco's fault, not the program's)")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory of cuco evolve."),
           out: Path | None = typer.Option(None, "--out",
                                           help="Where to write the page (default: RUN_DIR/report.html).")
           ) -> None:
    """One HTML page for a search: summary, time per evaluation against the bound, lineage, every candidate, best
    code."""
    from cuco.evolve.rundir import RunDir
    from cuco.report.html import render_report

    rd = RunDir(absolute(run_dir)).readable()
    target = absolute(out) if out else rd.report
    page = render_report(rd)
    try:
        target.write_text(page)
    except OSError as exc:
        raise CucoFailure(str(target), f"cannot write the page: {exc.strerror or exc} (--out writes it elsewhere)") \
            from None
    console.print(f"wrote {target}", highlight=False, markup=False)


@app.command()
def ui(run_dir: Path = typer.Argument(..., help="A run directory of cuco evolve (running or finished)."),
       host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (default: loopback only; "
                                "0.0.0.0 shows the page to the network, with no authentication)."),
       port: int = typer.Option(8765, "--port", help="Port to listen on.")) -> None:
    """The report as a live web page: rebuilt from the store on each request, candidates one click away."""
    from cuco.evolve.rundir import RunDir
    from cuco.report.ui import make_server

    rd = RunDir(absolute(run_dir)).readable()
    try:
        server = make_server(rd, host=host, port=port)
    except (OSError, OverflowError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CucoError("--host/--port", f"cannot listen on {host}:{port}: {why}") from None
    console.print(f"serving {rd} on http://{host}:{server.server_address[1]}/ (Ctrl-C stops)", markup=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _one_line_summaries() -> None:
    """Each command's docstring as one paragraph: its line breaks are the source's width, which typer's rich help
    would keep, breaking the command list mid-sentence; and every command's class is the one that hides <bool>."""
    import inspect

    for info in app.registered_commands:
        info.help = " ".join((info.help or inspect.getdoc(info.callback) or "").split())
        if info.cls in (None, TyperCommand):
            info.cls = _Command


_one_line_summaries()


def main() -> None:
    """Entry point: every error becomes one line and its exit code (ExitCode), never a traceback."""
    if os.environ.get("CUCO_HOME"):  # the runner's processes start elsewhere: the same folder, whatever their cwd
        os.environ["CUCO_HOME"] = str(absolute(os.environ["CUCO_HOME"]))
    try:
        code = app(prog_name="cuco", standalone_mode=False)  # click returns a typer.Exit's code here, not raises
        if isinstance(code, int) and code:
            sys.exit(code)
    except CucoError as exc:
        what = "cuco's own failure: " if isinstance(exc, CucoFailure) else ""
        Console(stderr=True, emoji=False).print(f"[red]error:[/] {what}{escape(str(exc))}", highlight=False,
                                                soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # typer vendors click: match its exceptions by shape, not by class
        if hasattr(exc, "exit_code") and not hasattr(exc, "format_message"):
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        if not hasattr(exc, "format_message"):
            raise
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx else ""
        Console(stderr=True, emoji=False).print(f"[red]error:[/] {escape(where + exc.format_message())}",
                                                highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
