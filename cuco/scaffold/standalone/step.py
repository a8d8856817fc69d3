"""The step read statement by statement: what cuco_run keeps, what its calls do to the device buffers, and the
refusal of a step that is not the same on every iteration or waits for the device."""

from __future__ import annotations

from dataclasses import dataclass

from cuco.errors import CucoError
from cuco.fastpath.analyze import BLAS, COPIES, GEMM_BETA, NCCL_SIGNATURES, zero_scalar
from cuco.fastpath.syntax import call_args, callee, text, walk
from cuco.scaffold.c_expr import LOOPS
from cuco.scaffold.declarations import parameters
from cuco.scaffold.kernel_access import param_access
from cuco.scaffold.size_expr import MAX_DEPTH
from cuco.scaffold.standalone.calls import GEMM_SIZES, WORK
from cuco.scaffold.standalone.nodes import address_of, idents, line_of, names_in, root_name
from cuco.scaffold.standalone.place import Place, loop_counters
from cuco.scaffold.standalone.program import Standalone, declarators
from cuco.scaffold.standalone.render import step_lines

JUMPS = ("return_statement", "break_statement", "continue_statement", "goto_statement")
PURE = frozenset({"min", "max", "std::min", "std::max", "abs", "std::abs", "fmin", "fmax", "fminf", "fmaxf"})


SWAPS = frozenset({"swap", "exchange", "iter_swap"})  # std:: functions that change the variables they are given


@dataclass
class Event:
    """A buffer read ("r") or written ("w") by a call."""

    var: str
    mode: str
    op: str
    line: int
    sure: bool = True  # False for a call under an `if`: on some ranks or runs it may not happen
    part: str = ""  # a collective's buffer given at an offset (`y + prefix`): the expression, where it is one


