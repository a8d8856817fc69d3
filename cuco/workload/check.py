"""A workload checked without a GPU, before anything is built or run: one line per problem, nothing raised.

Four things break an evaluation long after it started and far from their cause: a .cu program without the entry
points the runner calls (cuco_setup, cuco_run, cuco_teardown, with C linkage), one that looks up a buffer or a
parameter workload.toml does not declare (cuco_buffer returns NULL, cuco_param -1), a reference.py that does
not import, and a make_inputs or reference that fails, or returns tensors of other shapes or types than
workload.toml declares. Each is found here on the CPU, at every small shape, calling the two functions exactly as
the judge does (cuco/runner/judge/): make_inputs(params, world, rank, gen, device) for each rank with its own
torch.Generator (and make_parameters, where the workload draws its weights apart), then reference(params,
world, rank, inputs of every rank), one rank at a time.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any

from cuco.dtypes import torch_dtype
from cuco.errors import CucoError
from cuco.extras import install_hint
from cuco.language import is_cuda
from cuco.workload.reference import ReferenceMissing, load_reference
from cuco.workload.spec import DELIVERED, VERIFIED, BufferSpec, Shape, WorkloadSpec, load_workload

ENTRY_POINTS = ("cuco_setup", "cuco_run", "cuco_teardown")  # what the runner looks up in a .cu candidate (cuco.h)
# `cuco_buffer(ctx, "x")`, `cuco_param(ctx, "N")`: the name is the string the program looks up.
LOOKUP = re.compile(r'\bcuco_(buffer|param)\s*\(\s*[^,()]*(?:\([^()]*\)[^,()]*)*,\s*"((?:[^"\\\n]|\\.)*)"\s*\)')
COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)
MESSAGE_CHARS = 300  # of an exception's message, on its one line


def check_workload(root: Path, candidate: Path | None = None) -> list[str]:
    """The workload's problems, one line each (empty: none found): the names the seed (or the .cu candidate) looks
    up, reference.py's import, and its make_inputs and reference at every small shape against workload.toml."""
    root = Path(root)
    try:
        spec = load_workload(root)
    except CucoError as exc:
        return [str(exc)]
    except Exception as exc:  # the loader's own failure is still one line
        return [f"{root / 'workload.toml'}: cannot load: {_message(exc)}"]
    program = Path(candidate) if candidate is not None else spec.seed_path
    problems = entry_points(spec, program) + lookups(spec, program) if program is not None else []
    return problems + reference_problems(spec)


# ---- names the program looks up ------------------------------------------------------------------------------

