"""Rule-based rewrite: host NCCL collectives become calls of cuco's device-side collectives, no LLM.

The rules apply to programs written against cuco's candidate contract (cuco.h): a collective becomes the
matching kernel of cuco_collectives.cuh at the conservative design point, and the device communicator is
requested. Its buffers must be reachable by peers: a workload buffer declared symmetric (X->ptr with
X = cuco_buffer(ctx, "name")), or a buffer the program allocates itself with cudaMalloc, which moves to
ncclMemAlloc plus a symmetric window (and its cudaFree to the matching release). A group of
ncclSend/ncclRecv becomes one batch of device sends. What the rules do not cover is said in one line; that
is the LLM loop's work (`cuco transform --llm`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cuco.dtypes import NCCL_DTYPES
from cuco.fastpath.analyze import ENTRY_POINTS, NCCL_SIGNATURES, Analysis, AnalysisError, NoCommunication, Op, analyze
from cuco.fastpath.gemm_rows import Pieces
from cuco.fastpath.peer_loops import all_to_all
from cuco.fastpath.peers import Call, PairingError, pair
from cuco.fastpath.places import Unplaced
from cuco.workload.spec import WorkloadSpec

# NCCL data types the device reductions handle, and their CUDA element types.
ELEMENT = {n: d.c_type for n, d in NCCL_DTYPES.items() if d.name in ("bf16", "f16", "f32")}
# Collectives that only move data (all-gather, all-to-all, send/recv) take any type: only its size matters, so the
# unsigned types no workload buffer has are moved too.
COPY_ELEMENT = {**{n: d.c_type for n, d in NCCL_DTYPES.items()}, "ncclUint32": "uint32_t", "ncclUint64": "uint64_t",
                "ncclFloat8e4m3": "uint8_t", "ncclFloat8e5m2": "uint8_t"}  # fp8: moved as bytes
INCLUDE = '#include "cuco_collectives.cuh"'
GEMM_ROWS_INCLUDE = '#include "cuco_gemm_rows.cuh"'  # a GEMM that reads an all-gather piece by piece (sync chunk)
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


class _Windows:
    """Where each buffer a device collective reaches lives as a window: a symmetric workload buffer
    (X->window), or a buffer the program allocates itself with cudaMalloc, which moves to ncclMemAlloc plus a
    symmetric window registration (cuco::symmetricAlloc) kept in a new static variable."""

    def __init__(self, spec: WorkloadSpec, analysis: Analysis) -> None:
        self.spec, self.analysis = spec, analysis
        self.allocs = {o.args["buffer"]: o for o in analysis.ops if o.kind == "alloc"}
        self.frees = [o for o in analysis.ops if o.kind == "free"]
        self.moved: dict[str, str] = {}  # program buffer -> the variable holding its window
        self.not_symmetric: dict[str, str] = {}  # workload buffer peers must reach -> where, all reported at once

    def check_symmetric(self) -> None:
        if self.not_symmetric:
            where = "; ".join(f"{name!r} ({use})" for name, use in self.not_symmetric.items())
            tables = " and ".join(f"[buffers.{name}]" for name in self.not_symmetric)
            raise RewriteError(f"{self.spec.source}: peers must reach {where}: add `symmetric = true` under {tables}")

    def __call__(self, expr: str, role: str, op: Op) -> tuple[str, str]:
        """The window and byte offset peers reach `expr` by: the buffer the analysis traced it to."""
        pointers = self.analysis.pointers.get(op.function)
        place = pointers.reach(expr) if pointers is not None else None
        if isinstance(place, Unplaced):
            raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer: {place.reason}")
        if place is None:
            raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer `{expr}` is neither a workload buffer "
                               "(X->ptr with X = cuco_buffer(ctx, \"name\"), or a pointer defined from one) nor one "
                               "the program allocates with cudaMalloc: the rules cannot place it in a window")
        reason = pointers.same_on_every_rank(place.offset)
        if reason:
            raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer `{expr}` lies at an offset that depends on "
                               f"{reason}")
        if place.buffer is not None:
            name = place.buffer
            if name not in self.spec.buffers or not self.spec.buffers[name].symmetric:
                self.not_symmetric.setdefault(name, f"line {op.line}: {op.name}'s {role} buffer")
            return f"{place.base}->window", place.offset
        alloc = self.allocs.get(place.base)
        if alloc is None:  # traced to an allocation the analysis did not record under this name
            raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer `{expr}`: the rules cannot tie it to the "
                               f"call that allocates {place.base}")
        if alloc.name != "cudaMalloc":
            raise RewriteError(f"line {op.line}: {op.name}'s {role} buffer `{expr}` comes from {alloc.name} (line "
                               f"{alloc.line}); the rules move only cudaMalloc buffers into windows")
        return self.moved.setdefault(place.base, "cucoWin_" + re.sub(r"\W+", "_", place.base).strip("_")), place.offset

    def edits(self) -> list[tuple[tuple[int, int], str]]:
        """cudaMalloc -> cuco::symmetricAlloc and cudaFree -> cuco::symmetricFree of every moved buffer."""
        out = []
        for key, win in self.moved.items():
            alloc = self.allocs[key]
            # Both return a cudaError_t, as the calls they replace do: any check macro around them stays.
            out.append((alloc.span, f"cuco::symmetricAlloc(ctx, (void**)&{key}, {alloc.args['bytes']}, &{win})"))
            out += [(f.span, f"cuco::symmetricFree(ctx, {key}, {win})") for f in self.frees if f.args["buffer"] == key]
        return out

    def declarations(self) -> str:
        return "".join(f"static ncclWindow_t {win};  // cuco transform: {key} moved to ncclMemAlloc + a window\n"
                       for key, win in self.moved.items())


def _both_windows(op: Op, window: _Windows) -> str:
    """An all-reduce's send and receive windows with their offsets, as the device calls take them."""
    send, send_off = window(op.args["send"], "send", op)
    recv, recv_off = window(op.args["recv"], "receive", op)
    return f"{send}, {send_off}, {recv}, {recv_off}"


