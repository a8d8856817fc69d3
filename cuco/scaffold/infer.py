"""What a workload around a host-driven program looks like, as far as the program shows it.

From the program's calls in order (evidence.steps: the fast path's analysis, with each kernel's reads and writes
from its body) and what they say about sizes and types (evidence.gather), each buffer gets a role, a dtype, a shape
over named dimensions and whether a collective touches it; the workload gets the parameters the program reads, the
bytes each rank must receive and the flops of its GEMMs. Every value rests on the code or carries a TODO saying
what it rests on instead, per key, for the files' comments.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from cuco.fastpath.analyze import Analysis, Op
from cuco.fastpath.peer_loops import proven
from cuco.scaffold.evidence import SMALL_SIZE, Evidence, Product, Steps, gather, same, steps
from cuco.scaffold.kernel_access import uses_atomics
from cuco.scaffold.program import Program
from cuco.scaffold.size_expr import param_name, tidy
from cuco.workload.expr import ExprError, eval_expr
from cuco.workload.spec import VERIFIED

RUN_FUNCTION = "cuco_run"  # the candidate ABI's timed entry point (cuco.h)
FULL_SIZE = 4096  # placeholder of a named dimension at the timed shape
WORLD = 2  # the scaffold's world size
RUNTIME_PREFIXES = ("cuda", "nccl")  # calls of the CUDA runtime and NCCL: they move data, they compute nothing


def computes(op: Op) -> bool:
    """A step that may compute: a kernel, a GEMM, a call the rules do not follow (but the runtime's and NCCL's)."""
    return op.kind in ("kernel", "blas") or (op.kind == "call" and not op.name.startswith(RUNTIME_PREFIXES))


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
    todo: dict[str, list[str]] = field(default_factory=dict)  # key (role, dtype, shape) -> what is a guess

    def guess(self, key: str, why: str) -> None:
        self.todo.setdefault(key, []).append(why)


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
    bound_todos: dict[str, list[str]] = field(default_factory=dict)  # flops / comm_bytes -> what is missing
    read: list[str] = field(default_factory=list)  # the parameters the program reads (cuco_param)
    determinism_todos: list[str] = field(default_factory=list)  # why two runs may not agree bit for bit
    products: list[Product] = field(default_factory=list)  # the run's GEMMs as torch.matmul on whole buffers

    def has_compute(self) -> bool:
        return any(computes(o) for o in self.steps)

    @property
    def placeholders(self) -> list[str]:
        """Named dimensions the program does not read: sizes it fixes, or placeholders marked TODO."""
        return [p.name for p in self.params if p.name not in self.read and p.value is None]


@dataclass
class Event:
    op: Op
    reads: bool
    writes: bool
    guess: str | None  # why the access is assumed, not seen


def _key(source: str, taken: set[str], exact: bool) -> str:
    """A program's buffer name as a workload buffer name: the name it looks up (ABI), else the last identifier of
    `d_x`, `s->buf`, unique."""
    if exact:
        taken.add(source)
        return source
    base = "".join(c if c.isalnum() or c == "_" else " " for c in source).split()
    name = param_name(base[-1] if base else "buf")
    key, i = name, 2
    while key in taken:
        key, i = f"{name}_{i}", i + 1
    taken.add(key)
    return key


def _events(buf: str, scope: list[Op], guessed: dict[tuple[int, str], str]) -> list[Event]:
    return [Event(o, buf in o.reads, buf in o.writes, guessed.get((o.index, buf))) for o in scope
            if buf in o.reads or buf in o.writes]


def _role(b: Buffer, events: list[Event]) -> None:
    first = events[0]
    where = f"{first.op.name} (line {first.op.line})"
    from_host = first.op.kind == "copy" and first.writes and not first.op.reads
    if from_host or first.reads:
        b.role = "input"
        b.notes.append(f"filled from the host by {where}: make_inputs gives it instead" if from_host
                       else f"read by {where} before anything writes it")
        if all(e.op.kind == "blas" and not e.writes for e in events):
            # Read by cuBLAS alone, never communicated: the operand a layer keeps from call to call.
            b.role = "parameter"
            b.guess("role", "only a GEMM reads it, so it is taken for weights (drawn once per shape, never changed); "
                            "make it an input if it changes from run to run")
        later = next((e for e in events[1 if from_host else 0:] if e.writes and not e.guess), None)
        if later is not None:
            b.role = "inout"
            b.notes.append(f"then written by {later.op.name} (line {later.op.line}): updated in place, so the judge "
                           "gives it fresh for every run and verifies what the run leaves in it")
    elif any(e.op.kind == "copy" and e.reads and not e.op.writes for e in events):
        b.role = "output"
        b.notes.append("copied back to the host: a result")
    else:
        last = events[-1]
        b.role = "output" if last.writes else "scratch"
        b.notes.append(f"written last by {last.op.name} (line {last.op.line})" if last.writes else
                       f"written by {where}, then read by {last.op.name} (line {last.op.line}): an intermediate")


def assign_role(b: Buffer, scope: list[Op], guessed: dict[tuple[int, str], str] | None = None) -> None:
    """input: the run reads it before writing it (or fills it from the host); output: its last access writes it,
    or it is copied back to the host; scratch: written, then only read, within the run. A role that rests on an
    access the rules assume rather than see is marked."""
    events = _events(b.source, scope, guessed or {})
    if not events:
        b.role = "scratch"
        b.guess("role", "no call of the timed part touches it: check its role, or remove it")
        return
    _role(b, events)
    guesses = list(dict.fromkeys(e.guess for e in events if e.guess))
    if guesses:
        b.guess("role", f"{b.role} rests on a guess: " + "; ".join(guesses))


def ensure_output(buffers: list[Buffer], scope: list[Op]) -> None:
    """The loader wants an output: without one, the buffer written last in the run is taken for it."""
    if any(b.role in VERIFIED for b in buffers) or not buffers:
        return
    written = [(max(o.index for o in scope if b.source in o.writes), b) for b in buffers
               if any(b.source in o.writes for o in scope)]
    chosen = max(written, key=lambda t: t[0])[1] if written else buffers[-1]
    chosen.role = "output"
    chosen.todo["role"] = ["taken as the output because the run writes it last (the workload needs one); an output "
                           "is poisoned before each run, so a buffer updated in place needs its input copied in first"]


def _placeholder(name: str) -> str:
    """A placeholder dimension for a buffer's size: a name of the expression language."""
    base = re.sub(r"\W", "_", name)
    return param_name(base if base[:1].isalpha() or base[:1] == "_" else f"b_{base}") + "_len"


