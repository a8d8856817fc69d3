"""Which receive each send of a group lands in, proved for every rank at every world size checked, or refused.

NCCL matches the k-th send from rank r to rank q with the k-th receive that q posts from r. A rewrite into
cuco::SendBatch has to name, statically, the receive buffer on the peer that each send writes: that is only right
if the same receive of the group is the match on every rank and at every world size. The peer expressions are
evaluated with C's integer arithmetic from the program's own definitions (`const int next = (ctx->rank + 1) %
ctx->nRanks`); a peer the rules cannot evaluate, or a pairing that changes with the rank or the world size, is
refused with the reason.
"""

from __future__ import annotations

import ast
import keyword
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

# The contract's context (cuco.h): ctx->rank and ctx->nRanks are the only values a peer expression may start from.
CONTEXT_FIELDS = ("rank", "nRanks")
WORLDS = range(2, 17)  # world sizes the pairing is checked at: every size up to two 8-GPU boxes
# Integer casts the rules look through: `(int)p` is p (ranks fit every integer type).
CAST = re.compile(r"\(\s*(?:const\s+)?(?:unsigned\s+|signed\s+)?"
                  r"(?:int|long|long long|short|size_t|u?int(?:8|16|32|64)_t)\s*\)")
KEYWORD = re.compile(rf"(?<![\w.])({'|'.join(keyword.kwlist)})\b")
KEPT = "cuco_kw_"  # the prefix a keyword's name is read under
PARAMETER = "cuco_param"  # the env key a caller binds every workload parameter (cuco_param(ctx, "N")) to
MAX_DEPTH = 16  # definitions followed through at most this many names (a cycle is refused, not followed forever)


class PairingError(ValueError):
    """The rules cannot prove where a send lands; the message says why, for the program's author."""


@dataclass(frozen=True)
class Call:
    """One ncclSend or ncclRecv of a group: its line and its peer, as the program writes it."""

    line: int
    peer: str


