"""Rule-based rewrite: host NCCL collectives become calls of cuco's device-side collectives, no LLM.

The rules apply to programs written against cuco's candidate contract (cuco.h): a collective whose
buffers are the workload's symmetric buffers (`X->ptr` with X = cuco_buffer(ctx, "name")) becomes the
matching kernel of cuco_collectives.cuh at the conservative design point, the device communicator is
requested, and nothing else changes. What the rules do not cover is said in one line; that is the LLM
loop's work (not built yet).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cuco.fastpath.analyze import AnalysisError, Op, analyze
from cuco.workload.spec import WorkloadSpec

# NCCL data types the device collectives handle, and their CUDA element types.
ELEMENT = {"ncclBfloat16": "__nv_bfloat16", "ncclFloat": "float", "ncclFloat32": "float", "ncclHalf": "__half",
           "ncclFloat16": "__half"}
INCLUDE = '#include "cuco_collectives.cuh"'
REQUIREMENTS = """
// Added by cuco transform: the device communicator that cuco_collectives.cuh needs.
CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}
"""


class RewriteError(ValueError):
    pass


@dataclass
class Rewrite:
    code: str
    replaced: list[str]  # one line per collective: what became what


def _window(expr: str, aliases: dict[str, str], spec: WorkloadSpec, role: str, op: Op) -> str:
    m = re.fullmatch(r"\s*(\w+)\s*->\s*ptr\s*", expr)
    if not m or m.group(1) not in aliases:
        raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer `{expr}` is not a workload buffer "
                           "(X->ptr with X = cuco_buffer(ctx, \"name\")): the rules cannot place it in a window")
    name = aliases[m.group(1)]
    if name not in spec.buffers or not spec.buffers[name].symmetric:
        raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer {name!r} must be symmetric in "
                           f"{spec.source} (symmetric = true) for peers to reach it")
    return f"{m.group(1)}->window"


def _replacement(op: Op, aliases: dict[str, str], spec: WorkloadSpec) -> str:
    a = op.args
    elem = ELEMENT.get(a.get("dtype", ""))
    if elem is None:
        raise RewriteError(f"line {op.line}: {op.name} on {a.get('dtype')} is not covered by the rules")
    if "op" in a and a["op"] != "ncclSum":
        raise RewriteError(f"line {op.line}: {op.name} with {a['op']} is not covered by the rules (ncclSum only)")
    if op.name == "ncclAllGather":
        win = _window(a["recv"], aliases, spec, "receive", op)
        return f"cuco::allGather(ctx, {win}, 0, {a['send']}, ({a['count']}) * sizeof({elem}), {a['stream']})"
    if op.name == "ncclReduceScatter":
        win = _window(a["send"], aliases, spec, "send", op)
        return f"cuco::reduceScatter<{elem}>(ctx, {win}, 0, {a['recv']}, {a['count']}, {a['stream']})"
    if op.name == "ncclAllReduce":
        send = _window(a["send"], aliases, spec, "send", op)
        recv = _window(a["recv"], aliases, spec, "receive", op)
        return f"cuco::allReduce<{elem}>(ctx, {send}, 0, {recv}, 0, {a['count']}, {a['stream']})"
    raise RewriteError(f"line {op.line}: {op.name} is not covered by the rules yet (all-gather, reduce-scatter and "
                       "all-reduce are)")


def rewrite(path: Path, spec: WorkloadSpec) -> Rewrite:
    analysis = analyze(path)
    src = Path(path).read_bytes()
    text = src.decode()
    if "cuco_dev_requirements" in text:
        raise RewriteError(f"{path}: already states device-communicator requirements; merging them with the "
                           "collectives' is not covered by the rules")
    aliases = dict(re.findall(r"(\w+)\s*=\s*cuco_buffer\(\s*\w+\s*,\s*\"(\w+)\"\s*\)", text))
    calls = []  # in program order, so that the first thing the rules cannot do is the one reported
    for op in analysis.nccl:
        if op.kind != "collective":
            raise RewriteError(f"line {op.line}: {op.name} is not covered by the rules yet (collectives only)")
        calls.append((op, _replacement(op, aliases, spec)))
    out = src
    for op, call in reversed(calls):  # from the end, so earlier byte offsets stay valid
        new = f"CUCO_CUDA(ctx, {call})" if op.wrapper else call
        out = out[:op.span[0]] + new.encode() + out[op.span[1]:]
    replaced = [f"line {op.line}: {op.name} -> {call.split('(')[0]}" for op, call in calls]
    code = out.decode()
    if '#include "cuco.h"' not in code:
        raise RewriteError(f"{path}: not a cuco candidate (no #include \"cuco.h\")")
    code = code.replace('#include "cuco.h"', f'#include "cuco.h"\n{INCLUDE}', 1)
    code = code.rstrip("\n") + "\n" + REQUIREMENTS
    return Rewrite(code, replaced)


def no_host_collective_left(code: str) -> bool:
    """Re-analysis of the rewritten program finds no NCCL call."""
    try:
        analyze(Path("rewritten.cu"), code.encode())
    except AnalysisError as exc:
        return "no NCCL call found" in str(exc)
    return False
