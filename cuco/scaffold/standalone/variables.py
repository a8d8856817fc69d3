"""What each local of main() is to the runner: the launcher's rank variables, the communicator and streams it
owns, a size that becomes a parameter, a scalar, a device buffer, a handle, or something cuco cannot carry."""

from __future__ import annotations

from cuco.fastpath.analyze import ALLOCATORS
from cuco.fastpath.syntax import call_args, callee, text, walk
from cuco.scaffold.declarations import parameters
from cuco.scaffold.standalone.calls import COMM_INIT, DEFAULT_STREAMS, HANDLE_CREATE, RESULTS
from cuco.scaffold.standalone.nodes import address_of, calls_in, idents, line_of, strings_in
from cuco.scaffold.standalone.program import ONE_BUFFER, Local, Standalone, declarators
from cuco.scaffold.standalone.sizes import Sizes

# Environment variables that launchers set, by what they tell.
RANK_ENV = frozenset({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"})
WORLD_ENV = frozenset({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE"})
LOCAL_ENV = frozenset({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                       "MV2_COMM_WORLD_LOCAL_RANK"})
INT_TYPES = frozenset({"int", "unsigned", "unsigned int", "long", "long int", "long long", "unsigned long",
                       "unsigned long long", "short", "size_t", "std::size_t", "ssize_t", "int32_t", "int64_t",
                       "uint32_t", "uint64_t", "std::int32_t", "std::int64_t", "std::uint32_t", "std::uint64_t"})
STREAM_CREATE = frozenset({"cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority"})


RUNTIME_TYPES = {"ncclComm_t": "a communicator", "cudaStream_t": "a stream", "ncclUniqueId": "the NCCL unique id",
                 "cudaEvent_t": "an event", "cudaGraph_t": "a CUDA graph", "cudaGraphExec_t": "a CUDA graph",
                 "cublasHandle_t": "a cuBLAS handle", "cublasLtHandle_t": "a cuBLASLt handle", "FILE": "a file"}


HOST_ALLOCATORS = ("cudaMallocHost", "cudaHostAlloc", "cudaMallocManaged")  # pinned or managed memory


class Locals:
    """What each local of main() declared outside the step is: runner-owned, a size, a buffer, a handle."""

    def __init__(self, prog: Standalone, outside: list, setup: list) -> None:
        self.prog = prog
        self.allocs: dict[str, object] = {}  # device pointer -> its allocation call
        self.creates: dict[str, object] = {}  # handle -> its creation call
        self.streams: list[str] = []
        params = prog.main.child_by_field_name("declarator")
        plist = next((n for n in walk(params) if n.type == "parameter_list"), None)
        self.argv = [loc.name for p in (plist.named_children if plist else []) for loc in declarators(p, prog.src)]
        for stmt in outside:
            if stmt.type == "declaration":
                for loc in declarators(stmt, prog.src):
                    prog.locals.setdefault(loc.name, loc)
        for loc in list(prog.locals.values()):
            self.fields_of(loc)
        for loc in prog.locals.values():
            self.first_kind(loc)
        for name in self.argv:
            prog.locals[name] = Local(name, line_of(prog.main), 0, "", 0, "", None, None, "argv")
        for stmt in outside:
            for call in calls_in(stmt):
                self.from_call(call, stmt in setup)
        for stmt in setup:
            self.from_assignments(stmt)
        for loc in prog.locals.values():
            if loc.kind == "param":
                loc.value = self.value(loc)

    def fields_of(self, loc: Local) -> None:
        """A struct of the program's, declared in main() without a value (`Config cfg;`, a context `Ctx c;`): its
        scalar and pointer fields become locals of their own (`cfg.tokens`, from their default member initializers),
        read and set like any local: a size, the communicator, a stream, a buffer."""
        fields = self.prog.structs.get(loc.base.removeprefix("struct ").strip())
        if fields is None or loc.pointers or loc.why or (loc.init is not None and text(loc.init) != "{}"):
            return
        loc.kind = "struct"
        for i, (name, base, pointers, default) in enumerate(fields):
            self.prog.locals[f"{loc.name}.{name}"] = Local(f"{loc.name}.{name}", loc.line, loc.order + i, base,
                                                           pointers, "", None, default)

    def reads_input(self, node) -> bool:
        """Whether an expression reads argv or the environment, itself or through a variable that holds the text
        (`const char* s = getenv("N")`); one computed from a size the program reads is not an input of its own."""
        if node is None:
            return False
        names = idents(node)
        return bool(names & {*self.argv[1:2], "optarg"}) or any(  # optarg: getopt's value of an option
            (loc := self.prog.locals.get(n)) is not None and loc.reads_input and loc.kind != "param"
            for n in names) or any(
            callee(c) in ("getenv", "secure_getenv", "std::getenv") or callee(c) in self.prog.env_functions
            for c in calls_in(node))

    def first_kind(self, loc: Local) -> None:
        """What a declaration alone says: the launcher's rank variables, a size, a scalar, or runner-owned."""
        if loc.kind == "struct":
            return
        envs = strings_in(loc.init) if loc.init is not None else set()
        owned = next((why for t, why in RUNTIME_TYPES.items() if loc.base.endswith(t)), None)
        if envs & RANK_ENV or envs & WORLD_ENV or envs & LOCAL_ENV:
            loc.kind = "rank" if envs & RANK_ENV else "world" if envs & WORLD_ENV else "local_rank"
        elif loc.base == "cudaStream_t" and loc.init is not None and text(loc.init) in DEFAULT_STREAMS:
            loc.kind = "stream"
        elif loc.why or owned:
            loc.why = loc.why or f"{owned}, which the runner owns or cuco does not carry"
        elif loc.init is None:
            loc.why = "declared without a value, and set in a way cuco does not follow"
        elif "<" in loc.base or loc.base.startswith("std::"):
            loc.why = f"a host container of device pointers (`{loc.ctype}`): {ONE_BUFFER}" if "*" in loc.base else \
                f"host data (`{loc.ctype}`): the runner gives the step its inputs, in the workload's buffers"
        elif self.reads_input(loc.init):
            loc.reads_input = True
            loc.kind = "param" if loc.base in INT_TYPES and not loc.pointers else "other"
            loc.why = "" if loc.kind == "param" else ("read from the command line or the environment, and only "
                                                      "integer sizes can become parameters (cuco_param)")
        elif loc.base in INT_TYPES and not loc.pointers and Sizes(self.prog).value(loc.init) is not None:
            loc.kind = "param"
        elif loc.pointers and text(loc.init) in ("nullptr", "NULL", "0"):
            loc.why = "a pointer the set-up does not allocate with cudaMalloc or ncclMemAlloc"
        elif loc.pointers and loc.init.type == "call_expression" and callee(loc.init) in self.prog.functions:
            helper = callee(loc.init)  # `float* x = alloc_floats(n);` that stayed a call
            why = self.prog.unit.unwritten.get(helper)
            loc.why = f"a pointer {helper}() returns, which cuco did not write out in place" + (
                f" (it {why})" if why else "")
        else:
            loc.kind = "scalar"

    def mark(self, name: str | None, kind: str) -> None:
        loc = self.prog.locals.get(name or "")
        if loc is not None and loc.kind != "argv":
            loc.kind, loc.why = kind, ""

    def from_call(self, call, before: bool) -> None:
        """What the program's calls outside the step make of the locals they are given; a call before the step
        that writes a size or a scalar through its address makes it one cuco cannot follow."""
        name, args = callee(call), call_args(call)
        first = address_of(args[0]) if args else None
        if name in COMM_INIT and len(args) >= 4:
            self.mark(first, "comm")
            self.mark(text(args[1]), "world")
            self.mark(text(args[3]), "rank")
        elif name in ("MPI_Comm_rank", "MPI_Comm_size", "ncclCommUserRank", "ncclCommCount") and len(args) == 2:
            self.mark(address_of(args[1]), "rank" if name.endswith(("rank", "Rank")) else "world")
        elif name == "cudaGetDevice" and first:
            self.mark(first, "local_rank")
        elif name in STREAM_CREATE and first:
            self.mark(first, "stream")
            self.streams.append(first)
        elif name in ALLOCATORS and first in self.prog.locals:
            self.mark(first, "device")
            self.allocs.setdefault(first, call)
        elif name in HANDLE_CREATE and first in self.prog.locals:
            self.mark(first, "handle")
            self.creates[first] = call
        elif name in RESULTS and max(RESULTS[name]) < len(args):
            made, count = (address_of(args[i]) for i in RESULTS[name])
            if made in self.prog.locals:
                self.mark(made, "handle")
                self.creates[made] = call
            if count in self.prog.locals and self.prog.locals[count].kind != "argv":
                self.prog.locals[count].kind = "scalar"  # how many it found: read by the set-up's own check
        elif name == "ncclCommSplit" and len(args) >= 4 and address_of(args[3]) in self.prog.locals:
            loc = self.prog.locals[address_of(args[3])]
            loc.kind, loc.why = "other", (f"a communicator split from another ({name}, {self.prog.at(line_of(call))}): "
                                          "cuco runs the step on the runner's one communicator of every rank "
                                          "(ctx->comm), so a program on sub-communicators (2-D parallelism) is not "
                                          "one it converts")
        elif before and not (self.prog.kind(call) == "blas_config" and "Set" in name):  # a setter reads &value
            self.written_by(call, name)

    def written_by(self, call, name: str) -> None:
        for i, arg in enumerate(call_args(call)):
            loc = self.prog.locals.get(address_of(arg) or "")
            if loc is not None and loc.kind == "struct":  # the whole struct, written where cuco cannot see
                filled = self.filled(name, i)
                for field in (f for n, f in self.prog.locals.items() if n.startswith(f"{loc.name}.")):
                    value = filled.get(field.name.rsplit(".", 1)[1], False) if filled is not None else None
                    size = field.base in INT_TYPES and not field.pointers
                    if value is True and size:  # read from the command line: a size the program is given
                        field.reads_input, field.kind, field.why = True, "param", ""
                    elif value not in (True, False, None) and size and Sizes(self.prog).value(value) is not None:
                        field.init, field.kind, field.why = value, "param", ""  # the constant the helper gives it
                    elif value is not False:
                        field.kind, field.why = "other", f"set by {name} ({self.prog.at(line_of(call))})"
                continue
            if loc is not None and loc.kind in ("param", "scalar", "other") and not loc.why.startswith("set by"):
                loc.kind, loc.why = "other", f"set by {name} ({self.prog.at(line_of(call))})"
                if name in HOST_ALLOCATORS:
                    loc.why += (", host memory: the runner gives cuco_run device buffers only, and the step may not "
                                "wait to read device data on the host; keep what the step reads on the device")

    def filled(self, name: str, position: int) -> dict[str, object] | None:
        """A helper of the program's that fills the struct it is given at POSITION, as an argument parser or a
        defaults function does (`cfg->batch = atoi(argv[i + 1]);`, `c->hidden = 4096;`) and does nothing else cuco
        must see: each field it assigns, with True where the value reads the command line or the environment, else
        the value (a node). None for any other function."""
        fn = self.prog.functions.get(name)
        params = [p.name for p in parameters(fn)] if fn is not None else []
        if fn is None or position >= len(params) or any(self.prog.kind(c) != "host" for c in calls_in(fn)):
            return None
        me = params[position]
        out: dict[str, object] = {}
        for node in walk(fn.child_by_field_name("body")):
            left = node.child_by_field_name("left") if node.type == "assignment_expression" else None
            if left is None or (left.type == "identifier" and text(left) not in params):
                continue  # none, or a local of its own (the index over argv)
            if left.type != "field_expression" or text(left.child_by_field_name("argument")) != me:
                return None  # it writes something else too
            value = node.child_by_field_name("right")
            field = text(left.child_by_field_name("field"))
            reads = bool(idents(value) & set(params[:position] + params[position + 1:])) or self.reads_input(value)
            out[field] = True if reads or field in out else value  # assigned twice: as read from input
        return out

    def from_assignments(self, stmt) -> None:
        """A size the set-up overrides from argv or the environment stays a parameter; any other change makes
        the variable one cuco cannot follow (a communicator swapped with another too)."""
        for call in (c for c in calls_in(stmt) if callee(c).endswith("swap")):
            for arg in call_args(call):
                loc = self.prog.locals.get(text(arg))
                if loc is not None and loc.kind == "comm":
                    loc.kind, loc.why = "other", (f"a communicator swapped at {self.prog.at(line_of(call))}: cuco "
                                                  "runs the step on the runner's communicator of every rank")
        for node in walk(stmt):
            if node.type not in ("assignment_expression", "update_expression"):
                continue
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            loc = self.prog.locals.get("".join(text(target).split()) if target is not None else "")
            if loc is not None and loc.kind == "comm":  # `comm = sub;` after a split: not the ranks ctx->comm spans
                loc.kind, loc.why = "other", (f"a communicator assigned again at {self.prog.at(line_of(node))}: "
                                              "cuco runs the step on the runner's communicator of every rank")
                continue
            if loc is None or loc.kind not in ("param", "scalar", "other"):
                continue
            value = node.child_by_field_name("right")
            if "." in loc.name and loc.init is None and value is not None and \
                    text(node.child_by_field_name("operator")) == "=":  # a field's first value: `c.n = 1 << 20;`
                loc.init, loc.why, loc.set_at = value, "", line_of(node)
                self.first_kind(loc)
                continue
            envs = strings_in(value) if value is not None else set()
            if envs & (RANK_ENV | WORLD_ENV | LOCAL_ENV):
                loc.kind = "rank" if envs & RANK_ENV else "world" if envs & WORLD_ENV else "local_rank"
            elif node.type == "assignment_expression" and loc.kind == "param" and self.reads_input(value):
                loc.reads_input = True
            else:
                loc.kind, loc.why = "other", f"assigned again at {self.prog.at(line_of(node))}"

    def value(self, loc: Local) -> int | None:
        """A parameter's value in the program: its constant, or the default it falls back to without input."""
        sizes, init = Sizes(self.prog), loc.init
        if not self.reads_input(init):
            return sizes.value(init)
        if init.type == "conditional_expression":
            yes, no = init.child_by_field_name("consequence"), init.child_by_field_name("alternative")
            if self.reads_input(yes) != self.reads_input(no):
                return sizes.value(no if self.reads_input(yes) else yes)
        if init.type == "call_expression":
            values = (sizes.value(a) for a in call_args(init) if a.type != "string_literal")
            found = [v for v in values if v is not None]
            return found[0] if len(found) == 1 else None
        return None
