"""The seed's three entry points: which locals of main() cuco_setup and cuco_run carry and bind to the runner's
objects, which set-up statements make cuco_setup's state, and the source they are written as."""

from __future__ import annotations

import re
import textwrap

from cuco.errors import CucoError
from cuco.fastpath.analyze import ALLOCATORS
from cuco.fastpath.syntax import call_args, callee, text
from cuco.scaffold.program import param_name
from cuco.scaffold.standalone.calls import GEMM_SIZES, HANDLE_CREATE, RESULTS, made_at
from cuco.scaffold.standalone.nodes import address_of, calls_in, idents, line_of, names_in, root_name
from cuco.scaffold.standalone.place import Place
from cuco.scaffold.standalone.program import Local, Standalone
from cuco.scaffold.standalone.render import Render, step_lines
from cuco.scaffold.standalone.scope import file_scope
from cuco.scaffold.standalone.step import Event, Step
from cuco.scaffold.standalone.variables import Locals

PREFIXES = ("d_", "dev_", "device_", "gpu_")
SUFFIXES = ("_d", "_dev", "_device", "_gpu")


def buffer_name(var: str) -> str:
    """A device pointer's name as a workload buffer's: `d_x`, `x_dev`, `dX` and a struct's field `c.d_x` are x, x,
    X and x."""
    var = var.rsplit(".", 1)[-1]
    name = next((var[len(p):] for p in PREFIXES if var.startswith(p) and len(var) > len(p)), var)
    name = next((name[:-len(s)] for s in SUFFIXES if name.endswith(s) and len(name) > len(s)), name)
    if re.fullmatch(r"d[A-Z]\w*", name):
        name = name[1:]
    return param_name(name)[:31]


def _is_creation(prog: Standalone, st, name: str) -> bool:
    for c in map(prog.unwrap, calls_in(st)):
        at = made_at(callee(c))
        if callee(c) in (*HANDLE_CREATE, *ALLOCATORS, *RESULTS) and len(call_args(c)) > at and \
                address_of(call_args(c)[at]) == name:
            return True
    return False


CARRIED = frozenset({"comm", "stream", "world", "rank", "param", "scalar", "device", "handle", "struct"})