def _replacement(op: Op, window: _Windows, stream: str | None = None) -> str:
    """The device collective's call for OP, issued on STREAM (default: the stream OP names)."""
    a = {**op.args, **({"stream": stream} if stream else {})}
    elem = (ELEMENT if "op" in NCCL_SIGNATURES[op.name] else COPY_ELEMENT).get(a.get("dtype", ""))
    if elem is None:
        raise RewriteError(f"line {op.line}: {op.name} on {a.get('dtype')} is not covered by the rules")
    if "op" in a and a["op"] != "ncclSum":
        raise RewriteError(f"line {op.line}: {op.name} with {a['op']} is not covered by the rules (ncclSum only)")
    if op.name == "ncclAllGather":
        win, off = window(a["recv"], "receive", op)
        return f"cuco::allGather(ctx, {win}, {off}, {a['send']}, ({a['count']}) * sizeof({elem}), {a['stream']})"
    if op.name == "ncclReduceScatter":
        win, off = window(a["send"], "send", op)
        return f"cuco::reduceScatter<{elem}>(ctx, {win}, {off}, {a['recv']}, {a['count']}, {a['stream']})"
    if op.name == "ncclAllReduce":
        return f"cuco::allReduce<{elem}>(ctx, {_both_windows(op, window)}, {a['count']}, {a['stream']})"
    if op.name == "ncclAlltoAll":
        win, off = window(a["recv"], "receive", op)
        return f"cuco::allToAll(ctx, {win}, {off}, {a['send']}, ({a['count']}) * sizeof({elem}), {a['stream']})"
    raise RewriteError(f"line {op.line}: {op.name} is not covered by the rules yet (all-gather, reduce-scatter, "
                       "all-reduce, all-to-all and grouped send/recv are)")


def _checked(op: Op, analysis: Analysis) -> None:
    """What every NCCL call must be for the rules to replace it: NCCL's own call with all its arguments, on the
    runner's communicator (the device collectives run over every rank of ctx->comm), its value not kept (the
    device calls return a cudaError_t, which a check macro around the call takes too)."""
    missing = [a for a in NCCL_SIGNATURES[op.name] if a not in op.args]
    if missing:
        raise RewriteError(f"line {op.line}: {op.name} is called without its {', '.join(missing)} (nccl.h's takes "
                           f"{', '.join(NCCL_SIGNATURES[op.name])}): the rules rewrite NCCL's own calls")
    comm = (op.args.get("comm") or "").replace(" ", "")
    scalars = analysis.scalars.get(op.function, {})
    if op.function in ENTRY_POINTS and comm in scalars and scalars[comm] is None:  # main()'s own: refused for more
        raise RewriteError(f"line {op.line}: {op.name} runs on `{comm}`, which {op.function}() assigns more than "
                           "once: the rules cannot tell it is the runner's communicator (ctx->comm)")
    held = scalars.get(comm) or comm
    made = analysis.made_comms.get(comm) or analysis.made_comms.get(held.replace(" ", ""))
    if made:
        raise RewriteError(f"line {op.line}: {op.name} runs on `{comm}`, a communicator the program makes itself "
                           f"({made}), not the runner's (ctx->comm): the device collectives run over every rank of "
                           "ctx->comm, so a collective of a sub-communicator is not covered by the rules")
    if op.valued:
        raise RewriteError(f"line {op.line}: {op.name}'s result is kept as a value: the device collective returns "
                           "a cudaError_t; check it with a macro around the call (CHECK(ncclAllReduce(...));)")


