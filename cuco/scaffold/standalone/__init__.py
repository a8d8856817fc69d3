"""A standalone program as a seed in the candidate ABI (cuco.h): `cuco init` on a program with its own main().

Such a program is started by MPI or a launcher; main() finds its rank, creates the communicator, allocates, runs its
step in a loop, checks the result and frees. main() is read in three parts: the set-up before the step, the step (one
iteration of the loop that issues the device work, or the region captured into a CUDA graph) and the tear-down after
it. What the runner owns is dropped: rank discovery, MPI, the communicator, the streams, the workload's buffers, host
data and its checks, printing, host syncs and the loop itself. What the step needs besides (a cuBLAS handle bound to
ctx->stream, private scratch) moves into cuco_setup and cuco_teardown. The step becomes cuco_run with the program's own
names bound to ctx->comm, ctx->stream, cuco_buffer(...) and cuco_param(...), so its statements are carried as written,
their checks made cuco's. Only straight-line set-up and a step that issues the same work on every iteration are
taken; anything else is refused, every blocker at once, each naming file:line and the statement.

The program is read as people write it (read_program): its files joined, its own macros expanded by the C
preprocessor (sources.py), main()'s calls of its helpers that issue device work written out in place (inline.py);
every line keeps the file and line it came from, for the refusals and the workload's notes. Sizes may be locals of
main() or the scalar fields of a struct it declares (`cfg.tokens`).
"""

from __future__ import annotations

import re
from pathlib import Path

from cuco.errors import CucoError
from cuco.fastpath.syntax import TOO_DEEP, blank_macros, callee, function_name, parser, text, too_deep, walk
from cuco.scaffold.program import first_syntax_error
from cuco.scaffold.standalone.blockers import Blocked, blockers, refuse_all
from cuco.scaffold.standalone.calls import COMM_INIT
from cuco.scaffold.standalone.facts import Conversion, Facts, refine
from cuco.scaffold.standalone.inline import HELPER_DEPTH, inline_helpers
from cuco.scaffold.standalone.nodes import calls_in
from cuco.scaffold.standalone.place import find_step
from cuco.scaffold.standalone.program import Refusal, Standalone
from cuco.scaffold.standalone.seed import Seed
from cuco.scaffold.standalone.sources import Unit, expand_macros, read_sources
from cuco.scaffold.standalone.step import read_steps
from cuco.scaffold.standalone.variables import INT_TYPES, Locals

__all__ = ["Conversion", "convert", "read_program", "refine"]

RESERVED = ("ctx", "s")  # the seed's own names: cuco_run's context (cuco.h), and cuco_setup's state


def _parsed(unit: Unit):
    root = parser().parse(blank_macros(unit.raw)).root_node
    deep = too_deep(root)
    if deep is not None:
        raise CucoError(str(unit.origin(deep)), TOO_DEEP)
    bad = first_syntax_error(root)
    if bad is not None:
        raise CucoError(str(unit.origin(bad[0])), f"cannot parse as CUDA C++ near {bad[1]!r} (the analysis needs the "
                                                  "whole program; a macro the grammar does not know can cause this)")
    return root


def _clear_reserved(unit: Unit, root) -> Unit:
    """The program's own names that the seed's entry points use (RESERVED) renamed in its host code (`ctx` ->
    `ctx_`), so that a local called ctx or s never hides cuco_run's context or cuco_setup's state; its kernels and
    device functions keep theirs."""
    device = [(f.start_byte, f.end_byte) for f in walk(root) if f.type == "function_definition" and
              any(c.type in ("__global__", "__device__") for c in f.children)]
    found = [n for n in walk(root) if n.type == "identifier" and text(n) in RESERVED
             and not any(lo <= n.start_byte < hi for lo, hi in device)]
    if not found:
        return unit
    taken = {text(n) for n in walk(root) if n.type == "identifier"}
    fresh = {}
    for name in RESERVED:
        new, i = f"{name}_", 2
        while new in taken:
            new, i = f"{name}_{i}", i + 1
        fresh[name] = new
    lines = [ln.encode() for ln in unit.lines]
    for n in sorted(found, key=lambda n: n.start_byte, reverse=True):
        row, start, end = n.start_point.row, n.start_point.column, n.end_point.column
        lines[row] = lines[row][:start] + fresh[text(n)].encode() + lines[row][end:]
    return unit.changed(lines=[ln.decode(errors="replace") for ln in lines])