class Seed:
    """The seed's parts: the locals each entry point declares (bound to the runner's objects), cuco_setup's state
    and its set-up statements, the step's statements, and the workload's buffers."""

    def __init__(self, prog: Standalone, place: Place, locs: Locals, step: Step, kept: list) -> None:
        self.prog, self.place, self.locs, self.step, self.kept = prog, place, locs, step, kept
        self.refusals: list[CucoError] = []  # each local the step uses that cuco cannot carry, all of them
        self.run_locals = self.closure([(node, refs - step.declared - step.counters) for node, refs in step.uses])
        used = set().union(*(names_in(node) for node, _ in step.uses))
        held = self.run_locals + [f for loc in self.run_locals for f in self.fields(loc) if f.name in used]
        self.attached = self.attached_to_gemms(used)
        for dev, (attr, line) in self.attached.items():  # read by the step's GEMM through its descriptor
            step.operands.add(dev)
            step.events.append(Event(dev, "r", f"cublasLtMatmul (its {attr})", line))
            held += [self.prog.locals[dev]]
        devices = list(dict.fromkeys(loc.name for loc in held if loc.kind == "device"))
        self.buffers = [d for d in devices if d in step.operands]
        wanted = [d for d in devices if d not in step.operands]
        self.state, self.setup = self.setup_part(wanted + [loc.name for loc in held if loc.kind == "handle"])
        runner = {n for n, loc in prog.locals.items() if loc.kind in ("stream", "comm")}
        self.setup_locals = self.closure([(st, idents(st) - set(self.state) - runner) for st in self.setup])
        self.demote()
        self.struct = "CucoState" if re.search(rb"\bState\b", prog.src) else "State"
        taken: set[str] = set()
        self.names = {var: self.unique(buffer_name(var), taken) for var in self.buffers}

    @staticmethod
    def unique(name: str, taken: set[str]) -> str:
        key, i = name, 2
        while key in taken:
            key, i = f"{name}_{i}", i + 1
        taken.add(key)
        return key

    def closure(self, uses: list) -> list[Local]:
        """The locals of main() these uses need, through the initialisers of the scalars among them, each one
        checked: the runner's objects, sizes, scalars, buffers and handles are carried; anything else is refused."""
        seen: dict[str, Local] = {}
        refused: set[str] = set()
        todo = [(name, node) for node, refs in uses for name in sorted(refs)]
        for name, node in todo:  # each at its first use
            if name in self.prog.file_variables and name not in self.prog.locals and name not in refused:
                refused.add(name)
                self.refusals.append(self.prog.refuse(node, (
                    f"uses {name}, a variable at file scope ({self.prog.at(self.prog.file_variables[name])}): the "
                    "seed keeps file-scope code as written, so the runner's buffers, sizes and communicator cannot "
                    "reach it; declare it in main()")))
        while todo:
            name, node = todo.pop()
            loc = self.prog.locals.get(name)
            if loc is None or name in seen or name in refused:
                continue
            try:
                self.carryable(loc, node)
            except CucoError as exc:
                self.refusals.append(exc)
                refused.add(name)
                continue
            seen[name] = loc
            if loc.kind == "scalar" and loc.init is not None:
                todo += [(r, loc.declarator.parent) for r in sorted(idents(loc.init))]
            for f in self.fields(loc):  # a struct's field given a local's value (`c.n = n;`): that local too
                if f.kind == "scalar" and f.init is not None and f.name in names_in(node):
                    todo += [(r, node) for r in sorted(idents(f.init))]
        return sorted(seen.values(), key=lambda loc: loc.order)

    def fields(self, loc: Local) -> list[Local]:
        """A struct's scalar fields, as the locals `cfg.tokens` (none for any other local)."""
        return [f for n, f in self.prog.locals.items() if n.startswith(f"{loc.name}.")] if loc.kind == "struct" else []

    def carryable(self, loc: Local, node) -> None:
        used = [f for f in self.fields(loc) if f.kind == "other" and f.name in names_in(node)]
        if used:
            raise self.prog.refuse(node, f"uses {used[0].name}, {used[0].why or 'which cuco cannot follow'}: cuco "
                                         "cannot carry it into cuco_setup or cuco_run")
        if loc.kind in CARRIED:
            return
        if loc.kind == "argv":
            why = "reads the command line: cuco_run has none (a size read from it becomes a parameter, cuco_param)"
        elif loc.kind == "local_rank":
            why = f"uses {loc.name}, the rank within the node: the runner chooses the device (ctx->cudaDevice)"
        else:
            why = (f"uses {loc.name} ({self.prog.at(loc.line)}), {loc.why or 'which cuco cannot follow'}: cuco "
                   "cannot carry it into cuco_setup or cuco_run")
        raise self.prog.refuse(node, why)

    def makes(self, st, name: str) -> bool:
        """Whether a set-up statement creates, configures or allocates `name`."""
        found = False
        for call in {c.id: self.prog.unwrap(c) for c in calls_in(st)}.values():
            args, kind, called = call_args(call), self.prog.kind(call), callee(call)
            at = made_at(called)
            if len(args) <= at or name not in (address_of(args[at]), root_name(args[at])):
                continue
            if kind == "copy" and self.prog.direction(call) != "set":
                raise self.prog.refuse(st, f"fills {name}, which cuco_setup makes, with data cuco does not carry")
            if (kind == "blas_setup" and called in HANDLE_CREATE) or kind in ("blas_config", "copy") or \
                    (kind == "memory" and called in ALLOCATORS):
                found = True
        if found and st.type != "expression_statement":
            raise self.prog.refuse(st, f"sets up {name} inside a statement cuco does not take apart: cuco_setup takes "
                                       "the set-up as straight-line calls of main()")
        return found

    def attached_to_gemms(self, used: set[str]) -> dict[str, tuple[str, int]]:
        """Device buffers the set-up attaches to a cuBLASLt descriptor the step uses (a bias, a scale:
        `cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, ...)`): the step's GEMM
        reads them, so they are workload buffers, bound in cuco_setup. Each with its attribute and line."""
        out = {}
        for st in self.place.setup:
            for call in map(self.prog.unwrap, calls_in(st)):
                args = call_args(call)
                if callee(call) != "cublasLtMatmulDescSetAttribute" or len(args) < 3 or \
                        not text(args[1]).endswith("_POINTER") or root_name(args[0]) not in used:
                    continue
                loc = self.prog.locals.get(address_of(args[2]) or "")
                if loc is not None and loc.kind == "device":
                    out[loc.name] = (text(args[1]).removeprefix("CUBLASLT_MATMUL_DESC_"), line_of(call))
        return out

    def setup_part(self, wanted: list[str]) -> tuple[list[str], list]:
        """cuco_setup's state (handles, private buffers: what the step needs that the runner does not give) and the
        set-up statements that make it, in the program's order."""
        state: set[str] = set()
        picked: dict[int, object] = {}
        todo = list(wanted)
        made = {n for n, loc in self.prog.locals.items() if loc.kind in ("device", "handle")}
        while todo:
            name = todo.pop()
            if name in state:
                continue
            state.add(name)
            for st in self.place.setup:
                if st.id in picked or not self.makes(st, name):
                    continue
                picked[st.id] = st
                for ref in sorted((idents(st) & made) - state - set(self.attached)):
                    if ref in self.step.operands:
                        raise self.prog.refuse(st, f"gives {ref}, a buffer of the step, to the set-up of {name}: "
                                                   "cuco cannot split it between the runner and cuco_setup")
                    todo.append(ref)
        created = {**self.locs.allocs, **self.locs.creates}
        field = next((n for n in sorted(state) if "." in n), None)
        if field is not None:
            raise self.prog.refuse(created.get(field, self.prog.main), f"keeps {field}, which cuco_setup would make "
                                   "and hold, in a field of a struct: cuco_setup holds what the step needs besides the "
                                   "workload's buffers as locals of main(); declare it as one")
        for name in sorted(state):
            if not any(_is_creation(self.prog, st, name) for st in picked.values()):
                raise self.prog.refuse(created.get(name, self.prog.main), f"makes {name} after the step begins: "
                                       "cuco_setup takes what the step needs from the set-up before it")
        order = sorted(state, key=lambda n: created[n].start_byte)
        return order, sorted(picked.values(), key=lambda st: st.start_byte)

    def demote(self) -> None:
        """A constant of the program stays a constant unless a buffer's size, an NCCL count or a GEMM's size
        depends on it: those are the workload's parameters (and whatever it reads from argv or the environment)."""
        roots = [call_args(self.locs.allocs[v])[1] for v in self.buffers
                 if v in self.locs.allocs and len(call_args(self.locs.allocs[v])) > 1]
        roots += self.step.counts + [call_args(c)[i] for c, _ in self.step.gemms for i in GEMM_SIZES[callee(c)]
                                     if i < len(call_args(c))]
        sized, todo, seen = set(), [n for r in roots for n in names_in(r)], set()
        self.unfollowed: list[str] = []  # what the sizes come from that cuco cannot follow (a helper's struct)
        while todo:
            name = todo.pop()
            loc = self.prog.locals.get(name)
            if loc is None and name not in self.prog.globals and name not in self.unfollowed and \
                    name.split(".")[0] not in {*self.prog.locals, "ctx"} and not _type_name(self.prog, name):
                self.unfollowed.append(name)
            if loc is None or loc.name in seen:
                continue
            seen.add(loc.name)
            if loc.kind == "param":
                sized.add(loc.name)
            elif loc.kind == "scalar" and loc.init is not None:
                todo += list(names_in(loc.init))
        for loc in self.run_locals + self.setup_locals:
            for each in [loc, *self.fields(loc)]:
                if each.kind == "param" and not each.reads_input and each.name not in sized:
                    each.kind = "scalar"

    def declare(self, loc: Local, render: Render) -> str:
        """A local of main() bound to what the runner gives for it."""
        n, base = loc.name, loc.base
        if loc.kind == "device" and n in self.names:
            elem = base + "*" * (loc.pointers - 1)
            cast = "" if elem == "void" else f"({elem}*)"
            return f"{elem}* {n} = {cast}cuco_buffer(ctx, \"{self.names[n]}\")->ptr;"
        bound = {"comm": f"ncclComm_t {n} = ctx->comm;", "stream": f"cudaStream_t {n} = ctx->stream;",
                 "world": f"const {base} {n} = ctx->nRanks;", "rank": f"const {base} {n} = ctx->rank;",
                 "param": f"const {base} {n} = ({base})cuco_param(ctx, \"{self.prog.param_label(n)}\");",
                 "device": f"{loc.ctype} {n} = s->{n};", "handle": f"{loc.ctype} {n} = s->{n};"}
        declared = bound.get(loc.kind) or f"{loc.prefix}{render(loc.declarator)};"
        # a struct's fields that are the runner's or the workload's, or set from them: the others keep their defaults
        return "\n  ".join([declared] + [f"{f.name} = {value};" for f in self.bound_fields(loc)
                                        if (value := self.field_value(f, render)) is not None])

    def bound_fields(self, loc: Local) -> list[Local]:
        """A struct's fields the seed binds: all but the sizes neither the step nor the set-up reads (a parser's
        iteration count keeps its default, and is no parameter)."""
        fields = self.fields(loc)
        if not any(f.kind == "param" for f in fields):
            return fields
        held = [n for n in self.run_locals + self.setup_locals if n.init is not None]
        used = set().union(*(names_in(node) for node, _ in self.step.uses), *(names_in(st) for st in self.setup),
                           *(names_in(n.init) for n in held))
        return [f for f in fields if f.kind != "param" or f.name in used]

    def field_value(self, f: Local, render: Render) -> str | None:
        """What the runner gives for a struct's field (`c.comm = ctx->comm;`), or the value the set-up gives it
        (`c.n = n;`, n a parameter declared before), None for a field it does neither."""
        if f.kind == "scalar" and f.set_at is not None:  # given its value by an assignment in the set-up
            return render(f.init)
        if f.kind == "device":
            return f"({f.base}{'*' * f.pointers})cuco_buffer(ctx, \"{self.names[f.name]}\")->ptr" \
                if f.name in self.names else None
        values = {"comm": "ctx->comm", "stream": "ctx->stream", "world": f"({f.base})ctx->nRanks",
                  "rank": f"({f.base})ctx->rank",
                  "param": f"({f.base})cuco_param(ctx, \"{self.prog.param_label(f.name)}\")"}
        return values.get(f.kind)

    def run_lines(self) -> list[str]:
        render = Render(self.prog)
        lines = ["  " + self.declare(loc, render) for loc in self.run_locals]
        if any(loc.kind in ("device", "handle") and loc.name not in self.names for loc in self.run_locals):
            lines.insert(0, f"  {self.struct}* s = ({self.struct}*)ctx->state;")
        return lines + step_lines(self.prog, self.step, self.kept) + ["  return 0;"]

    def setup_lines(self) -> list[str]:
        rename = {n: f"s->{n}" for n in self.state}
        rename |= {n: f"ctx->{loc.kind}" for n, loc in self.prog.locals.items() if loc.kind in ("stream", "comm")}
        render = Render(self.prog, rename=rename)
        lines = [f"  {self.struct}* s = new {self.struct}();", "  ctx->state = s;"] if self.state else []
        lines += ["  " + self.declare(loc, render) for loc in self.setup_locals]
        bound = {root_name(call_args(c)[0]) for st in self.setup for c in map(self.prog.unwrap, calls_in(st))
                 if callee(c) == "cublasSetStream" and call_args(c)}
        for st in self.setup:
            lines += render.statement(st)
            made = next((c for c in map(self.prog.unwrap, calls_in(st)) if callee(c) in ("cublasCreate",
                                                                                         "cublasCreate_v2")), None)
            handle = address_of(call_args(made)[0]) if made is not None and call_args(made) else None
            if handle is not None and handle not in bound:
                lines.append(f"  CUCO_CUBLAS(ctx, cublasSetStream(s->{handle}, ctx->stream));")
        return lines + ["  return 0;"]

    def teardown_lines(self) -> list[str]:
        if not self.state:
            return ["  return 0;"]
        lines = [f"  {self.struct}* s = ({self.struct}*)ctx->state;"]
        for name in reversed(self.state):
            if name in self.locs.creates:  # a handle is destroyed; a result (the chosen algorithm) is not
                made = callee(self.locs.creates[name])
                lines += [f"  CUCO_CUBLAS(ctx, {HANDLE_CREATE[made]}(s->{name}));"] if made in HANDLE_CREATE else []
            elif callee(self.locs.allocs[name]) == "ncclMemAlloc":
                lines.append(f"  CUCO_NCCL(ctx, ncclMemFree(s->{name}));")
            else:
                lines.append(f"  CUCO_CUDA(ctx, cudaFree(s->{name}));")
        return lines + ["  delete s;", "  ctx->state = NULL;", "  return 0;"]

    def entry_points(self) -> list[str]:
        out = []
        if self.state:
            fields = [f"  {self.prog.locals[n].ctype} {n};" for n in self.state]
            out += [f"struct {self.struct} {{", *fields, "};", ""]
        for name, body in (("cuco_setup", self.setup_lines()), ("cuco_run", self.run_lines()),
                           ("cuco_teardown", self.teardown_lines())):
            out += [f"CUCO_EXPORT int {name}(cuco_ctx_t* ctx) {{", *body, "}", ""]
        return out

    def source(self) -> str:
        entry = self.entry_points()
        files = self.prog.unit.files
        kept = "the program itself is kept beside this file as original.cu" if len(files) == 1 else \
            f"its files ({', '.join(p.name for p in files)}) are kept beside this file in original/"
        if self.prog.unit.defines:
            kept += f"; read with {' '.join(f'-D {d}' for d in self.prog.unit.defines)}, so this is that build of it"
        header = textwrap.wrap(
            f"cuco_setup, cuco_run and cuco_teardown around the step of {self.prog.path.name}, written by `cuco init` "
            f"({kept}). cuco_run is one iteration of "
            f"{self.place.where} of main(), issued on ctx->stream with ctx->comm and the workload's buffers: the "
            "runner owns the ranks, the communicator, the streams, the buffers, the loop, the timing and the checks.",
            112)
        scope = file_scope(self.prog, set().union(*(set(re.findall(r"[A-Za-z_]\w*", ln)) for ln in entry)))
        local_types = [f"{' '.join(text(n).split())}  // main()'s own, {self.prog.at(line_of(n))}"
                       for n in self.prog.local_types]
        return "\n".join(["// " + ln for ln in header] + [""] + scope + [""] + local_types +
                         ([""] if local_types else []) + entry)

    def warnings(self) -> list[str]:
        streams = [n for n in self.locs.streams if n in {loc.name for loc in self.run_locals}]
        out = [f"{self.prog.path.name}: the step's streams {', '.join(streams)} are all ctx->stream in seed.cu: their "
               "work runs in the program's order, one after another"] if len(streams) > 1 else []
        for node in self.prog.root.children:
            path = node.child_by_field_name("path") if node.type == "preproc_include" else None
            if path is not None and path.type == "string_literal" and not re.match(r"\"(nccl|cu)", text(path)):
                o = self.prog.origin(line_of(node))
                out.append(f"{o.path.name}:{o.line}: seed.cu keeps #include {text(path)}: a candidate "
                           "is built alone, so paste what it needs from that header into seed.cu")
        return out


def _type_name(prog: Standalone, name: str) -> bool:
    """A type a size expression names (`sizeof(__nv_bfloat16)`), not a value it comes from."""
    return name in prog.aliases or name in prog.structs or bool(re.match(r"(__\w+|\w+_t|float\d|int\d|half\d?)$", name))