def _group(ops: list[Op], number: int, window: _Windows, analysis: Analysis) -> list[tuple[Op, str, bool]]:
    """ncclGroupStart, sends and receives, ncclGroupEnd -> one cuco::sendBatch. Each send writes the buffer of the
    receive NCCL would match it with on its peer, proved from the peer expressions for every rank and world size
    (peers.pair), or the group is refused with the reason. Sends and receives in loops over every peer are an
    all-to-all (peer_loops)."""
    start, members, end = ops[0], ops[1:-1], ops[-1]
    scalars = analysis.scalars.get(start.function, {})
    others = [o for o in members if o.kind != "p2p"]
    if others:
        raise RewriteError("; ".join(f"line {o.line}: {o.name} inside the group of line {start.line}" for o in others)
                           + ": groups of collectives are not covered by the rules (groups of ncclSend/ncclRecv are)")
    sends = [o for o in members if o.name == "ncclSend"]
    recvs = [o for o in members if o.name == "ncclRecv"]
    if any(len(o.loops) > len(start.loops) for o in members):
        return _peer_loop(start, sends, recvs, end, window, analysis)
    if not sends or len(sends) != len(recvs):
        raise RewriteError(f"line {start.line}: the group has {len(sends)} ncclSend and {len(recvs)} ncclRecv; the "
                           "rules pair them one to one")
    streams = {o.args.get("stream") for o in members}
    if len(streams) != 1:
        raise RewriteError(f"line {start.line}: the group's calls use several streams ({', '.join(sorted(streams))})")
    batch = f"cucoSends{number}"
    out: list[tuple[Op, str, bool]] = [(start, f"cuco::SendBatch {batch}", False)]
    try:
        pairing = pair([Call(o.line, o.args.get("peer", "")) for o in sends],
                       [Call(o.line, o.args.get("peer", "")) for o in recvs], scalars)
    except PairingError as exc:
        raise RewriteError(f"line {start.line}: {exc}") from None
    for snd, rcv in ((snd, recvs[j]) for snd, j in zip(sends, pairing)):
        elem = COPY_ELEMENT.get(snd.args.get("dtype", ""))
        if elem is None:
            raise RewriteError(f"line {snd.line}: ncclSend on {snd.args.get('dtype')} is not covered by the rules")
        if (snd.args.get("count"), snd.args.get("dtype")) != (rcv.args.get("count"), rcv.args.get("dtype")):
            raise RewriteError(f"line {snd.line}: ncclSend and its ncclRecv (line {rcv.line}) differ in count or type")
        win, off = window(rcv.args["recv"], "receive", rcv)
        out.append((snd, f"{batch}.add({snd.args['send']}, ({snd.args['count']}) * sizeof({elem}), "
                         f"{snd.args['peer']}, {win}, {off})", True))
        out.append((rcv, f"(void)0 /* ncclRecv: filled by the peer's {batch} */", False))
    out.append((end, f"cuco::sendBatch(ctx, {batch}, {streams.pop()})", True))
    return out


