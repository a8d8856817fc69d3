"""The standalone program as parsed: its functions, kernels, check macros and file-scope constants, the locals
main() declares, and what each of its calls is to the conversion."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cuco.errors import CucoError
from cuco.fastpath.analyze import ALLOCATORS, COPIES, FREES, NCCL_SIGNATURES, const_params
from cuco.fastpath.syntax import blank_macros, call_args, callee, function_name, text, walk
from cuco.scaffold.size_expr import define_value, int_literal, param_name
from cuco.scaffold.standalone.calls import CHECKS, WORK
from cuco.scaffold.standalone.nodes import calls_in, idents, is_launch, line_of
from cuco.scaffold.standalone.sources import Origin, Unit

SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaEventRecord",
                   "cudaEventRecordWithFlags", "cudaEventElapsedTime", "cudaEventQuery", "cudaStreamQuery",
                   "cudaStreamWaitEvent"})
GRAPH = frozenset({"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                   "cudaGraphInstantiateWithFlags", "cudaGraphUpload", "cudaGraphExecDestroy", "cudaGraphDestroy"})
MEMORY = frozenset({*ALLOCATORS, *FREES, "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost"})


def _head(node) -> str:
    """A statement in one short line: a compound statement by its header."""
    body = node.child_by_field_name("body") or node.child_by_field_name("consequence")
    raw = text(node)[:body.start_byte - node.start_byte] if body is not None else text(node)
    one = " ".join(raw.split())
    return one if len(one) <= 80 else one[:77] + "..."


class Refusal(CucoError):
    """A statement cuco cannot convert, named where it was written; `line_read` is its place in the program as read
    (its helpers' lines where main() calls them), which orders the blockers of one run."""

    def __init__(self, where: str, message: str, line_read: int) -> None:
        super().__init__(where, message)
        self.line_read = line_read


@dataclass
class Local:
    """A variable main() declares outside the step, and what it is to the runner."""

    name: str
    line: int
    order: int  # its declarator's byte offset: the order preambles declare in
    base: str  # the declaration's type as written, without qualifiers
    pointers: int  # levels of `*` in its declarator
    prefix: str  # the declaration's specifiers, `static` dropped and `constexpr` made `const`
    declarator: object
    init: object | None
    kind: str = "other"  # comm stream world rank local_rank device handle param scalar argv other
    why: str = ""  # for kind "other": what the program does with it that cuco cannot carry
    reads_input: bool = False  # from argv or the environment: a size the program is given
    value: int | None = None  # a parameter's value in the program (its default, where it reads one)
    set_at: int | None = None  # a struct field's first assignment in the set-up, which gives it its value (init)

    @property
    def ctype(self) -> str:
        return self.base + "*" * self.pointers


class Standalone:
    """The program's syntax tree (the one `cuco init` parsed it into), its functions, check macros and the locals
    of main()."""

    def __init__(self, path: Path, raw: bytes, root, unit: Unit | None = None) -> None:
        self.path = path
        self.unit = unit or Unit(raw.decode(errors="replace").splitlines(),
                                 [Origin(path, i + 1) for i in range(raw.count(b"\n") + 1)], [path])
        self.src = blank_macros(raw)
        self.root = root
        defs = [n for n in walk(self.root) if n.type == "function_definition"]
        self.functions = {function_name(f): f for f in defs}
        self.main = self.functions.get("main")
        self.kernels = const_params([f for f in defs if any(c.type == "__global__" for c in f.children)])
        self.device = {function_name(f) for f in defs if any(c.type in ("__global__", "__device__")
                                                             for c in f.children)}
        macros = {text(n.child_by_field_name("name")) for n in walk(self.root) if n.type == "preproc_function_def"}
        self.wrappers = {callee(c) for c in calls_in(self.root)  # a check macro, however it is named
                         if (re.fullmatch(r"[A-Z][A-Z0-9_]*", callee(c)) or callee(c) in macros)
                         and len(call_args(c)) == 1 and call_args(c)[0].type == "call_expression"}
        self.env_functions = {name for name, f in self.functions.items()
                              if any(callee(c) in ("getenv", "secure_getenv", "std::getenv") for c in calls_in(f))}
        body = self.main.child_by_field_name("body") if self.main is not None else None
        # main()'s own type names (`using T = __nv_bfloat16;`): the seed declares them before its entry points
        self.local_types = [n for n in walk(body) if n.type in TYPE_ALIASES] if body is not None else []
        self.aliases = _type_aliases(self.root.children) | _type_aliases(self.local_types)
        self.globals = {**self.unit.constants, **_global_constants(self.root)}
        self.file_variables = _file_variables(self.root)
        self.structs = _structs(self.root)
        self.locals: dict[str, Local] = {}
        self.lambdas = _lambdas(self.main) if self.main is not None else {}
        self.undefined = {name: line for name, line in _prototypes(self.root).items() if name not in self.functions}

    def param_label(self, name: str) -> str:
        """A parameter's name in the workload: a local's own, a struct field's (`cfg.tokens`) its field's, or
        `cfg_tokens` where that is taken."""
        if "." not in name:
            return param_name(name)
        field = name.rsplit(".", 1)[1]
        taken = field in self.locals or sum(n.rsplit(".", 1)[-1] == field for n in self.locals if "." in n) > 1
        return param_name(name.replace(".", "_") if taken else field)

    def refuse(self, node, why: str) -> Refusal:
        return Refusal(str(self.origin(line_of(node))), f"`{self.head(node)}`: {why}", line_of(node))

    def head(self, node) -> str:
        """A statement in one short line, as the user wrote it where that is one line the reading changed (a macro
        expanded, a helper's parameter bound)."""
        line = line_of(node)
        written = self.unit.as_written(line).strip()
        if node.start_point.row == node.end_point.row and written and \
                self.unit.lines[line - 1].strip() != written and len(written) <= 80:
            return written
        return _head(node)

    def origin(self, line: int) -> Origin:
        """Where line `line` of the program as read (its files joined, its macros expanded) was written."""
        return self.unit.origin(line)

    def at(self, line: int) -> str:
        """A line in a message: `line 12` in a program of one file, `host.cpp:12` in one of several."""
        o = self.origin(line)
        return f"line {o.line}" if len(self.unit.files) == 1 else f"{o.path.name}:{o.line}"

    def cite(self, line: int) -> str:
        """A line of the program as the workload keeps it beside the seed (original.cu, or original/ by name)."""
        o = self.origin(line)
        return f"original.cu:{o.line}" if len(self.unit.files) == 1 else f"original/{o.path.name}:{o.line}"

    def unwrap(self, call):
        """The API call inside the program's check macros (`CUDACHECK(cudaMalloc(...))`)."""
        while callee(call) in self.wrappers and len(args := call_args(call)) == 1 and args[0].type == "call_expression":
            call = args[0]
        return call

    def kind(self, call) -> str:
        """What a call is to the conversion."""
        name = callee(call)
        if is_launch(call):
            return "launch"
        if name in NCCL_SIGNATURES:
            return "nccl"
        if name.startswith("cublas"):
            return "blas_setup" if re.match(r"cublas\w*(Create|Destroy)", name) else \
                "blas_config" if re.match(r"cublas(Lt)?\w*?(Set|Get)", name) else "blas"
        table = (("copy", COPIES), ("check", CHECKS), ("sync", SYNCS), ("graph", GRAPH), ("memory", MEMORY))
        found = next((k for k, names in table if name in names), None)
        if found is not None:
            return found
        if name == "cudaGraphLaunch":
            return "graph_launch"
        if (name in self.functions or self.qualified(name)) and name not in self.device:
            return "host_fn"
        if re.match(r"nccl|cuda|cu[A-Z]", name):
            return "nccl_admin" if name.startswith("nccl") else "cuda"
        return "mpi" if name.startswith("MPI_") else "host"

    def works(self, node, seen: frozenset[str] = frozenset(), copies: bool = True) -> bool:
        """Whether a statement issues device work: kernels, NCCL, cuBLAS, device copies (unless `copies` is False),
        graph launches, or calls a function (a method, a lambda) of the program's that does."""
        for call in calls_in(node):
            kind = self.kind(call)
            if kind in WORK or (copies and kind == "copy" and self.direction(call) in ("d2d", "set")):
                return True
            if kind == "host_fn" and callee(call) not in seen and self.issues_work(callee(call), seen):
                return True
            method = self.method(call)
            if method is not None and method[0] not in seen and self.issues_work(method[0], seen):
                return True
            if callee(call) in self.lambdas and callee(call) not in seen and \
                    self.works(self.lambdas[callee(call)], seen | {callee(call)}):
                return True
        return False

    def method(self, call) -> tuple[str, str] | None:
        """The program's method a call (`obj.step()`, `obj->step()`) names: its key in `functions` and its class;
        None for any other call."""
        fn = call.child_by_field_name("function")
        field_ = fn.child_by_field_name("field") if fn is not None and fn.type == "field_expression" else None
        loc = self.locals.get(text(fn)) if fn is not None and fn.type == "identifier" else None
        if loc is not None and not loc.pointers:  # a function object: `exchange(send, recv)` calls its operator()
            field_, owner_name = fn, loc.base
        elif field_ is None:
            return None
        else:
            owner_name = None
        name = "operator()" if owner_name else text(field_)
        for key, f in self.functions.items():
            owner = next((p for p in _ancestors(f) if p.type in ("class_specifier", "struct_specifier")), None)
            if key == name and owner is not None and owner_name in (None, text(owner.child_by_field_name("name"))):
                return key, text(owner.child_by_field_name("name"))
            if key.endswith(f"::{name}"):
                return key, key[:-len(name) - 2]
        return None

    def direction(self, call) -> str:
        """A copy's direction: d2h, h2d, d2d, set (a memset), or host."""
        name, args = callee(call), call_args(call)
        if name.startswith("cudaMemset"):
            return "set"
        kinds = " ".join(text(a) for a in args if text(a).startswith("cudaMemcpy"))
        for word, way in (("DeviceToHost", "d2h"), ("HostToDevice", "h2d"), ("DeviceToDevice", "d2d")):
            if word in kinds:
                return way
        wpos, rpos, _ = COPIES.get(name, (0, 1, None))
        dst = wpos < len(args) and bool(idents(args[wpos]) & self.devices())
        src = rpos is not None and rpos < len(args) and bool(idents(args[rpos]) & self.devices())
        return "d2d" if dst and src else "d2h" if src else "h2d" if dst else "host"

    def devices(self) -> set[str]:
        return {n for n, loc in self.locals.items() if loc.kind == "device"}

    def issues_work(self, fname: str, seen: frozenset[str] = frozenset()) -> bool:
        fn = self.functions.get(fname) or self.qualified(fname)
        return fn is not None and self.works(fn.child_by_field_name("body"), seen | {fname})

    def qualified(self, name: str):
        """The function of the program a qualified call names (`ops::scale`: scale defined in namespace ops, or a
        static method of a class ops), or None."""
        scope, _, last = name.split("<")[0].rpartition("::")  # `tp::step<float>` is tp's step
        fn = self.functions.get(last) if scope else None
        owners = [text(p.child_by_field_name("name")) for p in _ancestors(fn) if p.type in (
            "namespace_definition", "class_specifier", "struct_specifier") and p.child_by_field_name("name")] \
            if fn is not None else []
        return fn if owners and "::".join(reversed(owners)).endswith(scope.removeprefix("::")) else None

    def scope_of(self, name: str) -> str:
        """How a qualified call's function is reached, for a refusal: `namespace ops` or `class Ops`."""
        fn = self.qualified(name)
        owner = next((p for p in _ancestors(fn) if p.type in ("namespace_definition", "class_specifier",
                                                               "struct_specifier")), None) if fn else None
        kind = {"namespace_definition": "namespace"}.get(owner.type, "class") if owner is not None else "scope"
        return f"{kind} {name.split('<')[0].rpartition('::')[0]}"


def _prototypes(root) -> dict[str, int]:
    """The functions the program's own files declare (`void launch_gelu(bf16* x, int n, cudaStream_t s);`), with the
    line of each declaration; the headers of CUDA, NCCL and the system are not among its files."""
    out = {}
    for node in walk(root):
        if node.type not in ("declaration", "field_declaration") or node.parent is None or \
                node.parent.type not in ("translation_unit", "declaration_list", "linkage_specification"):
            continue
        for d in node.children_by_field_name("declarator"):
            while d is not None and d.type in ("pointer_declarator", "reference_declarator"):
                d = d.child_by_field_name("declarator")
            name = d.child_by_field_name("declarator") if d is not None and d.type == "function_declarator" else None
            if name is not None and name.type == "identifier":
                out.setdefault(text(name), line_of(node))
    return out


def _lambdas(main) -> dict[str, object]:
    """main()'s lambdas by the names it gives them (`auto add_bias = [&](float* y) { ... };`): their bodies."""
    out = {}
    for d in walk(main):
        value = d.child_by_field_name("value") if d.type == "init_declarator" else None
        name = d.child_by_field_name("declarator") if value is not None else None
        if value is not None and value.type == "lambda_expression" and name is not None and name.type == "identifier":
            out[text(name)] = value.child_by_field_name("body")
    return out


def _ancestors(node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


TYPE_ALIASES = ("alias_declaration", "type_definition")


def _type_aliases(nodes) -> dict[str, str]:
    """`using bf16 = __nv_bfloat16;` and `typedef float real;`: the names a file gives its element types."""
    out = {}
    for node in nodes:
        if node.type == "alias_declaration":
            name, value = node.child_by_field_name("name"), node.child_by_field_name("type")
        elif node.type == "type_definition":
            name, value = node.child_by_field_name("declarator"), node.child_by_field_name("type")
        else:
            continue
        if name is not None and value is not None:
            out[text(name)] = " ".join(text(value).split())
    return out


def _structs(root) -> dict[str, list[tuple[str, str, int, object]]]:
    """The program's structs with scalar or pointer fields (`struct Config { int tokens = 2048; float* x; };`, a
    typedef'd one too): name -> each such field's (name, type, levels of `*`, default member initializer or None)."""
    out: dict[str, list[tuple[str, str, int, object]]] = {}
    for node in root.children:
        spec = node if node.type == "struct_specifier" else node.child_by_field_name("type") \
            if node.type in ("type_definition", "declaration") else None
        body = spec.child_by_field_name("body") if spec is not None and spec.type == "struct_specifier" else None
        if body is None:
            continue
        names = [text(spec.child_by_field_name("name"))] if spec.child_by_field_name("name") is not None else []
        if node.type == "type_definition":
            names += [text(d) for d in node.children_by_field_name("declarator") if d.type == "type_identifier"]
        fields = []
        for f in body.named_children:
            typ = f.child_by_field_name("type") if f.type == "field_declaration" else None
            for d in f.children_by_field_name("declarator") if typ is not None else []:
                pointers = 0
                while d.type == "pointer_declarator":
                    pointers, d = pointers + 1, d.child_by_field_name("declarator")
                if d.type == "field_identifier":
                    fields.append((text(d), " ".join(text(typ).split()), pointers,
                                   f.child_by_field_name("default_value")))
        for name in names:
            out[name] = fields
    return out


def _global_constants(root) -> dict[str, int]:
    """Integer constants fixed at file scope (`#define N 1024`, `constexpr int kThreads = 256;`)."""
    out = {}
    for node in root.children:
        if node.type == "preproc_def" and node.child_by_field_name("value") is not None:
            value = define_value(text(node.child_by_field_name("value")))
            if value is not None:
                out[text(node.child_by_field_name("name"))] = value
        elif node.type == "declaration" and {text(c) for c in node.children if c.type == "type_qualifier"} & {
                "const", "constexpr"}:
            for d in node.children_by_field_name("declarator"):
                name, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
                if d.type == "init_declarator" and name is not None and name.type == "identifier" and value:
                    literal = int_literal(text(value)) if value.type == "number_literal" else None
                    if literal is not None:
                        out[text(name)] = literal
    return out


def _file_variables(root) -> dict[str, int]:
    """The host variables declared at file scope that may change (`static float* d_x;`, `ncclComm_t comm;`): name ->
    line. Not constants, device variables (a kernel's), functions or types."""
    out = {}
    for node in root.children:
        words = {text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if node.type != "declaration" or words & {"const", "constexpr", "__device__", "__constant__", "extern"} or \
                any(c.type in ("__device__", "__constant__", "__shared__") for c in node.children):
            continue
        for d in node.children_by_field_name("declarator"):
            while d is not None and d.type not in ("identifier", "function_declarator"):
                d = d.child_by_field_name("declarator")
            if d is not None and d.type == "identifier":
                out[text(d)] = d.start_point.row + 1
    return out


ONE_BUFFER = ("cuco carries each buffer as a pointer of main()'s own (`float* x;` allocated once), a workload buffer; "
              "declare one per buffer")


def declarators(decl, src: bytes) -> list[Local]:
    """The variables one declaration introduces, with the type and specifiers they are declared with."""
    typ = decl.child_by_field_name("type")
    base = " ".join(text(typ).split()) if typ is not None else "int"
    found = decl.children_by_field_name("declarator")
    if not found:
        return []
    raw = src[decl.start_byte:found[0].start_byte].decode(errors="replace")
    prefix = " ".join(re.sub(r"\bconstexpr\b", "const", re.sub(r"\bstatic\b", "", raw)).split())
    prefix += " " if raw[-1:].isspace() else ""
    out = []
    for d in found:
        target, init = (d.child_by_field_name("declarator"), d.child_by_field_name("value")) \
            if d.type == "init_declarator" else (d, None)
        pointers = 0
        while target is not None and target.type == "pointer_declarator":
            pointers, target = pointers + 1, target.child_by_field_name("declarator")
        ident = next((n for n in walk(target) if n.type == "identifier"), None) if target is not None else None
        if ident is None:
            continue
        loc = Local(text(ident), line_of(d), d.start_byte, base, pointers, prefix, d, init)
        if target.type != "identifier":
            shown = " ".join(f"{base}{'' if text(d).startswith('*') else ' '}{text(d)}".split())
            loc.why = f"an array of pointers (`{shown}`): {ONE_BUFFER}" if pointers and \
                target.type == "array_declarator" else f"declared as `{shown}`: cuco carries scalars, pointers and " \
                                                        "handles"
        out.append(loc)
    return out
