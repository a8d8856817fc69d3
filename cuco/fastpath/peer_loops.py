"""A group whose one ncclSend and one ncclRecv stand in loops over every peer is an all-to-all, proved for every rank
at every world size checked, or refused with the reason.

This is how hand-written all-to-alls look (`for (p = 0; p < nRanks; p++) { ncclSend(x + p * n, n, .., p, ..);
ncclRecv(y + p * n, n, .., p, ..); }`, or with the peer rotated by the rank to spread the links' load). NCCL matches
rank r's send to q with q's receive from r; when each loop reaches every rank exactly once, and each call's buffer
sits at block `peer` of one buffer, block q of r's send lands in block r of q's receive: cuco::allToAll. Each
condition is checked, not assumed: the loop counts 0 .. nRanks - 1, each peer expression is a permutation of the
ranks (evaluated with the program's own definitions, peers.PeerExpression), each offset is that peer times the
count in elements of the count's type, and the loop does nothing else. A loop whose iteration for the rank itself
copies its own block instead (`if (peer == rank) { cudaMemcpyAsync(...); continue; }`, or with the send and receive
in an else) is one too, its copy checked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from cuco.dtypes import NCCL_DTYPES
from cuco.fastpath.analyze import Analysis, Op
from cuco.fastpath.peers import PARAMETER, WORLDS, PairingError, PeerExpression
from cuco.fastpath.places import element_type, strip, strip_parens
from cuco.fastpath.syntax import blank_macros, call_args, callee, counting_loop, parser, text, walk

# Bytes of the element types a pointer may step by, beside the workload's own (cuco.dtypes).
C_SIZES = {**{d.c_type: d.size for d in NCCL_DTYPES.values()}, "char": 1, "unsigned char": 1, "signed char": 1,
           "int": 4, "unsigned": 4, "unsigned int": 4, "uint32_t": 4, "uint64_t": 8, "half": 2, "long long": 8,
           "size_t": 8, "uint16_t": 2, "int16_t": 2, "short": 2, "float2": 8, "float4": 16, "int4": 16}
# Values a workload parameter is bound to where an index is checked by value: a power of two, one no world size
# divides, a small one.
PARAMETER_VALUES = (4096, 4099, 7)
COUNTS = (3, 1009)  # values the count stands for while an offset is checked: any two that no peer arithmetic hits
STATEMENTS = ("expression_statement", "declaration")  # what a loop over peers may hold


@dataclass(frozen=True)
class AllToAll:
    """What replaces the group: the loops' bytes (removed), the two buffers' starts as written."""

    loops: tuple[tuple[int, int], ...]
    lines: tuple[int, ...]
    send: str
    recv: str


def all_to_all(source: bytes, send: Op, recv: Op, scalars: dict[str, str | None],
               types: dict[str, str]) -> AllToAll:
    """SEND and RECV (the group's only calls) read as one all-to-all; TYPES: the function's pointers' element types."""
    if send.args.get("count") != recv.args.get("count"):
        raise PairingError(f"the ncclSend of line {send.line} sends `{send.args.get('count')}` and the ncclRecv of "
                           f"line {recv.line} receives `{recv.args.get('count')}`: blocks of one size are an "
                           "all-to-all; a size per peer (an all-to-allv) is not covered by the rules")
    if send.args.get("dtype") != recv.args.get("dtype"):
        raise PairingError(f"the ncclSend of line {send.line} and the ncclRecv of line {recv.line} differ in type")
    dtype = NCCL_DTYPES.get(send.args.get("dtype", ""))
    if dtype is None:
        raise PairingError(f"line {send.line}: ncclSend on {send.args.get('dtype')} is not covered by the rules")
    root = parser().parse(blank_macros(source)).root_node
    loops, bases, owns = {}, [], {}
    for op in (send, recv):
        loop = _loop_of(root, op)
        var = _counter(loop, scalars)
        own = owns[loop.start_byte] = _own_branch(loop, var, scalars)
        if own is not None and not _skipped_by(own[0], op):
            raise PairingError(f"line {op.line}: {op.name} runs for the rank itself too, beside the copy of its own "
                               f"block (line {own[0].start_point.row + 1})")
        call = next(n for n in walk(loop) if n.type == "call_expression" and n.start_byte >= op.span[0]
                    and n.end_byte <= op.span[1] and callee(n) == op.name)
        args = call_args(call)
        peer = PeerExpression(text(args[3]), scalars)
        _every_peer_once(peer, var, op, own[1] if own is not None else None)
        base, index = block(args[0], op)
        _at_block(index, peer, var, op, scalars)
        elem = element_type(strip_parens(base), types)
        if C_SIZES.get(elem or "") != dtype.size:
            steps = elem or "an element type the rules cannot see"
            raise PairingError(f"line {op.line}: `{text(args[0])}` steps by {steps}, not by the {dtype.c_type} its "
                               "count is in: cast it to a typed pointer")
        loops[loop.start_byte] = loop
        bases.append(text(base))
    for key, loop in loops.items():
        own = owns[key]
        if own is not None:
            _copies_own_block(own, _counter(loop, scalars), send, bases, dtype.size, scalars)
        _nothing_else(loop, (send, recv), own[0] if own is not None else None)
    ordered = sorted(loops.values(), key=lambda n: n.start_byte)
    return AllToAll(tuple((n.start_byte, n.end_byte) for n in ordered), tuple(n.start_point.row + 1 for n in ordered),
                    *bases)


def _loop_of(root, op: Op):
    """The innermost for loop around OP's call."""
    around = [n for n in walk(root) if n.type == "for_statement" and n.start_byte <= op.span[0]
              and op.span[1] <= n.end_byte]
    if not around:
        raise PairingError(f"line {op.line}: {op.name} is in a loop that is not a `for` over the peers")
    return max(around, key=lambda n: n.start_byte)


def _counter(loop, scalars: dict[str, str | None]) -> str:
    """The loop's variable, once shown to count 0, 1, .. nRanks - 1 at every world size checked."""
    line = loop.start_point.row + 1
    var, end = counting_loop(loop)
    if var is None:
        raise PairingError(f"line {line}: the loop does not count up by one from 0 (`for (int p = 0; p < "
                           "ctx->nRanks; p++)`): the rules cannot tell which peers it reaches")
    if end is None:
        raise PairingError(f"line {line}: the loop's condition is not `{var} < ` the number of ranks")
    bound = PeerExpression(text(end), scalars)
    for world in WORLDS:
        if bound(0, world) != world:
            raise PairingError(f"line {line}: the loop runs to {text(end)}, {bound(0, world)} at world {world}: not "
                               "once for every rank")
    return var


def _every_peer_once(peer: PeerExpression, var: str, op: Op, skipped: PeerExpression | None) -> None:
    """Every rank reached once; every other rank, where the iteration for the rank itself copies instead."""
    for world in WORLDS:
        for rank in range(world):
            reached = sorted(peer(rank, world, {var: i}) for i in range(world)
                             if skipped is None or skipped(rank, world, {var: i}) != rank)
            if reached != [q for q in range(world) if skipped is None or q != rank]:
                others = "every other rank" if skipped is not None else "every rank"
                raise PairingError(f"line {op.line}: {op.name}'s peer `{peer.text}` does not reach {others} once "
                                   f"at world {world} (rank {rank} reaches {reached})")


def _own_branch(loop, var: str, scalars: dict[str, str | None]):
    """`if (peer == rank) { copy; continue; }` (or `{ copy } else { send; receive }`) in the loop's body: the
    iteration for the rank itself copies its own block. The if statement and its peer expression, or None."""
    for st in _statements(loop.child_by_field_name("body")):
        cond = st.child_by_field_name("condition") if st.type == "if_statement" else None
        test = next((n for n in walk(cond) if n.type == "binary_expression"), None) if cond is not None else None
        if test is None or text(test.child_by_field_name("operator")) != "==":
            continue
        sides = [PeerExpression(text(test.child_by_field_name(f)), scalars) for f in ("left", "right")]
        for me, peer in (sides, sides[::-1]):
            try:
                if all(me(r, w, {var: i}) == r for w in WORLDS for r in range(w) for i in range(w)):
                    return st, peer
            except PairingError:
                continue
    return None


def _skipped_by(node, op: Op) -> bool:
    """Whether the rank's own branch keeps OP from running for the rank itself: OP stands in its else, or after it
    where the branch ends with `continue`."""
    other = node.child_by_field_name("alternative")
    if other is not None:
        return other.start_byte <= op.span[0] and op.span[1] <= other.end_byte
    return op.span[0] >= node.end_byte


def _copies_own_block(own, var: str, send: Op, bases: list[str], size: int, scalars: dict[str, str | None]
                      ) -> None:
    """The rank's own branch copies block `peer` of the send buffer to block `peer` of the receive buffer, the
    count's bytes, and goes to the next peer (or holds the send and receive in its else)."""
    node, peer = own
    line = node.start_point.row + 1
    inner = _statements(node.child_by_field_name("consequence"))
    copies = [c for st in inner for c in walk(st) if c.type == "call_expression"
              and callee(c) in ("cudaMemcpyAsync", "cudaMemcpy")]
    jumps = [st for st in inner if st.type == "continue_statement"]
    shape_ok = len(copies) == 1 and len(inner) == 1 + len(jumps) and \
        (len(jumps) == 1) != (node.child_by_field_name("alternative") is not None)
    if not shape_ok:
        raise PairingError(f"line {line}: the rank's own iteration does not just copy its block and go on (`if (peer "
                           "== rank) { cudaMemcpyAsync(...); continue; }`)")
    args = call_args(copies[0])
    as_copy = replace(send, name=callee(copies[0]), line=copies[0].start_point.row + 1)
    for arg, base in ((args[0], bases[1]), (args[1], bases[0])):
        start, index = block(arg, as_copy)
        if text(start) != base:
            raise PairingError(f"line {as_copy.line}: the rank's own copy moves `{text(arg)}`, not a block of "
                               f"`{base}`")
        _at_block(index, peer, var, as_copy, scalars)
    count = re.sub(r"[\s()]", "", send.args["count"])
    sized = re.fullmatch(rf"{re.escape(count)}\*sizeof(.+)|sizeof(.+)\*{re.escape(count)}",
                         re.sub(r"\s", "", text(args[2])).replace(f"({count})", count))
    elem = (sized.group(1) or sized.group(2)) if sized is not None else None
    if elem is None or C_SIZES.get(elem.strip("()").replace("const", "")) != size:
        raise PairingError(f"line {as_copy.line}: the rank's own copy moves `{text(args[2])}` bytes, not the count's "
                           f"({send.args['count']} elements of {size} bytes)")


def block(arg, op: Op):
    """`x + index`, `index + x` or `&x[index]`: the buffer's start and the index into it."""
    node = strip(arg)
    if node.type == "pointer_expression" and text(node).startswith("&"):
        inner = node.child_by_field_name("argument")
        if inner is not None and inner.type == "subscript_expression":
            indices = inner.child_by_field_name("indices")
            if indices is not None and indices.named_child_count == 1:
                return inner.child_by_field_name("argument"), indices.named_children[0]
    if node.type == "binary_expression" and text(node.child_by_field_name("operator")) == "+":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if any(n.type == "identifier" for n in walk(right)) and strip(left).type != "number_literal":
            return left, right
    raise PairingError(f"line {op.line}: {op.name}'s buffer `{text(arg)}` is not a block of one buffer (`x + p * "
                       "count` or `&x[p * count]`)")


def _at_block(index, peer: PeerExpression, var: str, op: Op, scalars: dict[str, str | None]) -> None:
    """The index is the peer times the call's count, for every rank, world size and iteration checked."""
    count = op.args["count"].strip()
    inner = count[1:-1] if count.startswith("(") and count.endswith(")") else count
    as_written = re.sub(r"\s+", " ", text(index))
    symbol = "cucoCount"
    for form in (f"({inner})", inner):
        as_written = re.sub(rf"(?<![\w>.]){re.escape(form)}(?!\w)", symbol, as_written)
    offset = PeerExpression(as_written, scalars)
    wrong = f"line {op.line}: {op.name}'s buffer is at index `{text(index)}`, not the peer times the count ({count})"
    try:
        for world in WORLDS:
            for rank in range(world):
                for i in range(world):
                    for c in COUNTS:
                        if offset(rank, world, {var: i, symbol: c}) != peer(rank, world, {var: i}) * c:
                            raise PairingError(wrong)
    except PairingError as exc:
        if str(exc) == wrong:
            raise
        _at_block_by_value(index, count, peer, var, scalars, wrong, str(exc))


def _at_block_by_value(index, count: str, peer: PeerExpression, var: str, scalars: dict[str, str | None],
                       wrong: str, why: str) -> None:
    """The index and the count both evaluated, the workload's parameters bound to each of PARAMETER_VALUES (for
    an index written from the count's parts, `peer * per_peer * hidden` with a count of `per_peer * hidden`)."""
    offset, counted = PeerExpression(re.sub(r"\s+", " ", text(index)), scalars), PeerExpression(count, scalars)
    for value in PARAMETER_VALUES:
        for world in WORLDS:
            for rank in range(world):
                for i in range(world):
                    bound = {var: i, PARAMETER: value}
                    try:
                        at, c = offset(rank, world, bound), counted(rank, world, bound)
                    except PairingError:  # what the first reading could not evaluate, said as it said it
                        raise PairingError(f"{wrong}: {why}") from None
                    if at != peer(rank, world, {var: i}) * c:
                        raise PairingError(wrong)


def _statements(body) -> list:
    """A body's statements, comments left out."""
    if body is None or body.type != "compound_statement":
        return [body]
    return [c for c in body.named_children if c.type != "comment"]


def _nothing_else(loop, calls: tuple[Op, ...], own) -> None:
    """The loop holds the calls, integer definitions (a peer's) and the rank's own copy, nothing the all-to-all
    would drop."""
    statements = _statements(loop.child_by_field_name("body"))
    for st in statements:
        if own is not None and st is not None and st.id == own.id:
            other = st.child_by_field_name("alternative")
            statements += [s for c in (other.named_children if other is not None else []) for s in _statements(c)]
            continue
        if st is None or st.type not in STATEMENTS or (
                st.type == "expression_statement" and not any(c.span[0] >= st.start_byte and c.span[1] <= st.end_byte
                                                              for c in calls)) or (
                st.type == "declaration" and any(n.type in ("call_expression", "pointer_declarator", "assignment_"
                                                            "expression") for n in walk(st))):
            what = " ".join(text(st).split())[:60] if st is not None else "an empty body"
            raise PairingError(f"line {st.start_point.row + 1 if st is not None else loop.start_point.row + 1}: the "
                               f"loop of line {loop.start_point.row + 1} also does `{what}`: the rules read a loop of "
                               "one ncclSend and one ncclRecv to every peer as an all-to-all, and nothing else")


def proven(analysis: Analysis) -> dict[int, AllToAll]:
    """The groups of the analysed program that are all-to-alls, by the op index of their send and their receive."""
    out: dict[int, AllToAll] = {}
    group: list[Op] | None = None
    for op in analysis.nccl:
        if op.name == "ncclGroupStart":
            group = [op]
        elif op.name == "ncclGroupEnd" and group is not None:
            sends = [o for o in group if o.name == "ncclSend"]
            recvs = [o for o in group if o.name == "ncclRecv"]
            if len(sends) == len(recvs) == 1 == len(group) - 2 and \
                    min(len(sends[0].loops), len(recvs[0].loops)) > len(group[0].loops):
                pointers = analysis.pointers.get(op.function)
                try:
                    found = all_to_all(analysis.source, sends[0], recvs[0], analysis.scalars.get(op.function, {}),
                                       pointers.types if pointers is not None else {})
                except PairingError:
                    found = None
                if found is not None:
                    out[sends[0].index] = out[recvs[0].index] = found
            group = None
        elif group is not None:
            group.append(op)
    return out
