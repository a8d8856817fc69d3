"""L0: checks that need no compiler. A candidate may not time itself, exit, sleep, reach the process or the runner,
or call the reference.

CUDA sources get a quick regex pass here, for early feedback; cuda_checks.py repeats it on what the compiler really
sees (after preprocessing) and on the built library. Python sources are checked on their syntax tree, so comments
and strings cannot trigger a rule and an alias cannot hide an import; the tree is of the very text that the loader
runs (`python_text`).
"""

from __future__ import annotations

import ast
import codecs
import re
from dataclasses import dataclass
from pathlib import Path

from cuco.language import is_cuda
from cuco.program.blocks import marker_problems

# (pattern, why) -- matched on source with comments and string literals removed.
FORBIDDEN_CUDA = [
    (r"\bcudaEventElapsedTime\b|\bclock_gettime\b|\bgettimeofday\b|std::chrono", "timing is the runner's job"),
    (r"\b(exit|_exit|abort|quick_exit)\s*\(", "a candidate may not end the process"),
    (r"\b(sleep|usleep|nanosleep)\s*\(|this_thread::sleep", "no sleeping on the host"),
    (r"\bcudaDeviceReset\b", "the runner owns the device"),
    (r"\bcudaStreamCreate\w*\s*\(", "use ctx->stream and ctx->sideStreams: only those are gated and timed"),
    (r"\bncclCommInit\w*\b|\bncclCommDestroy\b|\bncclCommSplit\b", "use ctx->comm: the runner owns the communicator"),
    (r"\bgetenv\s*\(", "candidates must not read the environment"),
]
REQUIRED_CUDA = ["cuco_setup", "cuco_run", "cuco_teardown"]
REQUIRED_PY = ["run"]

TIMING = "timing is the runner's job"
PROCESS = "a candidate may not end, signal or inspect the process"
SPAWN = "a candidate may not start processes or threads"
NATIVE = "a candidate may not load native code or build code at run time"
FILES = "a candidate may not touch the files, the network or the environment"
RUNNER = "a candidate may not reach the runner"
REFERENCE = "a candidate may not call the reference"


def table(groups: dict[str, str]) -> dict[str, str]:
    """{why: 'name name ...'} -> {name: why}."""
    return {name: why for why, names in groups.items() for name in names.split()}


# Any component of an imported module's dotted name (torch.multiprocessing counts as multiprocessing).
FORBIDDEN_MODULES = table({
    TIMING: "time timeit",
    PROCESS: "sys signal faulthandler atexit resource gc tracemalloc inspect",
    SPAWN: "subprocess multiprocessing threading _thread concurrent asyncio pty _posixsubprocess",
    NATIVE: "ctypes _ctypes cffi importlib runpy code builtins pickle marshal zipimport pkgutil cpp_extension mmap",
    FILES: "os posix pathlib shutil io _io fcntl tempfile glob socket select selectors site sysconfig",
    RUNNER: "cuco __main__",
    REFERENCE: "reference",
})
# Bare names of builtins: flagged wherever they are used (an alias `f = eval` is caught too), unless the module
# defines a top-level function or class of that name.
FORBIDDEN_BUILTINS = table({
    "a candidate may not end the process": "exit quit",
    "a candidate may not stop in a debugger": "breakpoint",
    NATIVE: "__import__ eval exec compile",
    FILES: "open",
    "a candidate may not reach the module's or the runner's namespaces": "globals vars __builtins__",
})
FORBIDDEN_ATTRS = table({
    TIMING: "elapsed_time perf_counter perf_counter_ns monotonic monotonic_ns process_time process_time_ns "
            "thread_time time_ns do_bench",
    "frames and function internals reach the runner": "__globals__ __code__ __builtins__ __subclasses__ "
                                                      "__getattribute__ __closure__ f_back f_globals f_locals "
                                                      "f_builtins _getframe tb_frame gi_frame cr_frame",
    # a namespace read as a mapping (module.__dict__["exec"]), the class graph, a builtin's own module
    # (len.__self__ is builtins), and attribute access by a name held in a string
    "namespaces reach what a candidate may not name": "__dict__ __mro__ __base__ __bases__ __self__ __reduce__ "
                                                      "__reduce_ex__ attrgetter methodcaller",
    # a module's loader reads any file (torch.__loader__.get_data(path)) without open() or os
    FILES: "environ getenv putenv unsetenv __loader__ __spec__ get_data get_filename",
    SPAWN: "system popen Popen fork forkpty execv execve execl execle execlp execlpe execvp execvpe spawnv spawnve "
           "spawnvp spawnvpe spawnl spawnle posix_spawn posix_spawnp",
    PROCESS: "kill killpg _exit abort",
    NATIVE: "load_library load_inline cpp_extension",
    # modules reached through another module's attributes (torch.serialization.os)
    "a candidate may not reach the process, the files or the runner": "os sys subprocess ctypes builtins importlib "
                                                                      "multiprocessing threading _thread shutil "
                                                                      "pickle marshal runpy socket pathlib "
                                                                      "faulthandler atexit mmap posix __main__ cuco",
})
FORBIDDEN_STRINGS = {
    "reference.py": REFERENCE,
    "/proc/": "a candidate may not read the process's state",
    **{name: "frames and function internals reach the runner" for name in
       ("__globals__", "__code__", "__builtins__", "__subclasses__", "__getattribute__", "__import__")},
}
ATTR_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}


