"""Turn a design point into a candidate program of a workload's parameterised strategy kernel."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cuco.designspace import DesignPoint, Directive
from cuco.designspace.dimensions import DIMENSIONS, ENUMS
from cuco.language import is_cuda
from cuco.workload.spec import Requirements, StrategySpec

DESIGN_LINE = re.compile(r"^DESIGN = \{.*\}$", re.M)  # a Python strategy's own design point


def materialize(strategy: StrategySpec, point: DesignPoint) -> str:
    """The candidate's source: the design point as compile-time parameters, then the strategy kernel, then (CUDA)
    what it needs from the runner. Raises ValueError for a point its workload.toml does not accept."""
    refused = [f"{dim} {getattr(point, dim)}" for dim in DIMENSIONS if getattr(point, dim) not in strategy.accepts[dim]]
    if refused:
        raise ValueError(f"strategy {strategy.name} does not accept {', '.join(refused)} (its workload.toml)")
    if excluded := strategy.excluded(point):
        raise ValueError(f"strategy {strategy.name} does not take {excluded} together")
    body = strategy.path.read_text()
    if is_cuda(strategy.path):
        # Each dimension names its enumerator; cuco_design_point.cuh turns them into typed constants (cuco::kBackend).
        head = [f"// cuco directive: strategy {strategy.name}, design point {point.label()}"]
        head += [f"#define CUCO_{dim.upper()} {getattr(point, dim).cxx}" for dim in ENUMS]
        head.append(f"#define CUCO_CHUNKS {point.chunks}")
        head += [f"#define {name} {value}" for name, value in strategy.defines]
        head += [f"#define CUCO_OPT_{name.upper()} {int(value)}" for name, value in strategy.options]
        head += [f"#define {macro} 1" for dim, value, macro in strategy.point_defines if getattr(point, dim) == value]
        return "\n".join(head) + "\n" + body + needs_export(strategy, point)
    # A Python strategy declares its point in one line, `DESIGN = {...}`: the candidate's takes its place.
    head = f"# cuco directive: strategy {strategy.name}, design point {point.label()}\n"
    design = f"DESIGN = {json.dumps(asdict(point), sort_keys=True)}"
    if strategy.options:  # Python literals: JSON would spell True as true
        design += f"\nDESIGN.update({dict(strategy.options)!r})"
    found = DESIGN_LINE.search(body)
    if found is None:
        raise ValueError(f"strategy {strategy.name}: {strategy.path.name} declares no design point (a line "
                         "`DESIGN = {...}` that each candidate's replaces)")
    return head + body[:found.start()] + design + body[found.end():]


def needs_export(strategy: StrategySpec, point: DesignPoint) -> str:
    """cuco_needs (cuco.h) from the strategy's `requires` at the point: the runner checks it before cuco_setup, and
    gives the program the side streams it says (the point's placement may need none)."""
    req = strategy.requires
    if req == Requirements():
        return ""
    sides = req.sides_at_placement(point.placement.value)
    lines = [f"  needs->lsaTeam = {int(req.lsa_team)};", f"  needs->sideStreams = {sides};"]
    lines += [f'  cuco_need_symmetric(needs, "{name}");' for name in req.symmetric]
    return (f"\n// What the strategy needs of the run ([strategies.{strategy.name}] requires in workload.toml).\n"
            "CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) {\n" + "\n".join(lines) + "\n}\n")


def directive_for(strategy: StrategySpec, point: DesignPoint, text: str) -> Directive:
    return Directive(point=point, text=text, strategy=strategy.name)


def prebuild(strategy: StrategySpec, directory: Path, machine: dict[str, Any] | None = None,
             points: list[DesignPoint] | None = None) -> tuple[int, int]:
    """Compile every accepted point of a CUDA strategy (or those of `points`) at once (nvcc in parallel), filling
    the build cache so that a search or a sweep pays no compile per candidate. Returns (built, total): (0, 0) for
    a Python strategy."""
    if not is_cuda(strategy.path):
        return 0, 0
    import os
    from concurrent.futures import ThreadPoolExecutor

    from cuco.runner.build.nvcc import build

    directory.mkdir(parents=True, exist_ok=True)
    srcs = []
    for i, p in enumerate(strategy.points(machine) if points is None else points):
        srcs.append(directory / f"point{i}.cu")
        srcs[-1].write_text(materialize(strategy, p))
    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        return sum(r.ok for r in pool.map(lambda src: build(src, includes=strategy.includes), srcs)), len(srcs)