def read_program(files: list[Path], include_dirs: list[Path], defines: list[str]) -> tuple[Unit, object]:
    """The program's files as one unit, its macros expanded and main()'s helpers written out, and its syntax tree;
    a place the grammar cannot read is refused with the file and line it was written at."""
    unit = expand_macros(read_sources(files), include_dirs, defines)
    root = _parsed(unit)
    mains = [unit.origin(f.start_point.row + 1) for f in walk(root)
             if f.type == "function_definition" and function_name(f) == "main"]
    if len(mains) > 1:
        raise CucoError(str(mains[0].path), f"main() is defined {len(mains)} times ({', '.join(map(str, mains))}): "
                                            "give the files of one program")
    unit = _clear_reserved(unit, root)
    root = _parsed(unit)
    for _ in range(HELPER_DEPTH):  # a level more each time, while there is one
        deeper = inline_helpers(unit, root)
        changed, unit = deeper.lines != unit.lines, deeper
        if not changed:
            break
        root = _parsed(unit)
    return unit, root


def convert(path: Path, raw: bytes, root, unit: Unit | None = None) -> Conversion | None:
    """The seed of a standalone program (raw, parsed into root; the unit it was read as, where its lines come from
    several files or macros), or None for a program without main() or with cuco_run() (not standalone). A main()
    that creates no communicator is refused with every blocker found."""
    prog = Standalone(path, raw, root, unit)
    if prog.main is None or "cuco_run" in prog.functions:
        return None
    calls = [prog.unwrap(c) for c in calls_in(prog.main)]
    every = next((c for c in calls if callee(c) == "ncclCommInitAll"), None)
    if every is not None:
        raise prog.refuse(every, "one process drives several GPUs (ncclCommInitAll): cuco runs one rank per "
                                 "process, with the runner's communicator (ctx->comm)")
    if not any(callee(c) in COMM_INIT for c in calls):  # a program the conversion cannot read: never guessed at
        raise Blocked(path, blockers(prog, raw))
    place = find_step(prog)
    locs = Locals(prog, place.outside, place.setup)
    step, kept, refused = read_steps(prog, place)
    try:
        seed = Seed(prog, place, locs, step, kept)
    except CucoError as exc:  # the set-up cuco_setup would take: named with what the step showed before it
        refuse_all(prog, refused + [exc])
        raise
    refused += seed.refusals
    facts = Facts(seed)
    params = facts.params
    # a refused statement that reads a size, or a value cuco could not follow (a size once the blocker is fixed),
    # gives the step one when fixed: no blocker of its own then
    sizes = {n for n, loc in prog.locals.items() if loc.kind == "param" or
             (loc.kind == "other" and loc.base in INT_TYPES and not loc.pointers)}
    sized = any(set(re.findall(r"[A-Za-z_]\w*(?:\.\w+)*", prog.unit.lines[r.line_read - 1])) & sizes
                for r in refused if isinstance(r, Refusal))
    if not params and not sized:
        source = f"its sizes come from {', '.join(sorted(seed.unfollowed))}, which cuco cannot follow to a number " \
                 "main() sets or the command line" if seed.unfollowed else "a size fixed at file scope stays fixed " \
                 "in the seed"
        refused.append(prog.refuse(place.loops[-1], f"no size of the step is a variable of main() ({source}): a "
                                                    "workload needs one parameter at least; declare the step's sizes "
                                                    "in main() (const size_t n = ...)"))
    refuse_all(prog, refused)
    left = [f"{what} ({prog.at(line)})" for line, what in step.left]
    reading = prog.unit.reading() + ([f"left out of cuco_run, the runner's part: {', '.join(left)}"] if left else [])
    return Conversion(seed.source(), facts.buffers(), params, facts.flops(), prog.unit.warnings + seed.warnings(),
                      dict(prog.globals), reading)