@dataclass
class StaticReport:
    ok: bool
    problems: list[str]


class SourceError(ValueError):
    """A Python source whose bytes the importer would not read as the UTF-8 text that the checks read."""


# PEP 263: a comment in the first two lines that names the source's encoding (the tokenizer's own rule).
CODING_DECLARATION = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
# Byte order marks of other encodings than UTF-8 (UTF-32's first: UTF-16's is its prefix).
FOREIGN_BOMS = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16",
                codecs.BOM_UTF16_BE: "UTF-16"}
UTF8_ONLY = "a candidate's source is UTF-8: in any other encoding the interpreter runs other code than the checks read"


def _is_utf8(name: str) -> bool:
    """Whether the interpreter decodes a declaration of `name` as UTF-8 (it maps utf_8, UTF-8-sig, utf8... there)."""
    normal = name[:12].lower().replace("_", "-")
    if normal == "utf-8" or normal.startswith("utf-8-"):
        return True
    try:
        return codecs.lookup(name).name == "utf-8"
    except LookupError:
        return False


def python_text(data: bytes, name: str) -> str:
    """The text of a Python source, for the checks and the loader alike: its bytes as UTF-8, a UTF-8 byte order mark
    dropped. A declaration of any other encoding is refused rather than followed, since decoding is where text and
    code part: in UTF-7 a comment can hold whole lines of code. SourceError names the file and line."""
    for bom, encoding in FOREIGN_BOMS.items():
        if data.startswith(bom):
            raise SourceError(f"{name}:1: forbidden {encoding} byte order mark: {UTF8_ONLY}")
    data = data.removeprefix(codecs.BOM_UTF8)
    for line, text in enumerate(data.splitlines()[:2], 1):
        declared = CODING_DECLARATION.match(text)
        encoding = declared.group(1).decode("ascii") if declared else "utf-8"
        if not _is_utf8(encoding):
            raise SourceError(f"{name}:{line}: forbidden coding declaration {encoding!r}: {UTF8_ONLY}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = len(data[:exc.start + 1].splitlines())
        raise SourceError(f"{name}:{line}: not UTF-8 ({exc.reason}): {UTF8_ONLY}") from None


def _strip_c(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


# cuco's device-side library for Python candidates (Triton kernels), as cuco/cuda/include is for CUDA ones.
KERNELS = "cuco.kernels"


def _module_problem(dotted: str) -> tuple[str, str] | None:
    if dotted == KERNELS or dotted.startswith(KERNELS + "."):
        return None
    for part in dotted.split("."):
        if part in FORBIDDEN_MODULES:
            return part, FORBIDDEN_MODULES[part]
    return None


def _import_problems(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(what, why) for each forbidden module an import statement names."""
    if isinstance(node, ast.ImportFrom) and node.level:
        return [("relative import", "a candidate is one file: a relative import reaches its neighbours")]
    found = []
    if isinstance(node, ast.ImportFrom):
        dotted = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        dotted = [a.name for a in node.names]
        # `import cuco.kernels.gemm` binds the name cuco, and cuco's other modules hang off it
        found += [(f"import {a.name!r} without 'as'", "it binds the name cuco, which reaches the runner: "
                   f"write `import {a.name} as ...` or `from {a.name} import ...`")
                  for a in node.names if a.name.startswith(KERNELS) and a.asname is None]
    for name in dotted:
        hit = _module_problem(name)
        if hit and (f"import {hit[0]!r}", hit[1]) not in found:
            found.append((f"import {hit[0]!r}", hit[1]))
    if isinstance(node, ast.ImportFrom) and not found:  # `from operator import attrgetter`: the attribute, renamed
        found += [(f"import {a.name!r}", FORBIDDEN_ATTRS[a.name]) for a in node.names if a.name in FORBIDDEN_ATTRS]
    return found


def _shadowed_builtins(tree: ast.Module) -> set[str]:
    """Builtin names the module redefines at top level (a `def exit` of its own), and never deletes."""
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    deleted = {t.id for n in ast.walk(tree) if isinstance(n, ast.Delete) for t in n.targets if isinstance(t, ast.Name)}
    return (defined - deleted) & set(FORBIDDEN_BUILTINS)


def _attr_function_problem(node: ast.Call) -> tuple[str, str] | None:
    """getattr(x, name) and friends: a literal name is checked like an attribute, a computed one is refused."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCTIONS and len(node.args) >= 2):
        return None
    name = node.args[1]
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        why = FORBIDDEN_ATTRS.get(name.value)
        return (f"attribute {name.value!r} (through {node.func.id})", why) if why else None
    return f"{node.func.id}() with a computed name", "a computed attribute name hides what it reaches"


def _node_problems(node: ast.AST, shadowed: set[str]) -> list[tuple[str, str]]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _import_problems(node)
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS and node.id not in shadowed:
        return [(f"name {node.id!r}", FORBIDDEN_BUILTINS[node.id])]
    if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
        return [(f"attribute '.{node.attr}'", FORBIDDEN_ATTRS[node.attr])]
    if isinstance(node, ast.Call):
        hit = _attr_function_problem(node)
        return [hit] if hit else []
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        value = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
        return [(f"string mentioning {s!r}", why) for s, why in FORBIDDEN_STRINGS.items() if s in value]
    return []


def check_python_tree(tree: ast.Module, name: str) -> list[str]:
    """Forbidden imports, builtins, attributes and strings, and the required top-level `def run`."""
    shadowed = _shadowed_builtins(tree)
    found = sorted((getattr(node, "lineno", 0), what, why) for node in ast.walk(tree)
                   for what, why in _node_problems(node, shadowed))
    problems = [f"{name}:{line}: forbidden {what}: {why}" for line, what, why in found]
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    problems += [f"{name}: defines no {req}()" for req in REQUIRED_PY if req not in defined]
    return problems


def _check_python(path: Path, text: str) -> list[str]:
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError:
        # Not an L0 problem: L1 reports the syntax error with its line. Only what can be read textually is checked.
        return [f"{path.name}: defines no {req}()" for req in REQUIRED_PY
                if not re.search(rf"^def\s+{req}\s*\(", text, flags=re.M)]
    except ValueError as exc:  # null bytes
        return [f"{path.name}: not a Python source: {exc}"]
    return check_python_tree(tree, path.name)


def _unconditional(code: str) -> str:
    """The code outside #if/#ifdef blocks (lines kept, blanked inside): which branches count is only known after
    preprocessing, where L1 checks them (cuda_checks.py)."""
    out, depth = [], 0
    for line in code.split("\n"):
        directive = line.strip()
        if re.match(r"#\s*if", directive):
            depth += 1
        elif re.match(r"#\s*endif", directive):
            depth = max(0, depth - 1)
            out.append("")
            continue
        out.append("" if depth else line)
    return "\n".join(out)


def _check_cuda(path: Path, text: str) -> list[str]:
    """Quick feedback on the source as written; the binding checks run at L1 on what the compiler sees."""
    code = _unconditional(_strip_c(text))
    problems = []
    for pattern, why in FORBIDDEN_CUDA:
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{path.name}:{line}: forbidden {m.group(0).strip()!r}: {why}")
    for name in REQUIRED_CUDA:
        if not re.search(rf"\b{name}\s*\(", code):
            problems.append(f"{path.name}: defines no {name}()")
    return problems


def check_source(path: Path) -> StaticReport:
    if is_cuda(path):
        text = path.read_text(errors="replace")
        return _report(marker_problems(text) + _check_cuda(path, text))
    try:
        text = python_text(path.read_bytes(), path.name)
    except SourceError as exc:
        return _report([str(exc)])
    return _report(marker_problems(text) + _check_python(path, text))


def _report(problems: list[str]) -> StaticReport:
    return StaticReport(not problems, problems)
