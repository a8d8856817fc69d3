"""The workload.toml of a scaffolded workload: what the analysis found, in a file the loader accepts as it is.

Placeholders are values the loader takes (a size, a tolerance); a value that is a guess or a placeholder carries
`# TODO: what it rests on` on its own line, so the workload can be loaded, listed and statically checked while the
user completes it, and what is left to check is exactly the lines marked.
"""

from __future__ import annotations

import json
import re

from cuco.dtypes import DTYPES
from cuco.scaffold.infer import WORLD, Buffer, Scaffold
from cuco.workload.spec import VERIFIED, Timing

# Elementwise and norm tolerances by the outputs' element type, loosest first: (rtol, atol, norm_rtol).
TOLERANCES = {"bf16": (0.02, 0.02, 0.01), "f16": (0.005, 0.005, 0.002), "f32": (1e-4, 1e-4, 1e-5),
              "f64": (1e-9, 1e-9, 1e-10)}
EXACT = (0.0, 0.0, 0.0)  # integer outputs


def _s(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


def _todo(line: str, todos: list[str]) -> str:
    return f"{line}  # TODO: {'; '.join(todos)}" if todos else line


def _table_key(name: str) -> str:
    """A [buffers] key: bare where TOML allows it, else quoted (the name the program looks up, exactly)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _s(name)


def _params_line(sc: Scaffold) -> str:
    line = "params = [" + ", ".join(_s(p.name) for p in sc.params) + "]"
    if sc.placeholders:
        return _todo(line, [f"{', '.join(sc.placeholders)}: placeholder dimensions for sizes the program does not "
                            "show (see the buffers); the others are the parameters it reads (cuco_param)"])
    return line + "  # the named dimensions: the parameters the program reads (cuco_param) and sizes it fixes"


def _shape_tables(sc: Scaffold, small: bool) -> list[str]:
    key, name = ("small_shapes", "small") if small else ("shapes", "full")
    lines = [f"[[{key}]]", f"name = {_s(name)}"]
    for p in sc.params:
        size = p.small if small else p.full
        if size == p.value:
            lines.append(f"{p.name} = {size}  # the program's value")
        else:
            lines.append(f"{p.name} = {size}  # TODO: " + ("a small size (odd ones, where the program allows, catch "
                                                           "indexing mistakes)" if small else "a size to optimise for"))
    return lines


def _buffer_table(b: Buffer) -> list[str]:
    lines = [f"# {b.source}: {b.notes[0]}" if b.notes else f"# {b.source}"] + [f"#   {n}" for n in b.notes[1:]]
    lines += [f"[buffers.{_table_key(b.name)}]", _todo(f"role = {_s(b.role)}", b.todo.get("role", [])),
              _todo(f"dtype = {_s(b.dtype)}", b.todo.get("dtype", [])),
              _todo("shape = [" + ", ".join(_s(d) for d in b.shape) + "]", b.todo.get("shape", []))]
    if b.symmetric:
        lines.append("symmetric = true  # a collective touches it: device-initiated versions need it in a window")
    else:
        lines.append(_todo("symmetric = false", b.todo.get("symmetric", [])))
    return lines


def _tolerance(sc: Scaffold) -> list[str]:
    outs = [b.dtype for b in sc.buffers if b.role in VERIFIED]
    loosest = next((d for d in TOLERANCES if d in outs), None)
    rtol, atol, norm = TOLERANCES[loosest] if loosest else EXACT
    label = f"{loosest} outputs" if loosest else "integer outputs: exact"
    return ["[tolerance]", f"# {label}; |out - ref| <= rtol * |ref| + atol * rms(ref), and the relative norm error",
            f"rtol = {rtol!r}", f"atol = {atol!r}", f"norm_rtol = {norm!r}",
            ('# "bitwise": two runs on the same inputs agree exactly; "tolerance" where a candidate may reduce in '
             "another order"), _todo('determinism = "bitwise"', sc.determinism_todos)]


def _bounds(sc: Scaffold) -> list[str]:
    flops, comm = sc.bound_todos.get("flops", []), sc.bound_todos.get("comm_bytes", [])
    lines = ["# The physical bound beside every time.", "[bounds]",
             "# floating-point operations per rank, from the program's GEMMs (2 * m * n * k each)"]
    if sc.flops == "0" and not flops:
        lines.append('flops = "0"  # no computation in the run: bound by communication')
    else:
        lines.append(_todo(f"flops = {_s(sc.flops)}", flops))
    lines.append("# bytes each rank reads from and writes to its own memory: inputs read once, outputs written once")
    lines.append(_hbm_line(sc))
    lines.append("# bytes each rank receives per run over its peer links, from the NCCL calls")
    return lines + [_todo(f"comm_bytes = {_s(sc.comm_bytes)}", comm)]


def _hbm_line(sc: Scaffold) -> str:
    """hbm_bytes from the buffers' declarations; a guess wherever one of their shapes or dtypes is."""
    moved = [b for b in sc.buffers if b.role in ("input", "inout", "parameter", "output")]
    terms = [" * ".join([f"({d})" for d in b.shape] + [str(DTYPES[b.dtype].size * (2 if b.role == "inout" else 1))])
             for b in moved]  # an inout buffer is read once and written once
    unsure = [b.name for b in moved if b.todo.get("shape") or b.todo.get("dtype") or b.todo.get("role")]
    todos = [f"rests on the guessed {', '.join(unsure)}"] if unsure else []
    return _todo(f"hbm_bytes = {_s(' + '.join(terms) or '0')}", todos)


def workload_toml(sc: Scaffold) -> str:
    """workload.toml: every key the loader needs, the analysis's findings as comments, TODO where they run out."""
    lines = [f"# Scaffolded by `cuco init` from {sc.program.name}: what the analysis of the program found. Check",
             "# every line marked TODO: those are guesses or placeholders (the file loads as it is).",
             f"name = {_s(sc.name)}", 'description = "TODO: what the program computes, in one line"',
             f"world_size = {WORLD}  # TODO: the number of ranks (one per GPU) the program runs on",
             _params_line(sc),
             'baselines = ["seed"]  # the program itself: every speedup is over it', "",
             "# The shapes to optimise for (cuco evolve --shape, cuco eval --shape)."]
    lines += _shape_tables(sc, False)
    lines += ["", "# Small shapes: every candidate's correctness is checked on them first (L2)."]
    lines += _shape_tables(sc, True) + [""]
    if sc.private:
        lines += [f"# The program's own allocations (its state, not workload buffers): {', '.join(sc.private)}", ""]
    for b in sc.buffers:
        lines += _buffer_table(b) + [""]
    lines += _tolerance(sc) + [""]
    t = Timing()  # the loader's defaults, written out so that the user sees what to change
    lines += ["[timing]", f"warmup = {t.warmup}", f"iters = {t.iters}",
              f"trials = {t.trials}  # correctness trials, each on fresh inputs",
              f"timeout_s = {t.timeout_s}  # one candidate's whole evaluation", ""]
    lines += _bounds(sc) + ["", "[candidates]", 'seed = "seed.cu"', ""]
    return "\n".join(lines)