def _peer_loop(start: Op, sends: list[Op], recvs: list[Op], end: Op, window: _Windows, analysis: Analysis
               ) -> list[tuple[Op, str, bool]]:
    """A group of one send and one receive in loops over every peer -> cuco::allToAll in place of ncclGroupStart,
    the loops removed, ncclGroupEnd a no-op."""
    if len(sends) != 1 or len(recvs) != 1:
        raise RewriteError(f"line {start.line}: the group's loops hold {len(sends)} ncclSend and {len(recvs)} "
                           "ncclRecv; the rules read one of each to every peer as an all-to-all")
    send, recv = sends[0], recvs[0]
    pointers = analysis.pointers.get(start.function)
    try:
        found = all_to_all(analysis.source, send, recv, analysis.scalars.get(start.function, {}),
                           pointers.types if pointers is not None else {})
    except PairingError as exc:
        raise RewriteError(str(exc)) from None
    if found.loops[0][0] < start.span[1] or found.loops[-1][1] > end.span[0]:
        raise RewriteError(f"line {start.line}: the loop of line {found.lines[0]} is not inside the group")
    win, off = window(found.recv, "receive", recv)
    size = f"({send.args['count']}) * sizeof({COPY_ELEMENT[send.args['dtype']]})"
    out = [(start, f"cuco::allToAll(ctx, {win}, {off}, {found.send}, {size}, {send.args['stream']})", True)]
    out += [(Op(-1, "loop", "loop", line, start.function, span=span), f"/* the loop over peers of line {line}: "
             "cuco::allToAll above */", False) for span, line in zip(found.loops, found.lines)]
    return out + [(end, "(void)0 /* ncclGroupEnd: the group is cuco::allToAll */", False)]


def _overlapped(op: Op, window: _Windows, site: int, join: int, src: bytes) -> tuple[str, tuple[tuple[int, int], str]]:
    """OP's call moved to a side stream under CUCO_COLL_SIDE_STREAM (cuco::onSideStream; placement stream_overlap),
    and the join statement put at byte JOIN, where its buffers are next used."""
    stream = op.args["stream"]
    call = (f"cuco::onSideStream<{site}>(ctx, {stream}, [&](cudaStream_t cucoSide) {{ "
            f"return {_replacement(op, window, 'cucoSide')}; }})")
    indent = src[src.rfind(b"\n", 0, join) + 1:join].decode()
    indent = indent if not indent.strip() else "  "
    return call, ((join, join), f"CUCO_CUDA(ctx, cuco::joinSideStream<{site}>(ctx, {stream}));\n{indent}")


def _pieced(op: Op, window: _Windows, site: int, pieces: Pieces) -> tuple[str, tuple[tuple[int, int], str]]:
    """A collective and its GEMM at sync chunk (under CUCO_COLL_CHUNK_SYNC; else the collective on a side stream and
    the GEMM whole): cuco::allGatherChunks and the GEMM as cuco::gemmByGatheredRows, cuco::reduceScatterChunks
    and the GEMM as cuco::gemmSignalRows, or cuco::allReduceChunks and the GEMM as cuco::gemmSignalColumns."""
    a = op.args
    if op.name == "ncclAllReduce":
        call = (f"cuco::allReduceChunks<{site}>(ctx, {_both_windows(op, window)}, {a['count']}, {a['stream']}, "
                f"(const {ELEMENT[a['dtype']]}*)({a['send']}))")
    elif pieces.produces:
        win, off = window(a["send"], "send", op)
        call = (f"cuco::reduceScatterChunks<{site}>(ctx, {win}, {off}, ({ELEMENT[a['dtype']]}*)({a['recv']}), "
                f"{a['count']}, {a['stream']}, {a['send']})")
    else:
        win, off = window(a["recv"], "receive", op)
        call = (f"cuco::allGatherChunks<{site}>(ctx, {win}, {off}, {a['send']}, ({a['count']}) * "
                f"sizeof({COPY_ELEMENT[a['dtype']]}), {a['stream']}, {a['recv']})")
    return call, (pieces.gemm.span, pieces.split.call(pieces.gemm, site, a["stream"], pieces.produces))


def _refuse_all(problems: list[str], window: _Windows) -> None:
    """Every place the rules cannot rewrite in one refusal, the workload buffers peers must reach last."""
    try:
        window.check_symmetric()
    except RewriteError as exc:
        problems.append(str(exc))
    if problems:
        raise RewriteError(problems[0] if len(problems) == 1 else f"{len(problems)} places the rules cannot rewrite: "
                           + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))


