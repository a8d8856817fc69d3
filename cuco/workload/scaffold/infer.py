"""What a workload around a host-driven program looks like, as far as the program shows it.

From the fast path's analysis (which calls touch which buffers, in program order) and the evidence of the
program's calls (evidence.py), each buffer gets a role, a dtype, a shape over named dimensions and whether a
collective touches it; the workload gets its named dimensions with sizes, the bytes each rank must receive and
the flops of its GEMMs. Everything that is a guess carries a note saying what it rests on, for the files' comments.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cuco.fastpath.analyze import Analysis, Op
from cuco.workload.expr import ExprError, eval_expr
from cuco.workload.scaffold.evidence import Evidence, gather
from cuco.workload.scaffold.program import Program, param_name, tidy

RUN_FUNCTION = "cuco_run"  # the candidate ABI's timed entry point (cuco.h)
FULL_SIZE = 4096  # placeholder of a named dimension at the timed shape
SMALL_SIZE = 64  # and at the small one: divisible by any world size up to 64
WORLD = 2  # the scaffold's world size


@dataclass
class Param:
    name: str
    value: int | None  # the program's own value, where it fixes one

    @property
    def full(self) -> int:
        return self.value if self.value is not None else FULL_SIZE

    @property
    def small(self) -> int:
        return self.value if self.value is not None and self.value < SMALL_SIZE else SMALL_SIZE


@dataclass
class Buffer:
    name: str  # the key in [buffers]
    source: str  # the program's name for it
    role: str = "scratch"
    dtype: str = ""
    shape: list[str] = field(default_factory=list)
    symmetric: bool = False
    notes: list[str] = field(default_factory=list)  # what the analysis saw
    todos: list[str] = field(default_factory=list)  # what is a guess or a placeholder


@dataclass
class Scaffold:
    name: str
    program: Path
    abi: bool  # the program has the candidate ABI's entry points (cuco_run)
    params: list[Param]
    buffers: list[Buffer]
    comm_bytes: str
    flops: str  # per rank, from the GEMMs whose sizes the calls spell out
    steps: list[Op]  # the calls of the timed part, in order: what reference.py reproduces
    private: list[str]  # buffers the program allocates for itself (ABI programs: not workload buffers)
    warnings: list[str] = field(default_factory=list)
    bound_todos: list[str] = field(default_factory=list)

    def has_compute(self) -> bool:
        return any(o.kind in ("kernel", "blas") for o in self.steps)


def _key(source: str, taken: set[str]) -> str:
    """A program's buffer name (`d_x`, `s->buf`) as a workload buffer name: its last identifier, unique."""
    base = "".join(c if c.isalnum() or c == "_" else " " for c in source).split()
    name = param_name(base[-1] if base else "buf")
    key, i = name, 2
    while key in taken:
        key, i = f"{name}_{i}", i + 1
    taken.add(key)
    return key


def _events(buf: str, scope: list[Op]) -> list[tuple[Op, bool, bool]]:
    return [(o, buf in o.reads, buf in o.writes) for o in scope if buf in o.reads or buf in o.writes]


def assign_role(b: Buffer, scope: list[Op]) -> None:
    """input: the run reads it before writing it (or fills it from the host); output: its last access writes it,
    or it is copied back to the host; scratch: written, then only read, within the run."""
    events = _events(b.source, scope)
    if not events:
        b.role = "scratch"
        b.todos.append("no call of the timed part touches it: check its role, or remove it")
        return
    op, reads, writes = events[0]
    where = f"{op.name} (line {op.line})"
    if (op.kind == "copy" and writes and not op.reads) or reads:
        b.role = "input"
        from_host = not reads
        b.notes.append(f"filled from the host by {where}: make_inputs gives it instead" if from_host
                       else f"read by {where} before anything writes it")
        later = next((o for o, _, w in events[1 if from_host else 0:] if w), None)
        if later is not None:
            b.todos.append(f"{later.name} (line {later.line}) also writes it: an input is only given, so if the "
                           "program updates it in place, make it an output and copy the input into it first")
    elif any(o.kind == "copy" and r and not o.writes for o, r, _ in events):
        b.role = "output"
        b.notes.append("copied back to the host: a result")
    else:
        last = events[-1]
        b.role = "output" if last[2] else "scratch"
        b.notes.append(f"written last by {last[0].name} (line {last[0].line})" if last[2] else
                       f"written by {where}, then read by {last[0].name} (line {last[0].line}): an intermediate")


def ensure_output(buffers: list[Buffer], scope: list[Op]) -> None:
    """The loader wants an output: without one, the buffer written last in the run is taken for it."""
    if any(b.role == "output" for b in buffers) or not buffers:
        return
    written = [(max(o.index for o, _, w in _events(b.source, scope) if w), b) for b in buffers
               if any(w for _, _, w in _events(b.source, scope))]
    chosen = max(written, key=lambda t: t[0])[1] if written else buffers[-1]
    chosen.role = "output"
    chosen.todos.append("taken as the output because the run writes it last; an output is poisoned before each "
                        "run, so a buffer updated in place needs its input copied in first")