def _blank_comments(src: str) -> str:
    """Comments blanked (newlines kept, so lines still count), strings kept."""
    def blank(m: re.Match) -> str:
        return m.group(0) if m.group(0)[:1] in "\"'" else re.sub(r"[^\n]", " ", m.group(0))

    return COMMENT_OR_STRING.sub(blank, src)


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def lookups(spec: WorkloadSpec, program: Path) -> list[str]:
    """Every cuco_buffer / cuco_param name a .cu program looks up that workload.toml does not declare, with the
    file and line of the use."""
    if not is_cuda(program):
        return []
    shown = _shown(program, spec.root)
    try:
        src = _blank_comments(program.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        return [f"{shown}: cannot read: {exc.strerror or exc}"]
    declared = {"buffer": sorted(spec.buffers), "param": list(spec.params)}
    problems = []
    for m in LOOKUP.finditer(src):
        kind, name = m.group(1), m.group(2)
        if name not in declared[kind]:
            line = src.count("\n", 0, m.start()) + 1
            noun = "buffer" if kind == "buffer" else "parameter (params)"
            problems.append(f"{shown}:{line}: cuco_{kind}(ctx, {name!r}): workload.toml declares no {noun} {name!r} "
                            f"(it has: {', '.join(declared[kind]) or 'none'})")
    return problems


def _code_only(src: str) -> str:
    """Comments and string literals blanked (newlines kept), but the "C" of `extern "C"`: what declares code."""
    def blank(m: re.Match) -> str:
        return m.group(0) if m.group(0) == '"C"' else re.sub(r"[^\n]", " ", m.group(0))

    return COMMENT_OR_STRING.sub(blank, src)


def _c_linkage_blocks(code: str) -> list[tuple[int, int]]:
    """The byte ranges of `extern "C" { ... }` blocks."""
    spans = []
    for m in re.finditer(r'\bextern\s+"C"\s*\{', code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        spans.append((m.start(), i))
    return spans


def entry_points(spec: WorkloadSpec, program: Path) -> list[str]:
    """Each entry point a .cu program does not define with C linkage: the runner finds cuco_setup, cuco_run and
    cuco_teardown by their C names, so one missing, or mangled as C++, fails only once the program is built and run
    on GPUs."""
    if not is_cuda(program):
        return []
    shown = _shown(program, spec.root)
    try:
        code = _code_only(program.read_text(encoding="utf-8", errors="replace"))
    except OSError:  # lookups() says so, once
        return []
    blocks = _c_linkage_blocks(code)
    problems = []
    for name in ENTRY_POINTS:
        declare = f"CUCO_EXPORT int {name}(cuco_ctx_t* ctx)"
        found = list(re.finditer(rf"\b{name}\s*\([^(){{}};]*\)\s*([;{{])", code))  # declarations, definitions, calls
        definition = next((m for m in found if m.group(1) == "{"), None)
        if definition is None:
            problems.append(f"{shown}: defines no {name}(): the runner calls cuco_setup, cuco_run and cuco_teardown "
                            f"(cuco.h); declare it {declare}")
        elif not any(_c_linkage(code, m.start(), blocks) for m in found):  # a C declaration carries to the definition
            line = code.count("\n", 0, definition.start()) + 1
            problems.append(f"{shown}:{line}: {name}() has C++ linkage, so the runner cannot find it by its name; "
                            f"declare it {declare}")
    return problems


def _c_linkage(code: str, start: int, blocks: list[tuple[int, int]]) -> bool:
    """Whether the declaration whose name starts at START has C linkage: CUCO_EXPORT or `extern "C"` among its
    specifiers, or inside an `extern "C" { }` block."""
    head = code[max(code.rfind(c, 0, start) for c in ";{}") + 1:start]
    return "CUCO_EXPORT" in head or bool(re.search(r'\bextern\s+"C"', head)) or any(a < start < b for a, b in blocks)


# ---- reference.py --------------------------------------------------------------------------------------------

def _message(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    text = text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def _where(exc: BaseException, path: Path) -> str:
    """reference.py and the line in it where the exception was raised (its deepest frame there)."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "") == path:
        lines.append(exc.lineno)
    return f"{path.name}:{lines[-1]}" if lines else path.name


def _import(spec: WorkloadSpec) -> tuple[Any, str | None]:
    """reference.py loaded as the judge loads it (cuco.workload.reference)."""
    path = spec.reference_path
    try:
        return load_reference(spec), None
    except KeyboardInterrupt:
        raise
    except ReferenceMissing as exc:  # no make_inputs() or no reference(): the judge's line, the file by its name
        return None, str(exc).replace(str(path), path.name, 1)
    except BaseException as exc:  # a reference that calls exit() is still one line
        return None, f"{_where(exc, path)}: importing it raised {_message(exc)}"


def _tensor_problem(what: str, t: Any, buf: BufferSpec, dims: tuple[int, ...], exact: bool) -> str | None:
    """Why t is not what the buffer holds: a CPU tensor of its shape, of its dtype (an input, exactly) or of its
    kind (an output: the judge compares in float64, so any floating type at least as precise, or any integer)."""
    import torch

    if not isinstance(t, torch.Tensor):
        return f"{what} is a {type(t).__name__}, not a torch.Tensor"
    if tuple(t.shape) != dims:
        return f"{what} has shape {tuple(t.shape)}; workload.toml declares {list(buf.shape)} = {dims}"
    want = torch_dtype(buf.dtype)
    if exact and t.dtype != want:
        return f"{what} is {t.dtype}; workload.toml declares {buf.dtype} ({want})"
    if not exact and t.dtype.is_floating_point != want.is_floating_point:
        kind = "floating-point" if want.is_floating_point else "integer"
        return f"{what} is {t.dtype}; workload.toml declares {buf.dtype}: a {kind} reference is needed"
    if not exact and want.is_floating_point and torch.finfo(t.dtype).bits < torch.finfo(want).bits:
        return f"{what} is {t.dtype}, less precise than the {buf.dtype} output it is the reference of"
    if t.device.type != "cpu":
        return f"{what} is on {t.device}, not on the device it was asked for (cpu)"
    return None


def _checked(what: str, got: Any, buffers: list[BufferSpec], env: dict[str, int], exact: bool) -> list[str]:
    if not isinstance(got, dict):
        return [f"{what} returned a {type(got).__name__}, not a dict of tensors by buffer name"]
    problems = []
    for buf in buffers:
        if buf.name not in got:
            problems.append(f"{what} returned no {buf.name!r} (it returned: {', '.join(map(str, got)) or 'nothing'})")
            continue
        bad = _tensor_problem(repr(buf.name), got[buf.name], buf, buf.dims(env), exact)
        if bad is not None:
            problems.append(f"{what}: {bad}")
    return problems


def _call(fn, path: Path, what: str, *args) -> tuple[Any, str | None]:
    try:
        return fn(*args), None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code: any failure, exit() too, is a problem line
        return None, f"{_where(exc, path)}: {what} raised {_message(exc)}"


def _at_shape(mod, spec: WorkloadSpec, shape: Shape, index: int) -> list[str]:
    """make_inputs for every rank, then reference for every rank, at one shape; stops at the first problem."""
    import torch

    world, env, path = spec.world_size, shape.env(spec.world_size), spec.reference_path
    drawn = [(mod.make_inputs, "make_inputs", [b for b in spec.buffers.values() if b.role in DELIVERED])]
    parameters = [b for b in spec.buffers.values() if b.role == "parameter"]
    if mod.make_parameters is not None:
        drawn.append((mod.make_parameters, "make_parameters", parameters))
    else:  # make_inputs draws the weights too
        drawn[0][2].extend(parameters)
    outputs = [b for b in spec.buffers.values() if b.role in VERIFIED]
    everyone = []
    for rank in range(world):
        mine: dict[str, Any] = {}
        for fn, name, buffers in drawn:
            what = f"{name} at small shape {shape.name!r}, rank {rank}"
            gen = torch.Generator(device="cpu").manual_seed(index * 1_000_003 + rank)
            got, failed = _call(fn, path, what, dict(shape.params), world, rank, gen, torch.device("cpu"))
            problems = [failed] if failed else [f"{path.name}: {p}" for p in _checked(what, got, buffers, env, True)]
            if problems:
                return problems
            mine.update(got)
        everyone.append(mine)
    for rank in range(world):
        what = f"reference at small shape {shape.name!r}, rank {rank}"
        got, failed = _call(mod.reference, path, what, dict(shape.params), world, rank, everyone)
        problems = [failed] if failed else [f"{path.name}: {p}" for p in _checked(what, got, outputs, env, False)]
        if problems:
            return problems
    return []


def reference_problems(spec: WorkloadSpec) -> list[str]:
    """reference.py imported and run on the CPU at every small shape, up to the first that fails."""
    try:
        import torch  # noqa: F401 - the reference's own dependency, named before it is imported
    except ImportError:
        return [f"torch is not installed: the reference cannot be checked ({install_hint('torch')})"]
    mod, failed = _import(spec)
    if failed:
        return [failed]
    if not spec.small_shapes:
        return [f"{spec.source}: no [[small_shapes]]: the reference is checked on the CPU at the small shapes"]
    for i, shape in enumerate(spec.small_shapes):
        problems = _at_shape(mod, spec, shape, i)
        if problems:  # the same mistake would repeat at every later shape
            return problems
    return []