def _fill_shape(b: Buffer, ev: Evidence) -> None:
    offer = ev.best(ev.shape, b.source)
    if offer is None:
        b.shape = [_placeholder(b.name)]
        b.guess("shape", f"no call shows its size: {b.shape[0]} is a placeholder dimension; give its shape over the "
                         "named dimensions")
        return
    b.shape = list(offer.value)
    b.notes.append(f"shape from {offer.why}")
    if offer.unsure:
        b.guess("shape", f"{', '.join(sorted(offer.unsure))}: not a size the program is given (cuco_param) as far as "
                         "the rules can follow; write the shape over the workload's named dimensions")
    mine = " * ".join(f"({d})" for d in offer.value)
    for other in ev.shape.get(b.source, []):
        if not same(" * ".join(f"({d})" for d in other.value), mine) and not (other.unsure or offer.unsure):
            b.guess("shape", f"{other.why} says {other.value}: check which is right")


def _fill_dtype(b: Buffer, ev: Evidence) -> None:
    offer = ev.best(ev.dtype, b.source)
    if offer is None:
        return
    b.dtype = offer.value
    b.notes.append(f"dtype from {offer.why}")
    others = list(dict.fromkeys(f"{o.value} by {o.why}" for o in ev.dtype[b.source] if o.value != offer.value))
    if others:
        b.guess("dtype", f"{offer.value} by {offer.why}, but {'; '.join(others)}: check which is right")


def _default_dtypes(buffers: list[Buffer]) -> None:
    """A buffer whose type no call shows gets the program's most common one, marked as a guess."""
    known = Counter(b.dtype for b in buffers if b.dtype)
    guess = known.most_common(1)[0][0] if known else "f32"
    for b in buffers:
        if not b.dtype:
            b.dtype = guess
            b.guess("dtype", f"no call or pointer type shows its element type: {guess} is a guess")


