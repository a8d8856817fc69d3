"""The knobs of a rewritten program: the design points the rules' rewrite can take, derived from the analysis, so
that the directive proposer can search a user's own program with no strategy kernel written by hand.

Per rewritten collective: the issuer (the grid striding over the buffer, or a contiguous slice per warp), the CTA
count of its kernel, the backend (the copy engine, for a collective that only copies: an all-gather, an all-to-all,
a send batch) and the placement. `stream_overlap` (the collective on a side stream, joined back where its buffers
are next used) is offered only where the analysis proves it safe: in cuco_run, outside any loop, on a known stream
that the program does not share with a side stream of its own, and with every operation between it and that next
use on the same stream, naming only buffers the analysis knows, touching none of the collective's buffers, and
neither a collective (every rank must issue device collectives in one order) nor a synchronisation. Where that next
use is a GEMM reading an all-gather's output as whole rows (cuco/fastpath/gemm_rows.py), on the same stream and
writing none of its buffers, sync `chunk` is offered too: the all-gather flags each of CUCO_CHUNKS pieces of every
rank's block as it lands, and the GEMM runs piece by piece behind them, nothing else between the two needed. The
mirror image for a reduce-scatter whose input the GEMM before it writes as whole rows of its output: the GEMM flags
each piece to the rank that sums it, and the reduce-scatter, started before the GEMM, sums pieces as they are
flagged. And for an all-reduce of what the GEMM before it writes (the row-parallel linear layer): the GEMM runs in
pieces of its output's columns, each flagged on every rank, and the all-reduce, started before the GEMM, sums each
rank's share of a piece as soon as every rank has flagged it, so that the exchange runs inside the GEMM. What is not
offered says why (`cuco transform --explain`).

The derived strategy is the rewritten program itself, compiled at a point by the same definitions as a workload's
strategy kernels (cuco/evolve/strategy.py), one strategy per CTA count; with no definition it is the rules'
conservative rewrite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cuco.fastpath.analyze import Analysis, Op
from cuco.fastpath.annotate import ENTRY_POINTS, annotate
from cuco.fastpath.gemm_rows import ColumnSplit, Pieces, column_split, output_split, row_split
from cuco.fastpath.peer_loops import proven
from cuco.fastpath.places import Place
from cuco.fastpath.rewrite import rewrite
from cuco.workload.spec import Requirements, StrategySpec, WorkloadSpec

CTAS = (32, 64, 128)  # CTA counts offered (CUCO_COLL_CTAS; 64 is the rules' own)
CE_CTAS = 64  # the copy engine's points are given once, with the rules' own CTA count: it moves bytes without CTAs
ISSUERS = ("cta", "warp")
PIECES = (1, 2, 4)  # sync chunk: pieces of each rank's block (CUCO_CHUNKS)
MAX_SITES = 4  # collectives of one program with a consumer that waits per piece (CUCO_COLL_MAX_SITES)
GROUP, EVERY_PEER = "group of ncclSend/ncclRecv", "ncclSend/ncclRecv to every peer (an all-to-all)"
COPIES = ("ncclAllGather", "ncclAlltoAll")  # collectives that only copy (and send/recv groups): the copy engine's
ONLY_GATHER = "only an all-gather's consumer and a reduce-scatter's or all-reduce's producer are cut into pieces"
PRODUCED = ("ncclReduceScatter", "ncclAllReduce")  # collectives whose producing GEMM is cut (the others' consumer)
ENTRY = "cuco_run"  # the step the runner times: the only function whose collectives are placed
PREAMBLE = "// cuco derived strategy: the fast path's rewrite of {source}, its knobs set by the point's definitions.\n"
# A point's values as cuco_collectives.cuh's own knobs (StrategySpec.point_defines): defined where the point has them.
POINT_DEFINES = (("issuer", "warp", "CUCO_COLL_ISSUER_WARP"), ("placement", "stream_overlap", "CUCO_COLL_SIDE_STREAM"),
                 ("backend", "ce", "CUCO_COLL_CE"), ("sync", "chunk", "CUCO_COLL_CHUNK_SYNC"))
# Points that would repeat another's program: more pieces without the flags that use them, the copy engine with
# flags its kernel raises (it has none).
EXCLUDES = ({"sync": ("global",), "chunks": PIECES[1:]}, {"backend": ("ce",), "sync": ("chunk",)})


@dataclass
class Offer:
    """One rewritten collective (or send/recv group): the knobs offered for it and why any is not."""

    line: int
    name: str
    why_not: dict[str, str] = field(default_factory=dict)  # knob -> the reason it is not offered
    beside: list[str] = field(default_factory=list)  # stream_overlap: the operations that run beside it
    join: int | None = None  # stream_overlap, where offered: the byte where its side stream joins back
    index: int = -1  # the collective's operation in the analysis
    pieces: Pieces | None = None  # sync chunk, where offered: the GEMM beside it, piece by piece
    copies: bool = False  # it only copies: the copy engine can move it

    @property
    def placements(self) -> tuple[str, ...]:
        overlap = self.join is not None or self.pieces is not None
        return ("deferred",) + (("stream_overlap",) if overlap else ())

    @property
    def syncs(self) -> tuple[str, ...]:
        return ("global",) + (("chunk",) if self.pieces is not None else ())


@dataclass
class Knobs:
    source: str
    offers: list[Offer]
    code: str  # the rewritten program with its side-stream sites, before the point's definitions

    @property
    def accepts(self) -> dict[str, tuple]:
        placements = ("deferred",) + (("stream_overlap",) if any(len(o.placements) > 1 for o in self.offers) else ())
        pieces = any(o.pieces is not None for o in self.offers)
        return {"backend": ("lsa",) + (("ce",) if any(o.copies for o in self.offers) else ()),
                "placement": placements, "sync": ("global", "chunk") if pieces else ("global",), "issuer": ISSUERS,
                "chunks": PIECES if pieces else (1,)}

    def points(self) -> int:
        return sum(len(s.points()) for s in self._strategies(Path(self.source)).values())

    def explain(self) -> list[str]:
        lines = []
        for o in self.offers:
            backends = "lsa or ce" if o.copies else "lsa"
            lines.append(f"line {o.line}: {o.name}: backend {backends}, issuer {' or '.join(ISSUERS)}, "
                         f"CTAs {', '.join(map(str, CTAS))}, placement {' or '.join(o.placements)}, "
                         f"sync {' or '.join(o.syncs)}")
            if o.beside:
                lines.append(f"  stream_overlap: on a side stream beside {', '.join(o.beside)}")
            if o.pieces is not None:
                lines.append(f"  sync chunk: {_pieces_said(o.pieces)}")
            lines += [f"  {knob} not offered: {why}" for knob, why in o.why_not.items()]
        return lines

    def strategies(self, directory: Path, spec: WorkloadSpec) -> dict[str, StrategySpec]:
        """The derived program written into DIRECTORY, and one strategy per CTA count over it. Each needs every rank
        in one LSA team (its collectives store into the peers' windows): the runner says so before setup where
        a run's ranks are not; and a side stream at the points that issue a collective beside the compute."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "rewrite.cu"
        path.write_text(PREAMBLE.format(source=Path(self.source).name) + self.code)
        return self._strategies(path, spec.includes)

    def _strategies(self, path: Path, includes: tuple[Path, ...] = ()) -> dict[str, StrategySpec]:
        return {f"rewrite_ctas{n}": StrategySpec(f"rewrite_ctas{n}", path, self.accepts, includes,
                                                 (("CUCO_COLL_CTAS", str(n)),), POINT_DEFINES,
                                                 Requirements(lsa_team=True, side_streams=1,
                                                              side_streams_at=("stream_overlap",)),
                                                 EXCLUDES + (() if n == CE_CTAS else ({"backend": ("ce",)},)))
                for n in CTAS}

    @staticmethod
    def start_strategy(strategies: dict[str, StrategySpec]) -> StrategySpec:
        """Where an LLM search starts beside the seed: this strategy's points, every issuer and placement the rewrite
        offers at the most CTAs (the CTA count is a number in the same code, for the LLM to vary)."""
        return strategies[f"rewrite_ctas{max(CTAS)}"]


def derive(analysis: Analysis, spec: WorkloadSpec) -> Knobs:
    """The knobs of the rules' rewrite of the analysed program; raises RewriteError where the rules refuse it (the
    rewrite below refuses whatever the conservative one does: the joins and the GEMMs cut into pieces are all it
    adds)."""
    offers = []
    group: Op | None = None
    calls, every_peer = analysis.nccl, proven(analysis)
    for i, op in enumerate(calls):
        if op.kind == "group":
            group = op if op.name == "ncclGroupStart" else None
            if op.name == "ncclGroupEnd":
                continue
            first = calls[i + 1] if i + 1 < len(calls) else None  # none after an unterminated group: refused below
            offers.append(Offer(op.line, EVERY_PEER if first is not None and first.index in every_peer else GROUP,
                                {"stream_overlap": "a send/recv group's side-stream placement is not derived",
                                 "sync chunk": ONLY_GATHER}, copies=True))
        elif group is None:
            offers.append(_offer(op, analysis, sum(len(o.placements) > 1 for o in offers)))
    overlap = {o.index: o.join for o in offers if o.join is not None and (o.pieces is None or o.pieces.produces)}
    pieces = {o.index: o.pieces for o in offers if o.pieces is not None}
    code = annotate(rewrite(analysis, spec, overlap, pieces).code)
    return Knobs(analysis.path, offers, code)


def _offer(op: Op, analysis: Analysis, sites: int) -> Offer:
    found = _overlap(op, analysis)
    offer = Offer(op.line, op.name, index=op.index, copies=op.name in COPIES)
    if isinstance(found, str):
        offer.why_not["stream_overlap"] = found
    else:
        offer.beside, offer.join = found
    if sites >= MAX_SITES:
        offer.why_not["sync chunk"] = f"the program has {MAX_SITES} collectives on side streams before it already"
        return offer
    pieces = _producer(op, analysis) if op.name in PRODUCED else _consumer(op, analysis)
    if isinstance(pieces, str):
        offer.why_not["sync chunk"] = pieces
        return offer
    offer.pieces = pieces
    offer.why_not.pop("stream_overlap", None)
    if pieces.produces:  # the reduce-scatter's side stream joins back where its output is next used
        offer.join = pieces.join
    return offer


def _unplaceable(op: Op, analysis: Analysis) -> str | None:
    """Why no placement beside other work can be proven for OP, or None."""
    if op.function != ENTRY:
        return f"it is in {op.function}(), not in {ENTRY}() (the step the runner times)"
    if op.loops:
        return f"it is inside the loop of line {op.loops[-1]}: an overlap across iterations is not proven"
    if not op.stream:
        return "its stream is not known"
    if b"sideStreams" in analysis.source:
        return "the program uses ctx->sideStreams itself: the side stream is not free"
    helper = next((o for o in analysis.ops if o.function not in ENTRY_POINTS), None)
    if helper is not None:  # where cuco_run calls it is not tracked, so it may use the buffers before the join
        return f"line {helper.line}: {helper.name} is in {helper.function}(), a function of the program's own that " \
               f"{ENTRY}() may call: what it does between the collective and the join is not known"
    if ("send" in op.args and not op.reads) or ("recv" in op.args and not op.writes):
        return "one of its buffers is not known to the analysis"
    deferred = next((o for o in analysis.ops if o.function == op.function and o.deferred), None)
    if deferred is not None:
        return f"line {deferred.line}: {deferred.name} is in a lambda of {ENTRY}(): it runs where the lambda is " \
               "called, which the analysis does not follow"
    return None


def _before_next_use(op: Op, analysis: Analysis) -> tuple[list[Op], Op | None] | str:
    """The operations of cuco_run between OP and the next one that uses its buffers (None: no such use), or why the
    analysis cannot vouch for what runs there."""
    why = _unplaceable(op, analysis)
    if why:
        return why
    mine = set(op.reads) | set(op.writes)
    between: list[Op] = []
    moved = analysis.pointers[op.function].reassigned if op.function in analysis.pointers else {}
    for o in (o for o in analysis.ops if o.function == op.function and o.index > op.index):
        if mine & (set(o.reads) | set(o.writes)):
            return between, o
        unsure = next((p for p in moved if any(re.search(rf"\b{re.escape(p)}\b", a) for a in o.operands)), None)
        reason = f"{o.name} takes `{unsure}`, a pointer assigned again ({moved[unsure]}): which buffer it names is " \
            "not known" if unsure else _blocks_overlap(op, o)
        if reason:
            return f"line {o.line}: {reason}"
        between.append(o)
    return between, None


def _overlap(op: Op, analysis: Analysis) -> tuple[list[str], int] | str:
    """(the operations beside it, the byte of the join) where a side stream is safe for OP, else why not."""
    found = _before_next_use(op, analysis)
    if isinstance(found, str):
        return found
    between, user = found
    beside = [f"{o.name} (line {o.line})" for o in between]
    if user is not None:
        touched = sorted((set(op.reads) | set(op.writes)) & (set(user.reads) | set(user.writes)))
        if not beside:
            return f"line {user.line}: {user.name} uses its buffer `{touched[0]}` next: nothing runs between them"
        if user.statement < 0:
            return f"line {user.line}: {user.name}, which uses its buffers next, does not stand in a block of " \
                   "statements: the join cannot go before it"
        return _unjoined(op, user, user.statement, analysis) or (beside, user.statement)
    if not beside:
        return "nothing follows it in cuco_run to overlap with"
    end = analysis.ends.get(op.function, -1)
    if end < 0:
        return "the end of cuco_run cannot be found"
    return _unjoined(op, None, end, analysis) or (beside, end)


def _join(op: Op, analysis: Analysis) -> int | None:
    """Where OP's side stream may join back: before the next use of its buffers, or at the end of cuco_run."""
    found = _before_next_use(op, analysis)
    if isinstance(found, str):
        return None
    user = found[1]
    at = user.statement if user is not None else analysis.ends.get(op.function, -1)
    return at if at >= 0 and _unjoined(op, user, at, analysis) is None else None


def _unjoined(op: Op, user: Op | None, at: int, analysis: Analysis) -> str | None:
    """Why a join at byte AT would not be on every path from OP to the next use of its buffers (USER, None: the end
    of cuco_run), or None: the use is in OP's own block, and no return lies between."""
    if user is not None and user.block != op.block:
        return f"line {user.line}: {user.name}, which uses its buffers next, is not in the collective's block of " \
               "statements (a branch or a loop): a join before it would not be on every path"
    early = next((r for r in analysis.returns.get(op.function, []) if op.span[1] <= r < at), None)
    if early is not None:
        line = analysis.source.count(b"\n", 0, early) + 1
        return f"line {line}: a return between it and its join would end cuco_run with the collective running"
    return None


def _gemm_beside(op: Op, gemm: Op) -> str | None:
    """Why GEMM, the other half of OP's pieces, cannot be cut beside it, or None."""
    if gemm.kind != "blas":
        return f"line {gemm.line}: {gemm.name} is not a GEMM"
    if gemm.stream != op.stream:
        return f"line {gemm.line}: {gemm.name} runs on {gemm.stream or 'a stream the analysis does not know'}, " \
               f"not on {op.stream}"
    if gemm.statement < 0 or gemm.loops or gemm.block != op.block:
        return f"line {gemm.line}: {gemm.name} does not stand in the collective's own block of statements"
    return None


def _reach(expr: str, gemm: Op, analysis: Analysis):
    """GEMM's function's pointers, and the place EXPR names in them (a Place where it is known)."""
    pointers = analysis.pointers.get(gemm.function)
    return pointers, (pointers.reach(expr) if pointers is not None else None)


def _operand(expr: str, gemm: Op, positions: list[int], analysis: Analysis) -> int | None:
    """The first of POSITIONS where GEMM names the buffer EXPR names, from the same byte."""
    pointers, place = _reach(expr, gemm, analysis)
    return next((i for i in positions if isinstance(place, Place) and pointers.reach(gemm.operands[i]) == place), None)


def _aliases(expr: str, gemm: Op, out: int, analysis: Analysis) -> bool:
    """Whether an operand of GEMM other than its output OUT lies in the buffer EXPR names."""
    pointers, place = _reach(expr, gemm, analysis)
    return isinstance(place, Place) and any(
        isinstance(q := pointers.reach(a), Place) and q.base == place.base
        for i, a in enumerate(gemm.operands) if i != out)


def _pieces_said(pieces: Pieces) -> str:
    gemm, counts = pieces.gemm, " or ".join(map(str, PIECES))
    if isinstance(pieces.split, ColumnSplit):
        return f"{gemm.name} (line {gemm.line}) writes its input by columns, {counts} pieces, each summed once " \
               "every rank has written it"
    how = "writes its input" if pieces.produces else "reads its output"
    return f"{gemm.name} (line {gemm.line}) {how} by rows, {counts} pieces of each rank's block, each behind its flags"


def _producer(op: Op, analysis: Analysis) -> Pieces | str:
    """The GEMM that writes a reduce-scatter's or all-reduce's input piece by piece (sync chunk), or why there is
    none. An all-reduce in place (its output its input) is the GEMM's output too."""
    why = _unplaceable(op, analysis)
    if why:
        return why
    mine = set(op.reads) | set(op.writes)
    for o in reversed([o for o in analysis.ops if o.function == op.function and o.index < op.index]):
        if mine & (set(o.reads) | set(o.writes)):
            gemm = o
            break
        reason = _blocks_overlap(op, o)
        if reason:
            return f"line {o.line}: {reason}"
    else:
        return "no GEMM in cuco_run writes its input"
    why = _gemm_beside(op, gemm)
    if why:
        return why
    what = "reduce-scatter" if op.name == "ncclReduceScatter" else "all-reduce"
    out = set(op.writes) - set(op.reads)  # an all-reduce in place writes only what it reads
    if out & (set(gemm.reads) | set(gemm.writes)):
        return f"line {gemm.line}: {gemm.name} touches the {what}'s output `{sorted(out)[0]}`"
    split = output_split(gemm) if op.name == "ncclReduceScatter" else column_split(gemm)
    if isinstance(split, str):
        return f"line {gemm.line}: {split}"
    if _operand(op.args["send"], gemm, [split.out], analysis) is None:
        return f"line {gemm.line}: {gemm.name} does not write the {what}'s input from its start " \
               f"(`{op.args['send']}`)"
    if _aliases(op.args["send"], gemm, split.out, analysis):
        return f"line {gemm.line}: {gemm.name} also reads the {what}'s input as another operand"
    join = _join(op, analysis)
    if join is None:
        return "its side stream has no place to join back (the next use of its output, or the end of cuco_run)"
    return Pieces(gemm, split, produces=True, join=join)


def _consumer(op: Op, analysis: Analysis) -> Pieces | str:
    """The GEMM that may read OP's output piece by piece (sync chunk), or why there is none."""
    if op.name != "ncclAllGather":
        return ONLY_GATHER
    found = _before_next_use(op, analysis)
    if isinstance(found, str):
        return found
    user = found[1]
    if user is None:
        return "its output is not next read by a GEMM"
    if user.kind != "blas":
        return f"line {user.line}: {user.name}, its next use, is not a GEMM"
    why = _gemm_beside(op, user)
    if why:
        return why
    mine = set(op.reads) | set(op.writes)
    if mine & set(user.writes):
        return f"line {user.line}: {user.name} writes the all-gather's buffer `{sorted(mine & set(user.writes))[0]}`"
    operand = _operand(op.args["recv"], user, list(range(len(user.operands))), analysis)
    if operand is None:
        return f"line {user.line}: {user.name} does not read the gathered buffer from its start (`{op.args['recv']}`)"
    if _aliases(op.args["recv"], user, operand, analysis):  # that operand would be read before its rows arrive
        return f"line {user.line}: {user.name} also reads the gathered buffer as another operand"
    split = row_split(user, operand)
    if isinstance(split, str):
        return f"line {user.line}: {split}"
    return Pieces(user, split)


def _blocks_overlap(op: Op, o: Op) -> str | None:
    """Why O, which follows OP before any use of OP's buffers, keeps OP off a side stream; None if it may run beside."""
    if o.kind in ("collective", "p2p", "group"):
        return f"{o.name} would run beside it: every rank must issue device collectives in one order"
    if o.kind == "sync":
        return f"{o.name} synchronises before its buffers are used"
    if o.kind in ("alloc", "free"):
        return f"{o.name} changes the program's memory before its buffers are used"
    if o.unplaced:
        what = "is defined elsewhere: what its pointers name is not known" if o.unplaced == ["?"] else \
            "reaches memory through pointers it is not given (a table or a struct of pointers, a __device__ " \
            "pointer, an address cast from data)" \
            if o.unplaced == ["*"] else f"takes `{o.unplaced[0]}`, which names no buffer the analysis knows"
        return f"{o.name} {what}, so it may touch the collective's buffers"
    if o.loops:
        return f"{o.name} is inside the loop of line {o.loops[-1]}"
    if o.stream != op.stream:
        return f"{o.name} runs on {o.stream or 'an unknown stream'}, not on {op.stream}"
    return None
