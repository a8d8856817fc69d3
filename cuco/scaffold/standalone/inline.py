"""The program's own host functions written out where main() calls them, a level at a time (HELPER_DEPTH deep).

Programs put their device work in helpers: a launcher in the kernels' file (a .cpp host cannot write `<<<>>>`), a
step function, the communicator's creation. The conversion reads main()'s statements, so a call statement of such a
helper is replaced by the helper's body, its parameters bound to the call's arguments: a parameter the body only
reads becomes the argument itself (in parentheses where it is an expression), one it changes is declared from it.
The body's lines keep their origins, so a refusal inside names the helper's own file and line. Inside a block the
body is spliced in; as a loop's or a branch's only statement it is braced. A helper's local that would clash with
a name of main() is renamed. A helper whose value declares a variable of main() (`ncclComm_t comm =
make_comm(...);`) is written out too when it returns a local of its own, which becomes that variable; so is a local
a helper stores through a pointer parameter last (`*out = c;` for the call's `&comm`). A pointer parameter given
`&v` is v where the body goes through it (`p->n` is `v.n`); a template's parameters are the arguments its call
spells out (`launch<__nv_bfloat16>(...)`). A helper that returns early, is a template called without them, or is
called for its value otherwise stays a call (the step refuses it with the reason); the helpers it calls in turn are
written out at the next level, down to HELPER_DEPTH.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuco.fastpath.syntax import call_args, callee, function_name, text, walk
from cuco.scaffold.standalone.sources import Origin, Unit

PRIMARY = frozenset({"identifier", "number_literal", "string_literal", "true", "false", "null", "nullptr",
                     "field_expression", "call_expression", "subscript_expression", "parenthesized_expression",
                     "qualified_identifier"})
HELPER_DEPTH = 3  # main() -> a step function -> a launcher -> what it calls: the levels written out
DEVICE_API = re.compile(r"^(cuda|cu[A-Z]|nccl|cublas|MPI_)")  # calls that make a helper worth writing out


@dataclass
class _Param:
    name: str
    declaration: str  # as written, without a default value
    reference: bool
    default: str | None  # its default value's text, if it has one

    def declared_as(self, name: str, value: str) -> str:
        """This parameter as a local of the written-out body: `int n_ = (value);`."""
        return re.sub(rf"\b{re.escape(self.name)}\b(?!.*\b{re.escape(self.name)}\b)", name, self.declaration) + \
            f" = {value};"


def _declared_name(declarator) -> str | None:
    """The name a declarator declares without a value: `c`, `*p`, `*p = nullptr` (a null pointer is no value);
    None for one given a value."""
    if declarator.type == "init_declarator":
        value = declarator.child_by_field_name("value")
        if value is None or text(value) not in ("nullptr", "NULL", "0"):
            return None
        declarator = declarator.child_by_field_name("declarator")
    while declarator is not None and declarator.type == "pointer_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return text(declarator) if declarator is not None else None


def _params(fn) -> list[_Param] | None:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    plist = decl.child_by_field_name("parameters") if decl is not None else None
    if plist is None:
        return None
    out = []
    for p in plist.named_children:
        if p.type == "comment":
            continue
        if p.type not in ("parameter_declaration", "optional_parameter_declaration"):
            return None  # variadic, or something this reading does not take apart
        ident = next((n for n in walk(p.child_by_field_name("declarator") or p) if n.type == "identifier"), None)
        if ident is None:
            if text(p).strip() == "void":
                continue
            return None
        default = p.child_by_field_name("default_value")
        declaration = text(p)[:default.start_byte - p.start_byte].rstrip().rstrip("=").rstrip() if default else text(p)
        out.append(_Param(text(ident), " ".join(declaration.split()),
                          any(n.type == "reference_declarator" for n in walk(p)), text(default) if default else None))
    return out


def _changed(body, name: str) -> bool:
    """Whether the body assigns the parameter itself, steps it or takes its address."""
    for n in walk(body):
        target = n.child_by_field_name("left") if n.type == "assignment_expression" else \
            n.child_by_field_name("argument") if n.type == "update_expression" or (
                n.type == "pointer_expression" and text(n).startswith("&")) else None
        if target is not None and target.type == "identifier" and text(target) == name:
            return True
    return False


def _declared(node) -> set[str]:
    """The names a body declares (its locals, at any depth)."""
    out = set()
    for n in walk(node):
        if n.type in ("declaration", "for_range_loop"):
            for d in n.children_by_field_name("declarator"):
                ident = next((x for x in walk(d) if x.type == "identifier"), None)
                if ident is not None:
                    out.add(text(ident))
    return out


def _declared_value(st):
    """The value of a declaration of one variable by name (`T v = value;`), or None."""
    if st.type != "declaration":
        return None
    decls = st.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    name = decls[0].child_by_field_name("declarator")
    while name is not None and name.type == "pointer_declarator":  # `float* x = alloc(n);`
        name = name.child_by_field_name("declarator")
    return decls[0].child_by_field_name("value") if name is not None and name.type == "identifier" else None


def _working(functions: dict[str, object]) -> set[str]:
    """The host functions that issue device work, themselves or through one another."""
    calls = {name: {callee(n) for n in walk(f) if n.type == "call_expression"} for name, f in functions.items()}
    found = {name for name, f in functions.items() if any(
        n.type == "kernel_call_syntax" or (n.type == "call_expression" and DEVICE_API.match(callee(n)))
        for n in walk(f))}
    while more := {name for name, called in calls.items() if called & found} - found:
        found |= more
    return found


def _template_params(decl) -> list[str]:
    """A template's parameter names, types and values alike (`template <typename T, int N>`: T, N)."""
    plist = decl.child_by_field_name("parameters")
    out = []
    for p in plist.named_children if plist is not None else []:
        name = p.child_by_field_name("declarator") if p.type == "parameter_declaration" else \
            next((n for n in p.named_children if n.type == "type_identifier"), None)
        out.append(text(name) if name is not None else "?")
    return out