def _c_div(a: int, b: int) -> int:
    """C's integer division: the quotient truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# C's integer operators on ints (ranks are small and non-negative where bits are involved).
_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y, ast.Div: _c_div,
    ast.Mod: lambda x, y: x - y * _c_div(x, y), ast.BitXor: lambda x, y: x ^ y, ast.BitAnd: lambda x, y: x & y,
    ast.BitOr: lambda x, y: x | y}
ARITHMETIC = "integers, + - * / % ^ & |, parentheses"


class PeerExpression:
    """A peer expression of the program, evaluated for a rank and a world size (and the loop variables BOUND, where
    the expression stands in a loop over peers)."""

    def __init__(self, text: str, scalars: dict[str, str | None]) -> None:
        self.text, self.scalars = text, scalars

    def __call__(self, rank: int, world: int, bound: dict[str, int] | None = None) -> int:
        return self._eval(self.text, {"ctx.rank": rank, "ctx.nRanks": world, **(bound or {})}, 0)

    def _eval(self, text: str, env: dict[str, int], depth: int) -> int:
        if depth > MAX_DEPTH:
            raise PairingError(f"peer `{self.text}`: its definitions refer to each other")
        # `ctx->rank` reads as the attribute `ctx.rank` (C's `.` on anything else is refused below); a C name that is
        # a Python keyword (`from`, `in`) is read under another name
        python = KEYWORD.sub(lambda m: KEPT + m.group(1), CAST.sub("", re.sub(r"\s*->\s*", ".", text))).strip()
        try:
            tree = ast.parse(python, mode="eval")
        except SyntaxError:
            raise PairingError(f"peer `{self.text}`: `{text.strip()}` is not arithmetic the rules can evaluate "
                               f"({ARITHMETIC})") from None
        return self._node(tree.body, env, depth)

    def _node(self, node: ast.AST, env: dict[str, int], depth: int) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx" \
                and node.attr in CONTEXT_FIELDS:
            return env[f"ctx.{node.attr}"]
        if isinstance(node, ast.Name):
            return self._name(node.id, env, depth)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self._node(node.operand, env, depth)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = self._node(node.left, env, depth), self._node(node.right, env, depth)
            if isinstance(node.op, (ast.Div, ast.Mod)) and b == 0:
                raise PairingError(f"peer `{self.text}` divides by zero at world {env['ctx.nRanks']}")
            return _OPS[type(node.op)](a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cuco_param" and \
                PARAMETER in env:  # a workload parameter: the same on every rank; each name its own value
            name = node.args[-1].value if node.args and isinstance(node.args[-1], ast.Constant) else ""
            return env[PARAMETER] + zlib.crc32(str(name).encode()) % 61 * 2
        raise PairingError(f"peer `{self.text}`: `{ast.unparse(node)}` is not arithmetic the rules can evaluate "
                           f"({ARITHMETIC})")

    def _name(self, name: str, env: dict[str, int], depth: int) -> int:
        name = name.removeprefix(KEPT)
        if name in env:
            return env[name]
        if name not in self.scalars:
            raise PairingError(f"peer `{self.text}` depends on `{name}`, which the program does not define from "
                               "ctx->rank and ctx->nRanks where the rules can see it")
        definition = self.scalars[name]
        if definition is None:
            raise PairingError(f"peer `{self.text}` depends on `{name}`, which the program assigns more than once "
                               "(a loop or a reassignment): its value at the call is not known")
        return self._eval(definition, env, depth + 1)


def pair(sends: list[Call], recvs: list[Call], scalars: dict[str, str | None]) -> list[int]:
    """For each send, the index of the receive of the same group it lands in on its peer, the same on every rank
    at every world size of WORLDS; PairingError where no such pairing exists or it cannot be proved."""
    send_peer = [PeerExpression(c.peer, scalars) for c in sends]
    recv_peer = [PeerExpression(c.peer, scalars) for c in recvs]
    chosen: dict[int, tuple[int, int]] = {}  # send -> (receive, the world size it was first seen at)
    for world in WORLDS:
        targets = [[_in_range(p(r, world), world, c, r) for p, c in zip(send_peer, sends)] for r in range(world)]
        sources = [[_in_range(p(q, world), world, c, q) for p, c in zip(recv_peer, recvs)] for q in range(world)]
        for r in range(world):
            for i, q in enumerate(targets[r]):
                k = targets[r][:i].count(q)  # earlier sends from r to q: NCCL matches in order
                matching = [j for j, src in enumerate(sources[q]) if src == r]
                if k >= len(matching):
                    raise PairingError(f"at world {world}, rank {r}'s ncclSend of line {sends[i].line} to rank {q} has "
                                       f"no ncclRecv from rank {r} on rank {q} to land in")
                j = matching[k]
                if chosen.setdefault(i, (j, world))[0] != j:
                    first, at = chosen[i]
                    raise PairingError(f"the ncclSend of line {sends[i].line} lands in the ncclRecv of line "
                                       f"{recvs[first].line} at world {at} but of line {recvs[j].line} at world "
                                       f"{world} (rank {r}): no one pairing is right at every world size")
        for q in range(world):
            for j, r in enumerate(sources[q]):
                if sum(1 for i, t in enumerate(targets[r]) if t == q) < sources[q][:j + 1].count(r):
                    raise PairingError(f"at world {world}, rank {q}'s ncclRecv of line {recvs[j].line} from rank {r} "
                                       "has no ncclSend from that rank: NCCL would wait for it forever")
    return [chosen[i][0] for i in range(len(sends))]


def _in_range(peer: int, world: int, call: Call, rank: int) -> int:
    if not 0 <= peer < world:
        raise PairingError(f"at world {world}, rank {rank}'s peer `{call.peer}` (line {call.line}) is {peer}, "
                           f"not a rank")
    return peer
