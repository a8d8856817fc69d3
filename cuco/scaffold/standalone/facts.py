"""What the original program tells the workload.toml that the seed no longer shows: each buffer's role, shape
and type, the parameters' values, the GEMMs' flops, and the sizes fixed at file scope."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from cuco.dtypes import DTYPES
from cuco.fastpath.analyze import BLAS, COPIES, NCCL_SIGNATURES
from cuco.fastpath.syntax import call_args, callee, text
from cuco.scaffold.infer import Param, Scaffold, mark_root_only, settle
from cuco.scaffold.program import C_TYPES, dims, tidy
from cuco.scaffold.size_expr import MAX_DEPTH, int_literal
from cuco.scaffold.standalone.calls import GEMM_SIZES
from cuco.scaffold.standalone.nodes import calls_in, idents, line_of
from cuco.scaffold.standalone.program import Local
from cuco.scaffold.standalone.seed import Seed
from cuco.scaffold.standalone.sizes import Sizes
from cuco.scaffold.standalone.step import Event
from cuco.workload.spec import VERIFIED


@dataclass
class BufferFact:
    """A workload buffer as the original program shows it."""

    name: str
    var: str  # the program's device pointer
    dtype: str | None
    shape: list[str] | None
    role: str
    notes: list[str] = field(default_factory=list)
    todos: list[str] = field(default_factory=list)


@dataclass
class Conversion:
    """The seed written for a standalone program, and what its main() shows of the workload."""

    source: str
    buffers: dict[str, BufferFact]  # by workload buffer name
    params: dict[str, int | None]  # the parameters cuco_run reads, with the program's values
    flops: str | None  # per rank and run, from the step's GEMMs, where their sizes are the program's
    warnings: list[str] = field(default_factory=list)
    fixed: dict[str, int] = field(default_factory=dict)  # sizes fixed at file scope: constants, never parameters
    reading: list[str] = field(default_factory=list)  # how the program was read (its files, its helpers written out)


def _factors(node) -> list:
    while node.type == "parenthesized_expression" and len(node.named_children) == 1:
        node = node.named_children[0]
    if node.type == "binary_expression" and text(node.child_by_field_name("operator")) == "*":
        return _factors(node.child_by_field_name("left")) + _factors(node.child_by_field_name("right"))
    return [node]


def _role(var: str, events: list[Event], fill: tuple[str, int] | None, to_host: int | None, cite
          ) -> tuple[str, list[str], list[str]]:
    """input: read by the step before it writes it, or filled before the loop and not written by the step first;
    inout: the same, and then written by the step (updated in place); output: copied to the host, or not read again
    after the step writes it; scratch: written, then read, within the step."""
    mine = [e for e in events if e.var == var]
    writes = [e for e in mine if e.mode == "w"]
    if mine and mine[0].mode == "w" and not mine[0].sure and any(e.mode == "r" for e in mine[1:]):
        # written under an `if` (a pipeline stage's receive), then read: where the branch does not run, the step
        # reads what the buffer held before it, so it is delivered, and verified
        read = next(e for e in mine[1:] if e.mode == "r")
        return "inout", [f"written by {mine[0].op} ({cite(mine[0].line)}) only where its `if` holds, then read by "
                         f"{read.op} ({cite(read.line)}): elsewhere the step reads what it held before, so the judge "
                         "gives it fresh for every run and verifies what the run leaves in it"], []
    if (fill is not None and not (mine and mine[0].mode == "w")) or (mine and mine[0].mode == "r"):
        why = (f"filled before the loop by {fill[0]} ({cite(fill[1])}): make_inputs gives it" if fill is not None
               else f"read by {mine[0].op} ({cite(mine[0].line)}) before the step writes it")
        if writes:
            return "inout", [why, f"then written by {writes[0].op} ({cite(writes[0].line)}): updated in place, so the "
                                  "judge gives it fresh for every run and verifies what the run leaves in it"], []
        return "input", [why], []
    if to_host is not None:
        return "output", [f"copied to the host at {cite(to_host)}: the program's result"], []
    first = next((i for i, e in enumerate(mine) if e.mode == "w"), len(mine))
    read_after = [e for e in mine[first + 1:] if e.mode == "r"]
    if read_after and not any(e.sure for e in read_after):  # the last stage of a pipeline keeps what it computed
        return "output", [f"written by {writes[0].op} ({cite(writes[0].line)}), read by {read_after[0].op} "
                          f"({cite(read_after[0].line)}) only where its `if` holds: elsewhere its value leaves the "
                          "step"], [f"if {var} is only a workspace of the step, make it scratch"]
    if read_after and mine[-1].mode == "r":
        reduced = [e for e in writes[1:] if e.op.startswith("nccl")]  # a collective's result, then read
        through = f", then by {reduced[-1].op} ({cite(reduced[-1].line)})" if reduced else ""
        todos = [f"{reduced[-1].op} ({cite(reduced[-1].line)}) leaves its result in it: if the program uses it "
                 "after the step, make it an output"] if reduced else []
        return "scratch", [f"written by {writes[0].op} ({cite(writes[0].line)}){through}, then read by "
                           f"{read_after[-1].op} ({cite(read_after[-1].line)}): an intermediate of the step"], todos
    if read_after:  # updated in place after the step reads it (an in-place all-reduce): its last value leaves
        last = writes[-1]
        return "output", [f"written by {writes[0].op} ({cite(writes[0].line)}), read by {read_after[0].op} "
                          f"({cite(read_after[0].line)}), written last by {last.op} ({cite(last.line)}): its last "
                          "value leaves the step"], [f"if {var} is only a workspace of the step, make it scratch"]
    last = writes[-1] if writes else None
    parts = [f"{last.op} ({cite(last.line)}) writes `{last.part}` only: the rest keeps the judge's poison, so "
             "reference returns NaN there (or give the collective its whole buffer)"] \
        if len(writes) == 1 and last.part else []  # several writes may cover it all between them
    return "output", [f"written last by {last.op} ({cite(last.line)})" if last else "the step does not touch it"
                      ], parts


class Facts:
    """What the original program shows of the workload: each buffer's role, shape and type, the parameters'
    values, the GEMMs' flops."""

    def __init__(self, seed: Seed) -> None:
        self.seed, self.prog, self.sizes = seed, seed.prog, Sizes(seed.prog)

    def dtype(self, ctype: str) -> str | None:
        for _ in range(MAX_DEPTH):
            if ctype not in self.prog.aliases:
                break
            ctype = self.prog.aliases[ctype]
        return C_TYPES.get(" ".join(ctype.replace("const", " ").split()))

    def shape(self, var: str) -> tuple[list[str] | None, str | None, str]:
        """A buffer's shape from its allocation's bytes (`n * sizeof(float)`, or `n * 4` for a float*: n elements of
        f32), and its type."""
        loc, call = self.prog.locals[var], self.seed.locs.allocs.get(var)
        elem = self.dtype(loc.base) if loc.pointers == 1 else None
        if call is None or len(call_args(call)) < 2:
            return None, elem, ""
        size = call_args(call)[1]
        for _ in range(MAX_DEPTH):
            held = self.prog.locals.get(text(size)) if size.type == "identifier" else None
            if held is None or held.kind != "scalar" or held.init is None:
                break
            size = held.init
        factors = _factors(size)
        sizeofs = [f for f in factors if f.type == "sizeof_expression"]
        if not sizeofs and elem is not None:  # `n * 4` for a float*: the element's size written as a number
            sizeofs = [f for f in factors if f.type == "number_literal" and int_literal(text(f)) == DTYPES[elem].size]
        if len(sizeofs) != 1:
            return None, elem, ""
        named = sizeofs[0].child_by_field_name("type")
        dtype = self.dtype(" ".join(text(named).split())) if named is not None else elem
        parts = [self.sizes.expr(f) for f in factors if f is not sizeofs[0]]
        if any(p is None for p in parts):
            return None, dtype or elem, ""
        read = self.params  # a size cuco_run never reads cannot change with the shape: its value stays
        for label, loc in self.sized().items():
            if label not in read and loc.value is not None:
                parts = [re.sub(rf"\b{re.escape(label)}\b", str(loc.value), p) for p in parts]
        shape = dims(tidy(" * ".join(parts) or "1"))
        where = f"{callee(call)} ({self.prog.cite(line_of(call))})"
        return sorted(shape, key=lambda d: d != "world"), dtype or elem, where

    def buffers(self) -> dict[str, BufferFact]:
        fills, to_host = self.fills(), self.to_host()
        out = {}
        for var in self.seed.buffers:
            name = self.seed.names[var]
            shape, dtype, alloc = self.shape(var)
            role, notes, todos = _role(var, self.seed.step.events, fills.get(var), to_host.get(var),
                                       self.prog.cite)
            notes.append(f"the program's {var}" + (f"; shape and type from the bytes of {alloc}" if alloc else ""))
            if var in self.seed.step.from_host:
                at = self.prog.cite(self.seed.step.from_host[var])
                notes.append(f"copied from the host in the step ({at}): left out of cuco_run, where the judge delivers "
                             "each run's inputs instead, inside the timed region")
            out[name] = BufferFact(name, var, dtype, shape, role, notes, todos)
        self.weights(out)
        if out and not any(b.role in VERIFIED for b in out.values()):
            written = [e.var for e in self.seed.step.events if e.mode == "w"]
            chosen = out[self.seed.names[written[-1]]] if written else list(out.values())[-1]
            chosen.role = "output"
            chosen.todos.append("taken as the output because the step writes it last; an output is poisoned before "
                                "each run, so a buffer updated in place needs its input copied in first")
        return out

    def weights(self, facts: dict[str, BufferFact]) -> None:
        """An input only cuBLAS reads, and not along the rows of the GEMM's output (as the activations are), is the
        operand a layer keeps from call to call: its weights, a parameter (drawn once per shape, never timed)."""
        events = self.seed.step.events
        by_var = {f.var: f for f in facts.values()}
        for fact in facts.values():
            mine = [e for e in events if e.var == fact.var]
            if fact.role != "input" or not mine or fact.shape is None or \
                    not all(e.mode == "r" and e.op.startswith("cublas") for e in mine):
                continue
            if fact.var in self.seed.attached:  # a bias or scale the GEMM's descriptor points to
                fact.role = "parameter"
                fact.notes.append(f"attached to the GEMM's descriptor ({self.seed.attached[fact.var][0]}) and read by "
                                  "nothing else: the layer's weights, bound in cuco_setup (make it an input if it "
                                  "changes from run to run)")
                continue
            outputs = [by_var.get(e.var) for r in mine for e in events if e.mode == "w" and (e.op, e.line) ==
                       (r.op, r.line)]
            if not outputs or any(o is None or not o.shape or o.shape[0] in fact.shape for o in outputs):
                continue
            fact.role = "parameter"
            fact.notes.append("only cuBLAS reads it, and not along the rows of the GEMM's output: the layer's weights, "
                              "drawn once per shape and never delivered again (make it an input if it changes from "
                              "run to run)")

    def fills(self) -> dict[str, tuple[str, int]]:
        """The buffers the set-up writes before the loop, and the call that does."""
        out: dict[str, tuple[str, int]] = {}
        devices = self.prog.devices()
        for st in self.seed.place.setup:
            for call in map(self.prog.unwrap, calls_in(st)):
                name, args, kind = callee(call), call_args(call), self.prog.kind(call)
                if kind == "launch":
                    consts = self.prog.kernels.get(name, [])
                    written = [i for i in range(len(args)) if not (i < len(consts) and consts[i])]
                elif kind == "copy":
                    written = [COPIES.get(name, (0,))[0]]
                elif kind == "nccl":
                    written = [NCCL_SIGNATURES[name].index("recv")] if "recv" in NCCL_SIGNATURES[name] else []
                elif kind == "blas":
                    written = list(BLAS.get(name, ((), ()))[1])
                else:
                    continue
                for var in sorted(set().union(*(idents(args[i]) for i in written if i < len(args))) & devices):
                    out.setdefault(var, (name, line_of(call)))
        return out

    def to_host(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for call in map(self.prog.unwrap, calls_in(self.prog.main)):
            if self.prog.kind(call) == "copy" and self.prog.direction(call) == "d2h":
                rpos = COPIES.get(callee(call), (0, 1, None))[1]
                source = call_args(call)[rpos] if rpos is not None and rpos < len(call_args(call)) else None
                for var in sorted(idents(source) & self.prog.devices()):
                    out.setdefault(var, line_of(call))
        return out

    def sized(self) -> dict[str, Local]:
        """main()'s locals that are sizes (kind param), by their workload names."""
        return {self.prog.param_label(n): loc for n, loc in self.prog.locals.items() if loc.kind == "param"}

    @cached_property
    def params(self) -> dict[str, int | None]:
        """The parameters cuco_run reads, by their workload names, with the program's values."""
        held = self.seed.run_locals + self.seed.setup_locals
        locs = {loc.name: loc for loc in held + [f for loc in held for f in self.seed.bound_fields(loc)]
                if loc.kind == "param"}
        return {self.prog.param_label(n): loc.value for n, loc in sorted(locs.items(), key=lambda kv: kv[1].order)}

    def flops(self) -> str | None:
        """2 m n k per GEMM of the step, over the workload's parameters; None where a GEMM's sizes are not."""
        terms = []
        for call, nested in self.seed.step.gemms:
            sizes = [self.sizes.expr(call_args(call)[i]) for i in GEMM_SIZES[callee(call)]]
            if nested or any(s is None for s in sizes):
                return None
            terms.append(f"2 * {' * '.join(f'({s})' for s in sizes)}")
        return tidy(" + ".join(terms)) if terms else None


def _in_seed(words: str) -> str:
    """`scale (line 28)`, of the seed the analysis read, as `scale (seed.cu:28)`."""
    return re.sub(r"\(line (\d+)\)", r"(seed.cu:\1)", words)


def refine(sc: Scaffold, conv: Conversion) -> None:
    """The scaffold of the converted seed, told what the original program shows and the seed no longer does: each
    buffer's role (the set-up's fills, the copies to the host), shape and type (its allocation), the GEMMs' flops
    and the sizes the program fixes. What the original settles is no longer a guess."""
    # what the analysis of the seed says cites the seed's lines: named as seed.cu's, beside original.cu's
    sc.bound_todos = {k: [_in_seed(t) for t in v] for k, v in sc.bound_todos.items()}
    sc.determinism_todos = [_in_seed(t) for t in sc.determinism_todos]
    for b in sc.buffers:
        b.notes = [_in_seed(n) for n in b.notes]
        b.todo = {k: [_in_seed(t) for t in v] for k, v in b.todo.items()}
        fact = conv.buffers.get(b.source)
        if fact is None:
            continue
        whole = fact.dtype is not None and fact.shape is not None
        b.notes = fact.notes + ([] if whole else b.notes)
        b.role = fact.role
        b.todo.pop("role", None)
        if fact.todos:
            b.todo["role"] = list(fact.todos)
        if fact.dtype is not None:
            b.dtype = fact.dtype
            b.todo.pop("dtype", None)
        if fact.shape is not None:
            b.shape = list(fact.shape)
            b.todo.pop("shape", None)
    if conv.flops is not None and sc.flops == "0":
        sc.flops = conv.flops
    for name, value in conv.fixed.items():  # the seed cannot change them: the bound holds their values
        sc.comm_bytes, sc.flops = (re.sub(rf"\b{re.escape(name)}\b", str(value), e) for e in (sc.comm_bytes, sc.flops))
        for b in sc.buffers:
            b.shape = [re.sub(rf"\b{re.escape(name)}\b", str(value), d) for d in b.shape]
    values = {p.name: p.value for p in sc.params}
    values.update({k: v for k, v in conv.params.items() if v is not None})
    settle(sc, values)
    have = {p.name for p in sc.params}
    sc.params += [Param(n, values.get(n)) for n in conv.params if n not in have]
    sc.warnings += conv.warnings
    mark_root_only(sc)  # the program's roles replaced the seed's, and their notes with them