def _template_args(call) -> list[str]:
    """The template arguments a call spells out (`launch<__nv_bfloat16>(...)`: __nv_bfloat16)."""
    fn = call.child_by_field_name("function")
    args = fn.child_by_field_name("arguments") if fn is not None and fn.type == "template_function" else None
    return [text(a) for a in args.named_children] if args is not None else []


class _Inliner:
    def __init__(self, unit: Unit, root) -> None:
        self.unit, self.src = unit, unit.raw
        defs = [n for n in walk(root) if n.type == "function_definition"]
        self.functions = {function_name(f): f for f in defs}
        # a template's parameters (`template <typename T>`): its calls must spell out their arguments
        self.templates = {function_name(f): _template_params(f.parent) for f in defs
                          if f.parent is not None and f.parent.type == "template_declaration"}
        self.main = self.functions.get("main")
        host = {function_name(f): f for f in defs if function_name(f) != "main"
                and not any(c.type in ("__global__", "__device__") for c in f.children)}
        working = _working(host)
        self.helpers = {name: f for name, f in host.items() if name in working and name in self.functions}
        self.taken = {text(n) for n in walk(self.main) if n.type == "identifier"} if self.main is not None else set()
        self.added: dict[int, set[str]] = {}  # names spliced into each block of main()
        self.why: dict[str, str] = {}  # helpers that issue device work and stay calls: why

    def early_return(self, fname: str) -> str | None:
        """Why the helper cannot be written out in place: a return before its end (None where it has none)."""
        body = self.functions[fname].child_by_field_name("body")
        statements = [c for c in body.named_children if c.type != "comment"]
        last = statements[-1] if statements else None
        early = next((n for n in walk(body) if n.type == "return_statement" and n.id != last.id), None)
        if early is None:
            return None
        o = self.unit.origin(early.start_point.row + 1)
        return f"returns before its end ({o.path.name}:{o.line})"

    def final_return(self, fname: str):
        """The helper's last statement where it is a return (its value goes, a call in it stays)."""
        body = self.functions[fname].child_by_field_name("body")
        statements = [c for c in body.named_children if c.type != "comment"]
        return statements[-1] if statements and statements[-1].type == "return_statement" else None

    def calls(self) -> list:
        """main()'s statements that call a helper for its effects, or to declare a variable with its value
        (`ncclComm_t comm = make_comm(rank, world);`)."""
        out = []
        for st in walk(self.main.child_by_field_name("body")):
            expr = next((c for c in st.named_children if c.type != "comment"), None) \
                if st.type == "expression_statement" else _declared_value(st)
            if expr is not None and expr.type == "call_expression" and callee(expr) in self.helpers:
                out.append((st, expr))
        return out

    def returned_local(self, fname: str, st):
        """For `T v = helper(...);`: the helper's local it returns (`T x; ... return x;`, x declared once at its
        top level without a value), which becomes v itself; None, with the reason kept, where there is none."""
        final = self.final_return(fname)
        value = final.named_children[0] if final is not None and final.named_children else None
        decl = self.top_local(fname, text(value)) if value is not None and value.type == "identifier" else None
        if decl is None or st.parent is None or st.parent.type != "compound_statement":
            self.why[fname] = "is called for its value, which is not a local it declares and returns"
            return None
        return decl

    def top_local(self, fname: str, name: str):
        """The helper's declaration of `name` at its top level, alone and without a value (`ncclComm_t c;`, or a
        null pointer: `float* p = nullptr;`), or None."""
        body = self.functions[fname].child_by_field_name("body")
        return next((d for d in body.named_children if d.type == "declaration"
                     and [_declared_name(x) for x in d.children_by_field_name("declarator")] == [name]), None)

    def out_local(self, fname: str, param: _Param, arg):
        """For a pointer parameter the call binds to `&v` and the helper's last word on it `*out = x;` (x a local
        declared at its top level): (x's declaration, the assignment, v). x becomes v itself, as a returned local
        does; None where the helper has no such assignment."""
        target = arg.child_by_field_name("argument") if arg is not None and arg.type == "pointer_expression" and \
            text(arg).startswith("&") else None
        if target is None or target.type != "identifier":
            return None
        body = self.functions[fname].child_by_field_name("body")
        for st in body.named_children:
            expr = st.named_children[0] if st.type == "expression_statement" and st.named_children else None
            left = expr.child_by_field_name("left") if expr is not None and expr.type == "assignment_expression" \
                else None
            right = expr.child_by_field_name("right") if left is not None else None
            if left is not None and left.type == "pointer_expression" and text(left).startswith("*") and \
                    text(left.child_by_field_name("argument")) == param.name and right.type == "identifier" and \
                    text(expr.child_by_field_name("operator")) == "=":
                decl = self.top_local(fname, text(right))
                return (decl, st, text(target)) if decl is not None else None
        return None

    def written_out(self, st, call) -> list[tuple[str, Origin]] | None:
        """The helper's body in place of the call statement, line by line with origins; None where it stays."""
        name = callee(call)
        params, args = _params(self.functions[name]), call_args(call)
        why = self.early_return(name)
        if why is None and (params is None or len(args) > len(params)):
            why = "takes its arguments in a way cuco does not bind (variadic, or more than it declares)"
        values = [text(a) for a in args] + [p.default for p in (params or [])[len(args):] if p.default is not None]
        if why is None and len(values) != len(params):
            why = "is called with fewer arguments than it declares"
        types = _template_args(call)
        if why is None and name in self.templates and len(types) != len(self.templates[name]):
            why = (f"is a template called without its arguments spelled out ({name}<...>(...)): cuco cannot tell "
                   f"{', '.join(self.templates[name])}")
        if why is not None:
            self.why[name] = why
            return None
        body, final = self.functions[name].child_by_field_name("body"), self.final_return(name)
        spliced = st.parent is not None and st.parent.type == "compound_statement"
        block = self.added.setdefault(st.parent.id if spliced else st.id, set())
        rename, preamble, drop = self.renames(body, params, args, block), [], []
        rename |= {t: (arg, True) for t, arg in zip(self.templates.get(name, []), types)}  # T is the call's type
        if st.type == "declaration":  # the returned local is the declared variable, declared by main() as written
            local = self.returned_local(name, st)
            if local is None:
                return None
            var = st.child_by_field_name("declarator").child_by_field_name("declarator")  # `x` or `* x`
            rename[_declared_name(local.child_by_field_name("declarator"))] = (_declared_name(var), True)
            typed = st if text(st.child_by_field_name("type")) != "auto" else local  # `auto c = make_comm(...)`
            preamble.append(f"{text(typed.child_by_field_name('type'))} {text(var)};")
            drop.append(local)
        for p, arg in zip(params, args):  # `init_comm(&comm, ...)` ending in `*out = c;`: c is main()'s comm
            out = self.out_local(name, p, arg)
            if out is not None:
                rename[text(out[0].child_by_field_name("declarator"))] = (out[2], True)
                drop += [out[0], out[1]]
        for p, value, arg in zip(params, values, args + [None] * len(params)):
            substitute = not _changed(body, p.name) and (p.reference or arg is None or not any(
                n.type in ("assignment_expression", "update_expression", "call_expression") for n in walk(arg)))
            if substitute:
                rename[p.name] = (value, arg is None or arg.type in PRIMARY)
            else:
                preamble.append(p.declared_as(rename.get(p.name, (p.name, True))[0], value))
        for inner in {callee(c) for c in walk(body) if c.type == "call_expression"} & set(self.helpers):
            self.why.setdefault(inner, f"is called inside {name}(), itself written out in place {HELPER_DEPTH} levels "
                                       f"below main(): cuco writes out {HELPER_DEPTH} levels of the program's helpers")
        return self.lines(st, body, final, rename, preamble, spliced, drop)

    def renames(self, body, params: list[_Param], args: list, block: set[str]) -> dict[str, tuple[str, bool]]:
        """The helper's locals (and the parameters it declares) that would clash with main()'s names."""
        used = set().union(*({text(n) for n in walk(a) if n.type == "identifier"} for a in args)) if args else set()
        out = {}
        for local in sorted(_declared(body) | {p.name for p in params if _changed(body, p.name)}):
            if local in self.taken | block | used:
                fresh, i = f"{local}_", 2
                while fresh in self.taken | block | used:
                    fresh, i = f"{local}_{i}", i + 1
                out[local] = (fresh, True)
                block.add(fresh)
            else:
                block.add(local)
        return out

    def lines(self, st, body, final, rename: dict[str, tuple[str, bool]], preamble: list[str], spliced: bool,
              drop: list = ()) -> list[tuple[str, Origin]]:
        edits = self.substitutions(body, rename)  # (start byte, end byte, text) within the body
        for gone in drop:  # statements of the body left out (a returned local main() declares itself)
            edits = [e for e in edits if not gone.start_byte <= e[0] < gone.end_byte]
            edits.append((gone.start_byte, gone.end_byte, ""))
        if final is not None:  # the helper's last statement: its value goes, a call in it stays
            value = final.named_children[0] if final.named_children else None
            keeps = value is not None and any(x.type == "call_expression" for x in walk(value))
            edits = [e for e in edits if not final.start_byte <= e[0] < final.end_byte]
            edits.append((final.start_byte, final.end_byte, self.edited(value, rename) + ";" if keeps else ""))
        inner = self.edited_range(body.start_byte + 1, body.end_byte - 1, edits)
        opened = [(("" if spliced else "{ ") + " ".join(preamble), self.unit.origin(st.start_point.row + 1))]
        row = body.start_point.row + 1  # the line of the body's `{`, where its first piece starts
        pieces = [(piece, self.unit.origin(row + k)) for k, piece in enumerate(inner.split("\n"))]
        return opened + pieces + [("" if spliced else "}", self.unit.origin(st.end_point.row + 1))]

    def edited(self, node, rename: dict[str, tuple[str, bool]]) -> str:
        return self.edited_range(node.start_byte, node.end_byte, self.substitutions(node, rename))

    @staticmethod
    def substitutions(node, rename: dict[str, tuple[str, bool]]) -> list[tuple[int, int, str]]:
        """Each use of a renamed name: an expression in parentheses, unless it is a whole argument. A pointer
        parameter given `&v` is v where the body goes through it: `p->n` is `v.n`, `*p` is v."""
        out = []
        for n in walk(node):
            if n.type in ("identifier", "type_identifier") and text(n) in rename:
                value, primary = rename[text(n)]
                pointee, up = value[1:] if value.startswith("&") and value[1:].isidentifier() else None, n.parent
                arrow = up.child_by_field_name("operator") if up is not None and up.type == "field_expression" else None
                through = arrow is not None and text(arrow) == "->" and up.child_by_field_name("argument").id == n.id
                if pointee and through:
                    out.append((n.start_byte, arrow.end_byte, f"{pointee}."))
                    continue
                if pointee and up is not None and up.type == "pointer_expression" and text(up).startswith("*"):
                    out.append((up.start_byte, up.end_byte, pointee))
                    continue
                bare = primary or (up is not None and up.type == "argument_list")
                out.append((n.start_byte, n.end_byte, value if bare else f"({value})"))
        return out

    def edited_range(self, start: int, end: int, edits: list[tuple[int, int, str]]) -> str:
        out, pos = [], start
        for s, e, t in sorted(x for x in edits if start <= x[0] and x[1] <= end):
            out += [self.src[pos:s].decode(errors="replace"), t]
            pos = e
        out.append(self.src[pos:end].decode(errors="replace"))
        return "".join(out)