def _fill(b: Buffer, ev: Evidence, collective: set[str]) -> None:
    offer = ev.shape.get(b.source)
    if offer is not None:
        b.shape = list(offer.value)
        b.notes.append(f"shape from {offer.why}")
        if offer.unsure:
            b.todos.append(f"{', '.join(sorted(offer.unsure))}: computed by the program as it runs, not a size it is "
                           "given; write the shape over the workload's named dimensions")
    else:
        b.shape = [f"{b.name}_len"]
        b.todos.append(f"no call shows its size: {b.name}_len is a placeholder dimension; give its shape over the "
                       "named dimensions")
    if b.source in ev.dtype:
        b.dtype = ev.dtype[b.source].value
        b.notes.append(f"dtype from {ev.dtype[b.source].why}")
    b.symmetric = b.source in collective


def _default_dtypes(buffers: list[Buffer]) -> None:
    """A buffer whose type no call shows gets the program's most common one, marked as a guess."""
    known = Counter(b.dtype for b in buffers if b.dtype)
    guess = known.most_common(1)[0][0] if known else "f32"
    for b in buffers:
        if not b.dtype:
            b.dtype = guess
            b.todos.append(f"no call shows its element type: {guess} is a guess")


def _chosen(analysis: Analysis) -> list[str]:
    """The workload's buffers: those the harness hands over (cuco_buffer), else every buffer a call touches."""
    handed = [b for b, alloc in analysis.buffers.items() if alloc == "workload"]
    touched = list(dict.fromkeys(b for o in analysis.ops for b in o.reads + o.writes))
    chosen = handed or list(dict.fromkeys(list(analysis.buffers) + touched))
    order = {b: i for i, b in reversed(list(enumerate(touched)))}
    return sorted(chosen, key=lambda b: order.get(b, len(order)))


def infer(name: str, path: Path, analysis: Analysis, program: Program) -> Scaffold:
    """The scaffold of a workload around the analysed program, with sizes at which it loads."""
    abi = RUN_FUNCTION in program.decls
    scope = [o for o in analysis.ops if o.function == RUN_FUNCTION] if abi else list(analysis.ops)
    chosen = _chosen(analysis)
    ev = gather(analysis, program, scope)
    taken: set[str] = set()
    buffers = [Buffer(_key(b, taken), b) for b in chosen]
    collective = {b for o in analysis.ops if o.kind in ("collective", "p2p") for b in o.reads + o.writes}
    for b in buffers:
        _fill(b, ev, collective)
        assign_role(b, scope)
    _default_dtypes(buffers)
    ensure_output(buffers, scope)
    comm = tidy(" + ".join(f"({t})" for t in ev.received)) if ev.received else "0"
    flops = tidy(" + ".join(f"({f})" for f in ev.flops)) if ev.flops else "0"
    warnings = [] if abi else [(
        f"{path.name} has no {RUN_FUNCTION}(): the runner calls cuco_setup, cuco_run and cuco_teardown (cuco.h) and "
        "hands buffers over with cuco_buffer(ctx, name); wrap the program's work in them before cuco eval")]
    sc = Scaffold(name, path, abi, [], buffers, comm, flops, scope, [b for b in analysis.buffers if b not in chosen],
                  warnings + analysis.warnings, list(ev.uncounted))
    settle(sc, ev.values)
    return sc


def _names(expr: str) -> list[str]:
    return [n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr) if n != "world"]


def _evaluates(exprs: list[str], params: list[Param]) -> str | None:
    """Why the expressions do not evaluate to positive sizes at both of the scaffold's shapes, or None."""
    for env in ({p.name: p.full for p in params}, {p.name: p.small for p in params}):
        for e in exprs:
            try:
                if eval_expr(e, {**env, "world": WORLD}) <= 0:
                    return f"{e} is not positive at {env}"
            except ExprError as exc:
                return str(exc)
    return None


def settle(sc: Scaffold, values: dict[str, int | None]) -> None:
    """The named dimensions the files use, with sizes at which every shape and the bound evaluate; a shape that
    does not (a piece's count, a size that does not divide) becomes a placeholder dimension, marked."""
    def params_for(exprs: list[str]) -> list[Param]:
        return [Param(n, values.get(n)) for n in dict.fromkeys(n for e in exprs for n in _names(e))]

    for b in sc.buffers:
        why = _evaluates(b.shape, params_for(b.shape))
        if why is not None:
            b.todos.append(f"its size from the program ({', '.join(b.shape)}) does not fit the sizes here ({why}); "
                           f"{b.name}_len is a placeholder")
            b.shape = [f"{b.name}_len"]
    shapes = [d for b in sc.buffers for d in b.shape]
    for key in ("comm_bytes", "flops"):
        expr = getattr(sc, key)
        why = _evaluates([expr], params_for(shapes + [expr])) if expr != "0" else None
        if why is not None:
            sc.bound_todos.append(f"{key} from the program ({expr}) does not evaluate here ({why})")
            setattr(sc, key, "0")
    sc.params = params_for(shapes + [sc.comm_bytes, sc.flops])