def _chosen(analysis: Analysis, program: Program, abi: bool, ops: list[Op]) -> list[str]:
    """The workload's buffers: the names the program looks up (cuco_buffer), else every buffer it allocates
    itself or its functions are passed, in the order the calls first touch them."""
    if abi:
        return list(program.handed)
    touched = list(dict.fromkeys(b for o in ops for b in o.reads + o.writes))
    allocated = [b for b, alloc in analysis.buffers.items() if alloc != "workload"] + sorted(program.allocated)
    passed = set().union(*program.passed.values()) if program.passed else set()
    chosen = list(dict.fromkeys(b for b in touched + allocated + list(analysis.buffers)
                                if b in program.allocated or b in allocated or b in passed))
    order = {b: i for i, b in reversed(list(enumerate(touched)))}
    return sorted(chosen, key=lambda b: order.get(b, len(order)))


def _bound_todos(ev: Evidence, scope: list[Op]) -> dict[str, list[str]]:
    """What the bound's flops and comm_bytes leave out: costs the rules cannot count, and computation that is not a
    GEMM they read."""
    out: dict[str, list[str]] = {}
    for line in ev.uncounted:
        key, why = line.split(": ", 1)
        out.setdefault(key, []).append(why)
    for o in scope:
        if computes(o) and o.kind != "blas":
            out.setdefault("flops", []).append(f"{o.name} (line {o.line}) computes what the rules do not count; "
                                               "add its flops, if it has any")
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


MAX_TERMS = 64  # distinct terms a bound sums (the calls of a step, alike ones counted once with their number)


def _total(terms: list[str]) -> str | None:
    """A bound's sum over the step's calls, the same term written once with how many times it stands (a step of a
    hundred alike all-reduces is `100 * (...)`, not a hundred terms); None past MAX_TERMS different terms."""
    counted = Counter(terms)
    if len(counted) > MAX_TERMS:
        return None
    return tidy(" + ".join(f"({t})" if n == 1 else f"{n} * ({t})" for t, n in counted.items())) if counted else "0"


def root_only(sc: Scaffold) -> dict[str, tuple[Op, str]]:
    """Outputs an ncclReduce writes last, by buffer name, with that call and its root: NCCL writes them on the root
    only, so on every other rank they keep the judge's poison."""
    out = {}
    for b in sc.buffers:
        last = [o for o in sc.steps if b.source in o.writes][-1:]
        if b.role == "output" and last and last[0].name == "ncclReduce":
            out[b.name] = (last[0], last[0].args.get("root", "0"))
    return out


def mark_root_only(sc: Scaffold) -> None:
    roots = root_only(sc)
    for b in sc.buffers:
        if b.name in roots:
            op, root = roots[b.name]
            b.guess("role", f"{op.name} (seed.cu:{op.line}) writes it on rank {root} only: on the other ranks it "
                            "keeps the judge's poison, so reference returns NaN there (the judge checks it was left "
                            "untouched)")


def _exchanges(scope: list[Op], every_peer: dict) -> list[Op]:
    """The run's calls, the send and receive of a loop over every peer read as the one all-to-all they are."""
    out = []
    for o in scope:
        if o.index not in every_peer:
            out.append(o)
        elif o.name == "ncclSend":
            recv = next((r for r in scope if r.name == "ncclRecv" and every_peer.get(r.index) is every_peer[o.index]),
                        None)
            if recv is None:  # the loop's receive is outside the run: the send is read as the call it is
                out.append(o)
                continue
            out.append(replace(o, kind="collective", name="ncclAlltoAll", writes=recv.writes,
                               args={**o.args, "recv": every_peer[o.index].recv}))
    return out


def _atomics(program: Program, scope: list[Op]) -> list[str]:
    """The run's kernels that accumulate with atomics: their results may differ in the last bits run to run."""
    return [f"{o.name} (line {o.line}) accumulates with atomics: if two runs can differ in the last bits, "
            '"tolerance"' for o in scope if o.kind == "kernel" and o.name in program.kernels
            and uses_atomics(program.functions[o.name], program.kernels[o.name])]