class Step:
    """One iteration of the step, statement by statement: what cuco_run keeps, what each kept call does to the
    device buffers, and a refusal for what cannot be kept."""

    def __init__(self, prog: Standalone, varying: dict[str, int]) -> None:
        self.prog = prog
        self.varying = dict(varying)  # name -> the line where the step or its loop changes it
        self.tainted: dict[str, int] = {}  # host name -> the line where it was copied from the device
        self.dropped: set[int] = set()  # ids of the statements left out
        self.decls: list[tuple[object, set[str], set[str]]] = []  # the step's declarations, names, names used
        self.uses: list[tuple[object, set[str]]] = []  # kept statements and headers, with the names they use
        self.declared: set[str] = set()
        self.counters: set[str] = set()  # of loops inside the step: they start over on every iteration
        self.alias: dict[str, set[str]] = {}  # the step's pointers into device buffers
        self.events: list[Event] = []
        self.operands: set[str] = set()  # device pointers the step's work reads or writes as data
        self.counts: list = []  # the NCCL calls' count arguments
        self.from_host: dict[str, int] = {}  # device buffer -> the line of the step's copy into it from the host
        self.left: list[tuple[int, str]] = []  # the host's calls the step leaves to the runner (syncs, copies, prints)
        self.gemms: list = []  # (call, inside an inner loop)
        self.nccl = False
        self.depth = 0
        self.branches = 0  # `if` statements the statement being read stands in
        self.refusals: list[CucoError] = []  # every statement that cannot be kept, so that one run names them all

    def read(self, statements: list) -> list:
        for st in statements:
            self.statement(st)
        self.live()
        self.check_uses()
        return [st for st in statements if st.id not in self.dropped]

    def statement(self, st) -> bool:
        try:
            keep = self.dispatch(st)
        except CucoError as exc:  # a blocker: recorded, the statement left out, the reading goes on
            self.refusals.append(exc)
            keep = False
        if not keep:
            self.dropped.add(st.id)
        return keep

    def dispatch(self, st) -> bool:
        if st.type == "comment":
            return False
        if st.type == "compound_statement":
            return any([self.statement(c) for c in st.named_children])
        if st.type == "declaration":
            return self.declaration(st)
        if st.type == "expression_statement":
            return self.expression(st)
        if st.type == "if_statement":
            return self.branch(st)
        if st.type in LOOPS:
            return self.loop(st)
        if st.type in ("break_statement", "continue_statement") and self.depth > 0:
            return True  # of a loop inside the step (the peers of an exchange): the step still runs whole
        if st.type in JUMPS:
            raise self.prog.refuse(st, "leaves the step early: every call of cuco_run runs the whole step (the "
                                       "runner decides how many run)")
        if self.prog.works(st):
            raise self.prog.refuse(st, "issues device work inside a statement cuco does not take apart")
        self.mark_writes(st)
        return False

    def declaration(self, st) -> bool:
        if self.prog.works(st):
            raise self.prog.refuse(st, "issues device work inside a declaration: write the call as a statement of "
                                       "its own (CHECK(call);)")
        names = {loc.name for loc in declarators(st, self.prog.src)}
        refs = idents(st) - names
        for name in names:
            self.follow(name, refs)
        self.declared |= names
        self.decls.append((st, names, refs))
        return True

    def follow(self, name: str, refs: set[str]) -> None:
        """A name computed from host data copied from the device, or from a counter, is tainted or varying too."""
        tainted = sorted(refs & set(self.tainted))
        varying = sorted(refs & set(self.varying))
        if tainted:
            self.tainted[name] = self.tainted[tainted[0]]
        if varying:
            self.varying[name] = self.varying[varying[0]]
        pointed = set().union(*(self.alias.get(r, {r} & self.prog.devices()) for r in refs)) if refs else set()
        if pointed:
            self.alias[name] = pointed

    def expression(self, st) -> bool:
        expr = next((c for c in st.named_children if c.type != "comment"), None)
        if expr is None:
            return False
        if expr.type == "call_expression":
            return self.call(st, expr)
        if self.prog.works(expr):
            raise self.prog.refuse(st, "issues device work inside an expression cuco does not take apart: write the "
                                       "call as a statement of its own (CHECK(call);)")
        if self.local_update(st):
            return True
        self.mark_writes(expr)
        return False

    def local_update(self, st) -> bool:
        """A host statement that only changes locals the step itself declares (`blocks = std::min(blocks, 65535);`,
        `if (blocks > 65535) blocks = 65535;` in a launcher written out in place): computed alike on every
        iteration, kept as written where a kept statement uses what it changes."""
        targets = set()
        for n in walk(st):
            if n.type in ("assignment_expression", "update_expression"):
                target = n.child_by_field_name("left") or n.child_by_field_name("argument")
                if target is None or target.type != "identifier" or text(target) not in self.declared:
                    return False
                targets.add(text(target))
            elif (n.type == "call_expression" and callee(n) not in PURE) or n.type in JUMPS:
                return False
        if not targets:
            return False
        for name in targets:
            self.follow(name, idents(st))
        self.decls.append((st, targets, idents(st)))
        return True

    def call(self, st, expr) -> bool:
        call = self.prog.unwrap(expr)
        kind, name = self.prog.kind(call), callee(call)
        if kind == "host_fn" and self.prog.issues_work(name):
            scope, last = name.split("<")[0].rpartition("::")[0], name.rpartition("::")[2]
            why = self.prog.unit.unwritten.get(name, "is not called as a statement of main() (cuco writes out one "
                                                     "level of the program's helpers, where main() calls them)")
            if scope and name not in self.prog.functions:
                where = self.prog.scope_of(name)
                why = (f"is called by its qualified name, in {where}: cuco writes out the program's helpers that "
                       f"main() calls by their own name (`using namespace {scope};`, then `{last}(...)`)"
                       if where.startswith("namespace") else
                       f"is a static method of {where}: cuco writes out the program's functions, not its classes' "
                       "methods (make it a function)")
            raise self.prog.refuse(st, f"calls {name}(), a function of the program that issues device work and "
                                       f"that cuco cannot write out in place: it {why}; write its calls into the loop")
        if kind == "host" and name in self.prog.undefined:
            raise self.prog.refuse(st, f"calls {name}(), which the program declares "
                                       f"({self.prog.at(self.prog.undefined[name])}) but none of the files given "
                                       "defines: cuco cannot see whether it issues device work; give the file that "
                                       "defines it too (--from)")
        if name in self.prog.lambdas and self.prog.works(self.prog.lambdas[name]):
            raise self.prog.refuse(st, f"calls {name}(), a lambda of main() that issues device work: cuco writes out "
                                       "the program's own functions where main() calls them, not lambdas; make it a "
                                       "function of what it uses, or write its calls into the loop")
        method = self.prog.method(call)
        if method is not None and self.prog.issues_work(method[0]):
            what = f"a function object ({method[1]}::operator())" if method[0] == "operator()" else \
                f"a method of {method[1]}"
            raise self.prog.refuse(st, f"calls {name}(), {what} that issues device work: cuco "
                                       "writes out the program's own functions where main() calls them, not the "
                                       "methods of its classes; make it a function of what it uses, or write its "
                                       "calls into the loop")
        if call is expr and self.prog.works(expr) and kind not in WORK | {"copy"}:
            raise self.prog.refuse(st, "issues device work through a call cuco does not take apart: write the call as "
                                       "a statement of its own, or in a check macro of one argument (CHECK(call);)")
        if kind in ("launch", "nccl", "blas", "check") or (kind == "blas_config" and name != "cublasSetStream"):
            self.keep_call(st, call, kind)
            return True
        if kind == "copy":
            return self.copy(st, call)
        refusals = {"memory": "allocates or frees memory in the step: cuco_run may not; do it once, before the loop",
                    "blas_setup": "creates or destroys a cuBLAS handle in the step: do it once, before the loop",
                    "graph_launch": "launches a CUDA graph inside the step: cuco takes a graph's captured region as "
                                    "the step"}
        if name in ("cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cudaLaunchKernelExC", "cuLaunchKernel"):
            raise self.prog.refuse(st, f"launches a kernel through {name}: cuco reads what a kernel does from a "
                                       "launch written kernel<<<grid, block, shared, stream>>>(args); write it so")
        if kind in refusals or kind in ("nccl_admin", "cuda"):
            raise self.prog.refuse(st, refusals.get(kind, f"{name} in the step: cuco does not know whether it "
                                                          "belongs to cuco_setup, cuco_run or the runner"))
        given = sorted(set().union(*(self.devices_in(a) for a in call_args(call)))) \
            if kind in ("mpi", "host") and not name.endswith("swap") else []  # a swap of buffers: refused below
        if given:  # never left out silently: what it does to the buffers is the step's work
            raise self.prog.refuse(st, f"gives {', '.join(given)} to {name}(), which cuco does not see into (a "
                                       "function pointer, a call through ::, parentheses or std::invoke, CUDA-aware "
                                       "MPI): write the work it does into the loop, or call the program's function "
                                       "by its own name")
        if kind in ("sync", "mpi", "host", "host_fn"):
            self.left.append((line_of(call), name))
        self.mark_writes(expr)
        return False

    def copy(self, st, call) -> bool:
        way = self.prog.direction(call)
        if way in ("d2d", "set"):
            self.keep_call(st, call, "copy")
            return True
        self.left.append((line_of(call), f"{callee(call)} ({'to' if way == 'd2h' else 'from'} the host)"))
        if way == "d2h":
            target = root_name(call_args(call)[0]) if call_args(call) else None
            if target is not None:
                self.tainted[target] = line_of(call)
        if way == "h2d" and call_args(call):  # the judge delivers the inputs in its place
            for var in self.devices_in(call_args(call)[0]):
                self.from_host.setdefault(var, line_of(call))
        return False

    def mark_writes(self, node) -> None:
        """Host names a dropped statement changes: copied from the device, or changed from one iteration to the
        next; a later kept statement that uses one is refused."""
        for n in walk(node):
            if n.type == "call_expression":
                call = self.prog.unwrap(n)
                if self.prog.kind(call) == "copy" and self.prog.direction(call) == "d2h" and call_args(call):
                    self.tainted.setdefault(root_name(call_args(call)[0]) or "", line_of(call))
                elif self.prog.kind(call) in ("mpi", "host", "host_fn"):
                    # what a call is given by address changes; std::swap and its kind take their arguments by
                    # reference (ping-pong buffers swapped at the end of each iteration)
                    swaps = callee(call).split("::")[-1] in SWAPS
                    changed = map(root_name if swaps else address_of, call_args(call))
                    for name in filter(None, changed):
                        self.varying.setdefault(name, line_of(call))
            elif n.type in ("assignment_expression", "update_expression"):
                target = n.child_by_field_name("left") or n.child_by_field_name("argument")
                name = root_name(target) if target is not None else None
                if name is not None:
                    self.varying.setdefault(name, line_of(n))
                    value = n.child_by_field_name("right")
                    if value is not None and idents(value) & set(self.tainted):
                        self.tainted.setdefault(name, line_of(n))

    def branch(self, st) -> bool:
        """An `if` without device work is a check or a print, left out; one with device work is kept only where
        its condition is the same on every iteration and known without waiting for the device."""
        if not self.prog.works(st):
            if self.local_update(st):
                return True
            self.left.append((line_of(st), f"`{self.prog.head(st)}` and its host work"))
            self.mark_writes(st)
            return False
        refs = idents(st.child_by_field_name("condition"))
        self.fixed(st, refs, "decides on the host, in the middle of the step, from device data ({name}, copied to "
                             "the host at {line}): cuco_run may not wait for the device; make the decision on "
                             "the device, in a kernel")
        self.uses.append((st.child_by_field_name("condition"), refs))
        self.branches += 1
        self.statement(st.child_by_field_name("consequence"))
        other = st.child_by_field_name("alternative")
        if other is not None and not self.statement(next(c for c in other.named_children if c.type != "comment")):
            self.dropped.add(other.id)
        self.branches -= 1
        return True

    def loop(self, st) -> bool:
        """A loop inside the step with device work is part of the step (over layers, say): kept, if its bounds are
        the same on every iteration."""
        if not self.prog.works(st):
            self.mark_writes(st)
            return False
        header = [st.child_by_field_name(f) for f in ("initializer", "condition", "update", "right")]
        refs = set().union(*(idents(h) for h in header if h is not None))
        counters = set(loop_counters(st))
        self.fixed(st, refs - counters, "runs as many times as device data says ({name}, copied to the host at "
                                        "{line}): cuco_run may not wait for the device")
        self.declared |= counters
        self.counters |= counters
        self.uses.append((st, refs - counters))
        self.depth += 1
        self.statement(st.child_by_field_name("body"))
        self.depth -= 1
        return True

    def fixed(self, st, refs: set[str], tainted_why: str) -> None:
        tainted = sorted(refs & set(self.tainted))
        if tainted:
            raise self.prog.refuse(st, tainted_why.format(name=tainted[0], line=self.prog.at(self.tainted[tainted[0]])))
        varying = sorted(refs & set(self.varying))
        if varying:
            raise self.prog.refuse(st, f"depends on {varying[0]}, which changes from one iteration to the next "
                                       f"({self.prog.at(self.varying[varying[0]])}): every call of cuco_run must "
                                       "issue the same work")

    def devices_in(self, node, depth: int = 0) -> set[str]:
        """The device buffers an argument points into, through the pointers the step or the set-up derive."""
        found = set()
        for name in names_in(node):
            loc = self.prog.locals.get(name)
            if name in self.alias:
                found |= self.alias[name]
            elif name in self.declared:
                continue
            elif name in self.prog.devices():
                found.add(name)
            elif loc is not None and loc.kind == "scalar" and loc.pointers and depth < MAX_DEPTH:
                found |= self.devices_in(loc.init, depth + 1)
        return found

    def keep_call(self, st, call, kind: str) -> None:
        """A kept call, and what it reads and writes: a kernel of the program's what its body does through each
        pointer (a load and a store: read, then written), one it does not define writes through its non-const
        pointers."""
        name, args, line = callee(call), call_args(call), line_of(call)
        self.uses.append((st, idents(st)))
        if kind == "launch":
            fn = self.prog.functions.get(name)
            if fn is not None:
                uses = param_access(fn, parameters(fn))
                modes = ["" if a is None else "r" * a.reads + "w" * a.writes for a in uses]
                held = next((a for a, use in zip(args, uses) if use is None and self.devices_in(a)), None)
                if held is not None:  # `Args args{x, y, n}; k<<<...>>>(args)`: the buffers in a struct
                    raise self.prog.refuse(st, f"gives {name} the buffers {', '.join(sorted(self.devices_in(held)))} "
                                               f"inside `{text(held)}`, which is not a pointer: cuco reads what a "
                                               "kernel does to a buffer through its pointer parameters; pass them "
                                               "as parameters of their own")
            else:
                consts = self.prog.kernels.get(name, [])
                modes = ["r" if i < len(consts) and consts[i] else "w" for i in range(len(args))]
        elif kind == "nccl":
            self.nccl = True
            sig = NCCL_SIGNATURES[name]
            modes = ["r" if s == "send" else "w" if s == "recv" else "" for s in sig]
            if "count" in sig and sig.index("count") < len(args):
                self.counts.append(args[sig.index("count")])
        elif kind == "blas":
            reads, writes = BLAS.get(name, ((), tuple(range(len(args)))))
            beta, c = GEMM_BETA.get(name, (None, None))
            if beta is not None and beta < len(args):
                scalar = text(args[beta]).strip().removeprefix("&").strip()
                held = self.prog.locals.get(scalar)
                value = {held.name: text(held.init)} if held is not None and held.init is not None else \
                    self.declared_value(scalar)
                reads += () if zero_scalar(text(args[beta]), value) else (c,)
            modes = ["r" * (i in reads) + "w" * (i in writes) for i in range(len(args))]  # C with beta: read first
            if name in GEMM_SIZES:
                self.gemms.append((call, self.depth > 0))
        elif kind == "copy":
            wpos, rpos, _ = COPIES.get(name, (0, None, None))
            modes = ["w" if i == wpos else "r" if i == rpos else "" for i in range(len(args))]
        else:
            modes = []
        for arg, access in zip(args, modes):
            for var in sorted(self.devices_in(arg)) if access else ():
                self.operands.add(var)
                part = text(arg) if kind == "nccl" and "".join(text(arg).split()) != var else ""
                self.events += [Event(var, mode, name, line, not self.branches, part) for mode in access]

    def declared_value(self, name: str) -> dict[str, str]:
        """{name: its value} where the step declares it once with one (`const float beta = 0.0f;`, a written-out
        helper's), else {}."""
        values = [text(d.child_by_field_name("value")) for st, names, _ in self.decls if name in names
                  for d in walk(st) if d.type == "init_declarator" and d.child_by_field_name("value") is not None
                  and text(d.child_by_field_name("declarator")) == name]
        return {name: values[0]} if len(set(values)) == 1 else {}  # the same in a warm-up loop and the timed one

    def live(self) -> None:
        """The step's declarations that kept statements use, directly or through one another; the rest go."""
        needed = set().union(*(refs for _, refs in self.uses)) if self.uses else set()
        for st, names, refs in reversed(self.decls):
            if names & needed:
                needed |= refs
                self.uses.append((st, refs))
            else:
                self.dropped.add(st.id)

    def check_uses(self) -> None:
        """The first kept use of a name from device data or of one that varies (the others derive from it)."""
        why = ((self.tainted, "which the host has from device data (copied to the host at {at}): cuco_run may not "
                               "wait for the device; compute it on the device"),
               (self.varying, "which changes from one iteration to the next ({at}): every call of cuco_run must issue "
                              "the same work"))
        for node, refs in self.uses:
            for lines, words in why:
                found = sorted((refs if lines is self.tainted else refs - self.counters) & set(lines))
                if found:
                    at = self.prog.at(lines[found[0]])
                    self.refusals.append(self.prog.refuse(node, f"uses {found[0]}, {words.format(at=at)}"))
                    return


def read_steps(prog: Standalone, place: Place) -> tuple[Step, list, list[CucoError]]:
    """The step as every loop that runs it issues it (a warm-up loop and a timed loop must issue the same), and every
    statement of every loop that cannot be kept (the step then is what is left of the last loop)."""
    done = []
    for body in place.bodies:
        step = Step(prog, place.varying)
        done.append((step, step.read(body)))
    refused = list({str(exc): exc for step, _ in done for exc in step.refusals}.values())
    if refused:
        return *done[-1], refused
    shown = [step_lines(prog, step, kept) for step, kept in done]
    for loop, lines in zip(place.loops[1:], shown[1:]):
        if lines != shown[0]:
            raise prog.refuse(loop, f"issues other work than the loop at {prog.at(line_of(place.loops[0]))}: cuco "
                                    "takes one step, the same on every iteration")
    step, kept = done[-1]
    if not step.nccl:
        raise prog.refuse(place.loops[-1], "the step issues no NCCL call: cuco co-designs a step's communication "
                                           "with its compute")
    return step, kept, []