def rewrite(program: Path | Analysis, spec: WorkloadSpec, overlap: dict[int, int] | None = None,
            pieces: dict[int, Pieces] | None = None) -> Rewrite:
    """The program with its NCCL calls replaced by device-side collectives; PROGRAM is a file or its analysis (the
    bytes analysed are the bytes edited: the source is parsed once). OVERLAP: collectives (op index -> the byte of
    their join) that move to a side stream when the program is compiled with CUCO_COLL_SIDE_STREAM (placement
    stream_overlap); PIECES: all-gathers, reduce-scatters and all-reduces (op index -> the GEMM that reads or writes
    them) that run beside their GEMM piece by piece under CUCO_COLL_CHUNK_SYNC (sync chunk); the caller proves each
    safe (cuco/fastpath/knobs.py)."""
    overlap, pieces = overlap or {}, pieces or {}
    analysis = program if isinstance(program, Analysis) else analyze(Path(program))
    path, src = analysis.path, analysis.source
    text = src.decode()
    if "cuco_dev_requirements" in text:
        raise RewriteError(f"{path}: already states device-communicator requirements; merging them with the "
                           "collectives' is not covered by the rules")
    window = _Windows(spec, analysis)
    # (call, replacement, whether it returns a cudaError_t to check), in program order; what the rules cannot do is
    # reported in that order too, every place at once.
    calls: list[tuple[Op, str, bool]] = []
    group: list[Op] | None = None
    replaced = []
    sites: list[tuple[tuple[int, int], str]] = []  # edits of the side-stream sites: joins, GEMMs cut by rows
    n_sites = 0
    problems: list[str] = []  # every place the rules cannot rewrite, reported together
    nested = 0  # groups opened inside the open one: NCCL merges them into it
    for op in analysis.nccl:
        try:
            _checked(op, analysis)
            if group is not None and (op.name == "ncclGroupStart" or (op.name == "ncclGroupEnd" and nested)):
                nested += 1 if op.name == "ncclGroupStart" else -1
                calls.append((op, "", False))  # gone: the open group's batch holds its calls
            elif op.name == "ncclGroupStart":
                group = [op]
            elif op.name == "ncclGroupEnd":
                if group is None:
                    raise RewriteError(f"line {op.line}: ncclGroupEnd without ncclGroupStart")
                calls += _group(group + [op], len(replaced) + 1, window, analysis)
                what = ("ncclSend/ncclRecv to every peer -> cuco::allToAll" if "cuco::allToAll" in calls[-1][1] else
                        f"group of {(len(group) - 1) // 2} ncclSend/ncclRecv -> cuco::sendBatch")
                replaced.append(f"lines {group[0].line}-{op.line}: {what}")
                group = None
            elif group is not None:
                group.append(op)
            elif op.kind == "p2p":
                raise RewriteError(f"line {op.line}: {op.name} outside ncclGroupStart/ncclGroupEnd is not covered by "
                                   "the rules (a group pairs each send with its receive)")
            else:
                call = _replacement(op, window)
                replaced.append(f"line {op.line}: {op.name} -> {call.split('(')[0]}")
                if op.index in overlap or op.index in pieces:
                    site, n_sites = n_sites, n_sites + 1
                if op.index in overlap:
                    call, join = _overlapped(op, window, site, overlap[op.index], src)
                    sites.append(join)
                if op.index in pieces:  # a reduce-scatter keeps its join; an all-gather's GEMM joins it back itself
                    call, gemm = _pieced(op, window, site, pieces[op.index])
                    sites.append(gemm)
                calls.append((op, call, True))
        except RewriteError as exc:
            problems.append(str(exc))
            group = None if op.name == "ncclGroupEnd" else group
    if group is not None:
        problems.append(f"line {group[0].line}: ncclGroupStart without ncclGroupEnd")
    _refuse_all(problems, window)
    edits = [(op.span, f"CUCO_CUDA(ctx, {call})" if op.wrapper and checked else call) for op, call, checked in calls]
    edits += window.edits() + sites
    replaced += [f"line {window.allocs[k].line}: cudaMalloc of {k} -> ncclMemAlloc + symmetric window"
                 for k in window.moved]
    out = src
    for (lo, hi), new in sorted(edits, reverse=True):  # from the end, so earlier byte offsets stay valid
        out = out[:lo] + new.encode() + out[hi:]
    code = out.decode()
    if '#include "cuco.h"' not in code:
        raise RewriteError(f"{path}: not a cuco candidate (no #include \"cuco.h\"): the rules rewrite programs in "
                           "the candidate ABI; `cuco init` makes one of a program with its own main()")
    include = INCLUDE + ("\n" + GEMM_ROWS_INCLUDE if pieces else "")
    code = code.replace('#include "cuco.h"', f'#include "cuco.h"\n{include}\n{window.declarations()}'.rstrip("\n"), 1)
    code = code.rstrip("\n") + "\n" + REQUIREMENTS
    return Rewrite(code, replaced)


def no_host_collective_left(code: str) -> bool:
    """Re-analysis of the rewritten program finds no NCCL call."""
    try:
        analyze(Path("rewritten.cu"), code.encode())
    except NoCommunication:
        return True
    except AnalysisError:
        pass
    return False
