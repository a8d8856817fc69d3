"""The workload.toml of a scaffolded workload: what the analysis found, in a file the loader accepts as it is.

Placeholders are values the loader takes (a size, a tolerance), each with a `# TODO` comment, so the workload can
be loaded, listed and statically checked while the user completes it.
"""

from __future__ import annotations

import json

from cuco.workload.scaffold.infer import WORLD, Buffer, Scaffold
from cuco.workload.spec import Timing

# Elementwise and norm tolerances by the outputs' element type, loosest first: (rtol, atol, norm_rtol).
TOLERANCES = {"bf16": (0.02, 0.02, 0.01), "f16": (0.005, 0.005, 0.002), "f32": (1e-4, 1e-4, 1e-5),
              "f64": (1e-9, 1e-9, 1e-10)}
EXACT = (0.0, 0.0, 0.0)  # integer outputs


def _s(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


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
    lines += [f"# TODO: {t}" for t in b.todos]
    lines += [f"[buffers.{b.name}]", f"role = {_s(b.role)}", f"dtype = {_s(b.dtype)}",
              "shape = [" + ", ".join(_s(d) for d in b.shape) + "]"]
    if b.symmetric:
        lines.append("symmetric = true  # a collective touches it: device-initiated versions need it in a window")
    return lines


def _tolerance(sc: Scaffold) -> list[str]:
    outs = [b.dtype for b in sc.buffers if b.role == "output"]
    loosest = next((d for d in TOLERANCES if d in outs), None)
    rtol, atol, norm = TOLERANCES[loosest] if loosest else EXACT
    label = f"{loosest} outputs" if loosest else "integer outputs: exact"
    return ["[tolerance]", f"# {label}; |out - ref| <= rtol * |ref| + atol * rms(ref), and the relative norm error",
            f"rtol = {rtol!r}", f"atol = {atol!r}", f"norm_rtol = {norm!r}",
            ('# "bitwise": two runs on the same inputs agree exactly; "tolerance" where a candidate may reduce in '
             "another order"), 'determinism = "bitwise"']


def _bounds(sc: Scaffold) -> list[str]:
    lines = ["# The physical bound beside every time.", "[bounds]"] + [f"# TODO: {t}" for t in sc.bound_todos]
    if sc.flops != "0":
        lines += ["# floating-point operations per rank, from the program's GEMMs", f"flops = {_s(sc.flops)}"]
    else:
        lines += ['# TODO: floating-point operations per rank (2 * M * K * N for a GEMM); "0" bounds by communication',
                  'flops = "0"']
    return lines + ["# bytes each rank receives per run over its peer links, from the NCCL calls",
                    f"comm_bytes = {_s(sc.comm_bytes)}"]


def workload_toml(sc: Scaffold) -> str:
    """workload.toml: every key the loader needs, the analysis's findings as comments, TODO where they run out."""
    lines = [f"# Scaffolded by `cuco init` from {sc.program.name}: what the analysis of the program found. Check",
             "# every line marked TODO: those are guesses or placeholders (the file loads as it is).",
             f"name = {_s(sc.name)}", 'description = "TODO: what the program computes, in one line"',
             f"world_size = {WORLD}  # TODO: the number of ranks (one per GPU) the program runs on",
             "params = [" + ", ".join(_s(p.name) for p in sc.params) + "]  # the named dimensions of the shapes",
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
