"""Where the step is in main(): the loops that issue device work, or the region captured into the CUDA graph
that a loop launches; the rest of main() is set-up and tear-down."""

from __future__ import annotations

from dataclasses import dataclass

from cuco.fastpath.syntax import callee, text, walk
from cuco.scaffold.c_expr import LOOPS
from cuco.scaffold.standalone.calls import WORK
from cuco.scaffold.standalone.nodes import calls_in, idents, line_of
from cuco.scaffold.standalone.program import Standalone


@dataclass
class Place:
    """Where the step is in main(): its statements (once per loop that runs it), what comes before it, and what
    lies outside it."""

    bodies: list[list]
    loops: list  # the loops of main() that run the step (or launch its graph)
    setup: list  # main()'s statements before the step
    outside: list  # every statement of main() outside the step
    varying: dict[str, int]  # the loops' counters: they change from one iteration to the next
    where: str


def _body(loop) -> list:
    body = loop.child_by_field_name("body")
    if body is None:
        return []
    return [c for c in body.named_children if c.type != "comment"] if body.type == "compound_statement" else [body]


def loop_counters(loop) -> dict[str, int]:
    """The names a loop's header declares or steps."""
    header = [loop.child_by_field_name(f) for f in ("initializer", "condition", "update", "declarator")]
    out = {}
    for part in (h for h in header if h is not None):
        for node in walk(part):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument") \
                if node.type in ("assignment_expression", "update_expression") else \
                node.child_by_field_name("declarator") if node.type == "init_declarator" else \
                node if part.type == "reference_declarator" and node.type == "identifier" else None
            if target is not None and target.type == "identifier":
                out[text(target)] = line_of(loop)
    return out


def _statements(block) -> list:
    """A block's statements, those of a bare block within it in its place (`{ Layer layer(...); for (...) ...; }`,
    which scopes a program's objects before MPI_Finalize)."""
    out = []
    for c in block.named_children:
        if c.type == "compound_statement":
            out += _statements(c)
        elif c.type != "comment":
            out.append(c)
    return out


def find_step(prog: Standalone) -> Place:
    """The loops of main() that issue device work run the step; when they only launch a CUDA graph, the step is
    the region captured into it."""
    top = _statements(prog.main.child_by_field_name("body"))
    loops = [s for s in top if s.type in LOOPS and prog.works(s)]
    launching = [s for s in loops if prog.works(s, copies=False)]
    if launching:  # loops that only copy, zero or allocate, before the first that launches work, set up
        loops = [s for s in loops if s in launching or top.index(s) > top.index(launching[0])]
    if not loops:
        once = next((s for s in top if prog.works(s)), None)
        raise prog.refuse(once or prog.main, "main() issues its device work once, outside a loop: cuco cannot tell "
                          "the step from the set-up; put the step in a loop (for (int it = 0; it < iters; ++it))"
                          if once is not None else "main() issues no device work (kernels, cuBLAS, NCCL, a CUDA "
                          "graph) that cuco can see")
    kinds = {s.id: {prog.kind(c) for c in calls_in(s)} & WORK for s in loops}
    graphs = [s for s in loops if kinds[s.id] == {"graph_launch"}]
    if graphs and len(graphs) != len(loops):
        raise prog.refuse(next(s for s in loops if s not in graphs), "issues device work directly while another "
                          "loop launches a CUDA graph: cuco takes one step, the same on every iteration")
    if graphs:
        return _captured(prog, top, graphs)
    first = top.index(loops[0])
    varying: dict[str, int] = {}
    outside = [s for s in top if s not in loops]
    for i, loop in enumerate(loops):
        varying.update(loop_counters(loop))
        inner, rest = _inner(prog, loop)
        while inner is not None:  # epochs x steps: the step is the inner loop's body
            loops[i], loop = inner, inner
            outside += rest
            varying.update(loop_counters(loop))
            inner, rest = _inner(prog, loop)
    return Place([_body(s) for s in loops], loops, top[:first], outside, varying,
                 f"the loop at {prog.at(line_of(loops[-1]))}")


def _inner(prog: Standalone, loop) -> tuple[object | None, list]:
    """The one loop in LOOP's body that issues device work, with the body's other statements, where its own body is
    the same every time (it reads neither loop's counter: an epoch's loop around its steps, not a step's loop over
    layers) and the others do no device work and declare only what stays the same from one epoch to the next;
    else (None, [])."""
    body = _body(loop)
    inner = [s for s in body if s.type in LOOPS and prog.works(s)]
    rest = [s for s in body if s not in inner]
    if len(inner) != 1 or any(prog.works(s) for s in rest):
        return None, []
    counters = set(loop_counters(loop)) | set(loop_counters(inner[0]))
    steps = inner[0].child_by_field_name("body")
    if steps is None or counters & idents(steps) or any(
            s.type == "declaration" and counters & idents(s) for s in rest):
        return None, []
    return inner[0], rest


def _captured(prog: Standalone, top: list, graphs: list) -> Place:
    def holding(name: str) -> list:
        return [s for s in top if any(callee(prog.unwrap(c)) == name for c in calls_in(s))]

    begins, ends = holding("cudaStreamBeginCapture"), holding("cudaStreamEndCapture")
    if len(begins) != 1 or len(ends) != 1 or not top.index(begins[0]) < top.index(ends[0]) < top.index(graphs[0]):
        raise prog.refuse(graphs[0], "launches a CUDA graph that main() does not capture once, at its top level and "
                                     "before the loop (cudaStreamBeginCapture ... cudaStreamEndCapture): cuco cannot "
                                     "see the step")
    b, e = top.index(begins[0]), top.index(ends[0])
    start, end = prog.origin(line_of(begins[0])), prog.origin(line_of(ends[0]))
    lines = f"{prog.at(line_of(begins[0]))}-{end.line}" if start.path == end.path else \
        f"{prog.at(line_of(begins[0]))} to {prog.at(line_of(ends[0]))}"
    return Place([top[b + 1:e]], graphs, top[:b], top[:b + 1] + top[e:], {},
                 f"the region captured into a CUDA graph at {lines}")