def infer(name: str, path: Path, analysis: Analysis, program: Program) -> Scaffold:
    """The scaffold of a workload around the analysed program, with sizes at which it loads."""
    abi = RUN_FUNCTION in program.functions
    found: Steps = steps(analysis, program)
    scope = [o for o in found.ops if o.function == RUN_FUNCTION] if abi else list(found.ops)
    chosen = _chosen(analysis, program, abi, found.ops)
    every_peer = proven(analysis)
    ev = gather(found.ops, program, {o.index for o in scope}, set(every_peer))
    taken: set[str] = set()
    buffers = [Buffer(_key(b, taken, abi), b) for b in chosen]
    collective = {b for o in found.ops if o.kind in ("collective", "p2p") for b in o.reads + o.writes}
    for b in buffers:
        _fill_shape(b, ev)
        _fill_dtype(b, ev)
        b.symmetric = b.source in collective
        if not b.symmetric:
            b.guess("symmetric", "no collective touches it in the program; true if a device-initiated version is to "
                                 "reach it on a peer (it is then allocated in a window)")
        assign_role(b, scope, found.guessed)
    _default_dtypes(buffers)
    ensure_output(buffers, scope)
    totals = {"comm_bytes": _total(ev.received), "flops": _total(ev.flops)}
    comm, flops = totals["comm_bytes"] or "0", totals["flops"] or "0"
    warnings = [] if abi else [(
        f"{path.name} has no {RUN_FUNCTION}(): the runner calls cuco_setup, cuco_run and cuco_teardown (cuco.h) and "
        "hands buffers over with cuco_buffer(ctx, name); wrap the program's work in them before cuco eval")]
    private = [b for b in dict.fromkeys(list(analysis.buffers) + sorted(program.allocated))
               if b not in chosen and (b in program.allocated or analysis.buffers.get(b) != "workload")]
    sc = Scaffold(name, path, abi, [], buffers, comm, flops, _exchanges(scope, every_peer), private,
                  warnings + analysis.warnings,
                  _bound_todos(ev, scope), [p for p in program.read_params if p.isidentifier()],
                  _atomics(program, scope), ev.products)
    for key in (k for k, total in totals.items() if total is None):
        sc.bound_todos.setdefault(key, []).append(f"the step's calls give more than {MAX_TERMS} different terms, more "
                                                  "than cuco sums; add what the step costs per run")
    settle(sc, ev.values)
    mark_root_only(sc)
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


def _floor(expr: str) -> str:
    """The expression with C's integer division, which rounds down."""
    return re.sub(r"(?<!/)/(?!/)", "//", expr)


def settle(sc: Scaffold, values: dict[str, int | None]) -> None:
    """The named dimensions: every parameter the program reads, then the others the files use, with sizes at which
    every shape and the bound evaluate; a shape that does not (a piece's count, a size that does not divide)
    becomes a placeholder dimension, marked."""
    def params_for(exprs: list[str]) -> list[Param]:
        return [Param(n, values.get(n)) for n in dict.fromkeys(sc.read + [n for e in exprs for n in _names(e)])]

    for b in sc.buffers:
        why = _evaluates(b.shape, params_for(b.shape))
        floor = [_floor(d) for d in b.shape]
        if why is not None and floor != b.shape and _evaluates(floor, params_for(floor)) is None:
            b.notes.append(f"its size divides as C's integers do, rounding down: {', '.join(floor)}")
            b.shape, why = floor, None
        if why is not None:
            b.guess("shape", f"its size from the program ({', '.join(b.shape)}) does not fit the sizes here ({why}); "
                             f"{_placeholder(b.name)} is a placeholder")
            b.shape = [_placeholder(b.name)]
    shapes = [d for b in sc.buffers for d in b.shape]
    for key in ("comm_bytes", "flops"):
        expr = getattr(sc, key)
        why = _evaluates([expr], params_for(shapes + [expr])) if expr != "0" else None
        if why is not None and _evaluates([_floor(expr)], params_for(shapes + [_floor(expr)])) is None:
            expr, why = _floor(expr), None
            setattr(sc, key, expr)
        if why is not None:
            sc.bound_todos.setdefault(key, []).append(f"{key} from the program ({expr}) does not evaluate here "
                                                      f"({why})")
            setattr(sc, key, "0")
    sc.params = params_for(shapes + [sc.comm_bytes, sc.flops])
