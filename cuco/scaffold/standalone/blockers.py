"""Why a standalone program that main() does not set up as the conversion reads it cannot become a seed, every
reason in one run.

The conversion takes over the communicator main() creates and the buffers main() allocates. A program that makes
its communicator elsewhere, or hands its collectives pointers the analysis cannot follow to an allocation, would
otherwise become a workload built from guesses (argv as a buffer, a verification flag as the output); it is refused
instead, with each blocker on its own line (file:line, the statement, the reason), so one edit pass can fix them all.
"""

from __future__ import annotations

import re
from pathlib import Path

from cuco.errors import CucoError
from cuco.fastpath.analyze import AnalysisError, analyze
from cuco.fastpath.places import Place, Pointers, Unplaced
from cuco.fastpath.syntax import call_args, callee, text, walk
from cuco.scaffold.standalone.calls import COMM_INIT
from cuco.scaffold.standalone.nodes import address_of, calls_in
from cuco.scaffold.standalone.program import Refusal, Standalone

CREATES_COMM = COMM_INIT | {"ncclCommInitAll"}


class Blocked(CucoError):
    """A program cuco init refuses, with every blocker found: one line each, `file:line: statement: reason`."""

    def __init__(self, path: Path, blockers: list[str]) -> None:
        self.blockers = blockers
        super().__init__(str(path), f"cuco init cannot convert this program ({len(blockers)} blocker(s), each "
                                    "below); nothing was written\n" + "\n".join(f"  {b}" for b in blockers))


def refuse_all(prog: Standalone, refused: list[CucoError]) -> None:
    """Every blocker found, in one run: one line where there is one (file, line and statement), else all of them in
    the order of the program as read (its helpers' lines where main() calls them)."""
    refused = sorted({str(exc): exc for exc in refused}.values(),
                     key=lambda exc: exc.line_read if isinstance(exc, Refusal) else 0)
    if len(refused) == 1:
        raise refused[0]
    if refused:
        raise Blocked(prog.path, [str(exc) for exc in refused])


def _line(prog: Standalone, line: int, what: str, why: str) -> str:
    what = " ".join(what.split())
    return f"{prog.origin(line)}: `{what if len(what) <= 80 else what[:77] + '...'}`: {why}"


def _statement(node):
    """The statement a call stands in (a check macro and its `;` included), for the line shown."""
    while node.parent is not None and not node.type.endswith(("statement", "declaration")):
        node = node.parent
    return node


def _communicator(prog: Standalone) -> list[str]:
    """Each communicator made outside main(); main() itself named when no function makes one."""
    found = []
    for name, fn in prog.functions.items():
        for call in calls_in(fn):
            if callee(call) in CREATES_COMM and name != "main":
                st = _statement(call)
                why = prog.unit.unwritten.get(name)
                found.append(_line(prog, st.start_point.row + 1, st.text.decode(errors="replace"),
                                   f"creates the communicator inside {name}()" +
                                   (f", which cuco cannot write out in place (it {why})" if why else "") +
                                   ": cuco takes over the communicator main() creates (it becomes ctx->comm); create "
                                   "it in main(), or in a helper main() calls that returns it or takes its address"))
    if not found and not any(callee(c) in CREATES_COMM for c in calls_in(prog.root)):
        comms = {text(d) for n in walk(prog.main) if n.type == "declaration" and "ncclComm_t" in text(
            n.child_by_field_name("type") or n) for d in walk(n) if d.type == "identifier"}
        unseen = [c for c in calls_in(prog.main) if callee(c) in prog.undefined or (
            callee(c) not in prog.functions and any(address_of(a) in comms for a in call_args(c)))]
        for call in unseen:  # where the communicator may be made, out of sight
            st, name = _statement(call), callee(call)
            where = f"which the program declares ({prog.at(prog.undefined[name])}) but" if name in prog.undefined \
                else "given the communicator's address, which"
            found.append(_line(prog, st.start_point.row + 1, st.text.decode(errors="replace"),
                               f"calls {name}(), {where} none of the files given defines: if it creates the "
                               "communicator, give its file too (--from)"))
        if not unseen:
            main = prog.main
            found.append(_line(prog, main.start_point.row + 1, "int main(...)",
                               f"creates no communicator ({', '.join(sorted(COMM_INIT))}): cuco takes over the one "
                               "main() creates (it becomes ctx->comm)"))
    return found


def _unfollowed(expr: str, function: str, pointers: Pointers | None) -> str | None:
    """Why `expr`, a collective's pointer in FUNCTION, is not a buffer the analysis follows to its allocation; None
    where it is. A helper's pointer parameter is named as such before anything else: the analysis keys allocations
    by name, so a parameter that shares a name with main()'s pointer would look allocated."""
    root = re.match(r"[\s(]*(?:\([^()]*\)\s*)?([A-Za-z_]\w*)", expr)
    if pointers is not None and root is not None and root.group(1) in pointers.params:
        return (f"a parameter of {function}(): the conversion follows only buffers main() allocates and hands to "
                "NCCL itself")
    place = pointers.reach(expr) if pointers is not None else None
    if isinstance(place, Place):
        return None
    return place.reason if isinstance(place, Unplaced) else \
        "not a buffer the program allocates (cudaMalloc) where the analysis can follow it"


def _buffers(prog: Standalone, raw: bytes) -> list[str]:
    """Each collective whose send or receive pointer the analysis cannot follow to a buffer the program allocates."""
    try:
        analysis = analyze(prog.path, raw)  # the program as read: its lines are mapped back
    except AnalysisError as exc:
        raise CucoError("", str(exc)) from None
    found = []
    for op in (o for o in analysis.ops if o.kind in ("collective", "p2p")):
        pointers = analysis.pointers.get(op.function)
        why: dict[str, list[str]] = {}  # reason -> the buffers it holds for
        for role in ("send", "recv"):
            expr = op.args.get(role)
            if expr is None or (role == "recv" and expr == op.args.get("send")):
                continue
            reason = _unfollowed(expr, op.function, pointers)
            if reason:
                why.setdefault(reason, []).append(f"{'receive' if role == 'recv' else 'send'} buffer `{expr}`")
        if why:
            call = analysis.source[op.span[0]:op.span[1]].decode(errors="replace")
            found.append(_line(prog, op.line, call, f"in {op.function}(), " + "; ".join(
                f"its {' and '.join(held)}: {reason}" for reason, held in why.items())))
    return found


def blockers(prog: Standalone, raw: bytes) -> list[str]:
    """Every reason found why the program's main() is not one the conversion takes apart."""
    return _communicator(prog) + _buffers(prog, raw)
