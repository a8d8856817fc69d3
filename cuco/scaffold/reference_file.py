"""The reference.py of a scaffolded workload: one stub per function the runner calls, each saying what to return.

The stubs raise NotImplementedError until they are written: a reference is the definition of correct, and
nothing may be verified or measured against a guess. Their docstrings name the buffers, shapes and element
types of the workload, and the program's calls in the order reference() has to reproduce them.
"""

from __future__ import annotations

import re

from cuco.dtypes import DTYPES
from cuco.fastpath.analyze import Op
from cuco.scaffold.evidence import Factor
from cuco.scaffold.infer import Buffer, Scaffold, computes, root_only
from cuco.workload.spec import DELIVERED, VERIFIED

REDUCE_OPS = {"ncclSum": "SUM", "ncclProd": "PRODUCT", "ncclMax": "MAX", "ncclMin": "MIN", "ncclAvg": "AVG"}


def _py(expr: str) -> str:
    """A workload expression as Python over p (the shape's params) and world."""
    return re.sub(r"(?<!/)/(?!/)", "//", re.sub(r"\b(?!world\b)([A-Za-z_][A-Za-z0-9_]*)\b", r'p["\1"]', expr))


def _py_shape(b: Buffer) -> str:
    """A buffer's shape as Python over p (the shape's params) and world: `(p["M"] // world, p["K"])`."""
    dims = [_py(d) for d in b.shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _torch_dtype(b: Buffer) -> str:
    return f"torch.{DTYPES[b.dtype].torch_name}"


def _step(op: Op, names: dict[str, str]) -> str:
    if op.name.startswith("cudaMemset") and op.writes:  # a fill: no source
        return f"line {op.line}: {op.name} (fills {', '.join(names.get(b, b) for b in op.writes)})"
    reads = ", ".join(names.get(b, b) for b in op.reads) or ("host" if op.kind == "copy" else "")
    writes = ", ".join(names.get(b, b) for b in op.writes) or ("host" if op.kind == "copy" else "")
    flow = f"{reads} -> {writes}"
    extra = f", {op.args['op']}" if "op" in op.args else ""
    return f"line {op.line}: {op.name} ({flow}{extra})"


# Elements of a collective's send buffer per element received, as Python over `world`: how to size the one end
# from the other where the program's own allocation, not a workload buffer, is that end.
SEND_PER_RECV = {"ncclAllGather": ("// view.world", "* view.world"),
                 "ncclReduceScatter": ("* view.world", "// view.world")}
IN_PLACE = ("ncclAllReduce", "ncclBroadcast", "ncclReduce")


def _sized_like(other: str, scale: str) -> str:
    return f"torch.empty({other}.numel() {scale}, dtype={other}.dtype, device={other}.device)" if scale else \
        f"torch.empty_like({other})"


def _ends(op: Op, by_source: dict[str, str]) -> tuple[list[str], str, str] | None:
    """Lines that make the collective's two ends from the workload's buffers, and the two expressions; None where
    neither end is a workload buffer."""
    send = by_source.get(op.reads[0]) if op.reads else None
    recv = by_source.get(op.writes[0]) if op.writes else None
    from_recv, from_send = SEND_PER_RECV.get(op.name, ("", ""))
    if send is None and recv is None:
        return None
    lines, send_expr = [], f"view.bufs[{send!r}]"
    if send is None:
        sized = _sized_like(f"view.bufs[{recv!r}]", from_recv)
        lines.append(f"send = {sized}  # the program sends from its own buffer")
        send_expr = "send"
    if op.name in IN_PLACE:
        lines.append(f"out = {send_expr}.clone()")
    elif recv is not None:
        lines.append(f"out = torch.empty_like(view.bufs[{recv!r}])")
    else:
        lines.append(f"out = {_sized_like(send_expr, from_send)}  # the program receives into its own buffer")
    return lines, send_expr, "out"


def _comm_hint(sc: Scaffold) -> list[str]:
    """torch.distributed calls that do what the program's first collective does, for comm_alone, on the workload's
    buffers (an end the program allocates itself is made here, sized from the other)."""
    op = next((o for o in sc.steps if o.kind == "collective"), None)
    if op is None:
        return ["(the program's send/recv exchange alone, e.g. with dist.batch_isend_irecv on view.group)"]
    ends = _ends(op, {b.source: b.name for b in sc.buffers})
    if ends is None:
        return [f"(the program's {op.name} (line {op.line}) moves buffers it allocates itself: make tensors of the "
                "sizes it moves, and the same call of torch.distributed on them)"]
    lines, send, out = ends
    red = f", op=dist.ReduceOp.{REDUCE_OPS.get(op.args.get('op', ''), 'SUM')}"
    calls = {"ncclAllGather": f"dist.all_gather_into_tensor({out}, {send}, group=view.group)",
             "ncclReduceScatter": f"dist.reduce_scatter_tensor({out}, {send}{red}, group=view.group)",
             "ncclAlltoAll": f"dist.all_to_all_single({out}, {send}, group=view.group)",
             "ncclAllReduce": f"dist.all_reduce({out}{red}, group=view.group)",
             "ncclBroadcast": f"dist.broadcast({out}, src=0, group=view.group)",
             "ncclReduce": f"dist.reduce({out}, dst=0{red}, group=view.group)"}
    return ["import torch.distributed as dist", *lines, f"return lambda: {calls.get(op.name, 'the collective on out')}"]


def _listing(buffers: list[Buffer]) -> list[str]:
    return [f'        "{b.name}": shape {_py_shape(b)}, {_torch_dtype(b)}' for b in buffers]


def _output_listing(buffers: list[Buffer], roots: dict[str, tuple[Op, str]]) -> list[str]:
    """The outputs with the dtype the reference returns, not the program's: the judge compares in higher precision
    (cuco check refuses a floating reference less precise than the output, and a float one of an integer output).
    An output only a root receives is NaN on the other ranks."""
    lines = []
    for b in buffers:
        if b.dtype == "f64":
            kind = "torch.float64"
        elif b.dtype in ("bf16", "f16", "f32"):
            kind = "torch.float64 or torch.float32"
        else:
            kind = "an integer dtype"
        inout = ", updated in place: what the run leaves in it, from the value make_inputs gives it" \
            if b.role == "inout" else ""
        if b.name in roots:
            inout += f"; on rank {roots[b.name][1]} only, NaN on the others: {roots[b.name][0].name} writes no other"
        lines.append(f'        "{b.name}": shape {_py_shape(b)}, {kind} (the program writes {_torch_dtype(b)}{inout})')
    return lines


def _make_inputs(sc: Scaffold) -> list[str]:
    inputs = [b for b in sc.buffers if b.role in (*DELIVERED, "parameter")]  # the weights are drawn here too
    first = inputs[0] if inputs else None
    example = (f"torch.randn({_py_shape(first)}, generator=gen, device=device).to({_torch_dtype(first)})"
               if first else "{}")
    return ["def make_inputs(p, world, rank, gen, device):",
            '    """This rank\'s inputs, drawn from `gen` on `device`; the judge draws fresh ones for every trial.',
            "",
            "    p: the shape's named dimensions (p[\"N\"]); world: the number of ranks; rank: this one.",
            "    Return a dict with one tensor per input and parameter buffer of workload.toml (the judge keeps the",
            "    parameters of the shape's first call: weights are drawn once per shape):",
            *_listing(inputs),
            f"    For example: {example}",
            "    (scaled so that the outputs stay of order one: rounding is then judged fairly)",
            '    """',
            '    raise NotImplementedError("reference.py: write make_inputs (its docstring lists the inputs)")']


def _reference(sc: Scaffold) -> list[str]:
    outputs = [b for b in sc.buffers if b.role in VERIFIED]
    names = {b.source: b.name for b in sc.buffers}
    steps = [f"        {_step(o, names)}" for o in sc.steps if o.kind not in ("alloc", "free", "sync", "group")]
    return ["def reference(p, world, rank, inputs):",
            '    """This rank\'s outputs as the program computes them, from every rank\'s inputs (inputs[r] is',
            "    rank r's make_inputs), at least as precise as the program (the dtypes below, not the program's):",
            "    candidates are compared with it within workload.toml's [tolerance].",
            "",
            "    Return a dict with one tensor per output buffer:",
            *_output_listing(outputs, root_only(sc)),
            f"    What the program does, in order ({'cuco_run' if sc.abi else sc.program.name}):",
            *(steps or ["        (no call the analysis follows)"]),
            '    """',
            '    raise NotImplementedError("reference.py: write reference (its docstring lists the outputs)")']


def _factor(f: Factor, names: dict[str, str]) -> str:
    viewed = f'b["{names[f.buffer]}"].view({_py(f.rows)}, {_py(f.cols)})'
    return viewed + (".t()" if f.transposed else "")


def _gemms_alone(sc: Scaffold) -> list[str] | None:
    """compute_alone as the program's GEMMs through torch.matmul (cuBLAS) on the workload's buffers, where every GEMM
    of the run is one whole-buffer product and the program computes nothing else the bound could count; else None."""
    names = {b.source: b.name for b in sc.buffers}
    gemms = [o for o in sc.steps if o.kind == "blas"]
    if not sc.products or len(sc.products) != len(gemms) or any(
            f.buffer not in names for g in sc.products for f in (g.out, g.left, g.right)):
        return None
    others = sorted({o.name for o in sc.steps if computes(o) and o.kind != "blas"})
    left_out = [f"    The program's own kernels ({', '.join(others)}) are left out:",
                "    add them, and the bound holds them too."] if others else []
    return ["def compute_alone(view: RankView):",
            '    """The program\'s GEMMs alone, each through cuBLAS (torch.matmul) on this rank\'s buffers as',
            "    the program calls it: the compute half of the physical bound. Written by `cuco init` from the",
            "    GEMM calls.",
            *left_out,
            '    """',
            "    p, world, b = view.params, view.world, view.bufs",
            "",
            "    def run():",
            *[f"        torch.matmul({_factor(g.left, names)}, {_factor(g.right, names)}, "
              f"out={_factor(g.out, names)})" for g in sc.products],
            "    return run"]


def _compute_alone(sc: Scaffold) -> list[str]:
    gemms = _gemms_alone(sc)
    if gemms is not None:
        return gemms
    names = sorted({o.name for o in sc.steps if computes(o)})
    return ["def compute_alone(view: RankView):",
            '    """The program\'s computation alone, with the best library version of it (torch.matmul for a',
            "    GEMM), on already communicated data: the compute half of the physical bound. view.bufs are this",
            "    rank's buffers, view.inputs every rank's inputs. Return a function of no argument that runs it once",
            "    (it is timed).",
            f"    The program computes with: {', '.join(names)}.",
            '    """',
            ('    raise NotImplementedError("reference.py: write compute_alone, or delete it to bound by '
             'communication")')]


def _comm_alone(sc: Scaffold) -> list[str]:
    return ["def comm_alone(view: RankView):",
            '    """The program\'s communication alone, through torch.distributed on view.group: on a machine',
            "    without a measured link rate it stands for the communication half of the bound. Return a function",
            "    of no argument that runs it once (it is timed). For the program's first collective:",
            *[f"        {line}" for line in _comm_hint(sc)],
            '    """',
            '    raise NotImplementedError("reference.py: write comm_alone (its docstring shows the collective)")']


def reference_py(sc: Scaffold) -> str:
    """reference.py: make_inputs and reference, which the judge needs, and the bound's two halves."""
    parts = [f'"""Reference of the {sc.name} workload (scaffolded by `cuco init` from {sc.program.name}): what the',
             "program computes, in PyTorch. Write each function as its docstring says; until then it raises",
             'NotImplementedError, and no candidate is verified or timed against a guess."""', "",
             "import torch", "", "from cuco.workload.contract import RankView", "", ""]
    funcs = [_make_inputs(sc), _reference(sc)] + ([_compute_alone(sc)] if sc.has_compute() else []) + [_comm_alone(sc)]
    return "\n\n\n".join("\n".join(f) for f in [parts[:-2]] + funcs) + "\n"