def inline_helpers(unit: Unit, root) -> Unit:
    """The unit with main()'s calls of the program's helpers that issue device work written out, one level more than
    it had (read_program calls it again for the next, up to HELPER_DEPTH levels)."""
    inliner = _Inliner(unit, root)
    if inliner.main is None:
        return unit
    lines = [ln.encode() for ln in unit.lines]
    origins = list(unit.origins)
    done: list[str] = []
    for st, call in sorted(inliner.calls(), key=lambda sc: sc[0].start_byte, reverse=True):
        new = inliner.written_out(st, call)
        if new is None:
            continue
        done.insert(0, callee(call))
        (rs, cs), (re_, ce) = st.start_point, st.end_point
        head, tail = lines[rs][:cs], lines[re_][ce:]
        texts = [t.encode() for t, _ in new]
        texts[0] = head + texts[0]
        texts[-1] = texts[-1] + tail
        lines[rs:re_ + 1] = texts
        origins[rs:re_ + 1] = [o for _, o in new]
    written = list(dict.fromkeys(unit.written_out + done))
    # why a helper stays a call: this level's reasons, and the earlier ones this level did not settle
    why = {**{name: w for name, w in unit.unwritten.items() if name not in done}, **inliner.why}
    return unit.changed(lines=[ln.decode(errors="replace") for ln in lines], origins=origins, unwritten=why,
                        written_out=written)
