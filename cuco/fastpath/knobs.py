"""The knobs of a rewritten program: the design points the rules' rewrite can take, derived from the analysis, so
that the directive proposer can search a user's own program with no strategy kernel written by hand.

Per rewritten collective: the issuer (the grid striding over the buffer, or a contiguous slice per warp), the CTA
count of its kernel, and its placement. `stream_overlap` (the collective on a side stream, joined back where its
buffers are next used) is offered only where the analysis proves it safe: in cuco_run, outside any loop, on a
known stream that the program does not share with a side stream of its own, and with at least one operation
between it and that next use, every one of them on the same stream, naming only buffers the analysis knows,
touching none of the collective's buffers, and neither a collective (every rank must issue device collectives in
one order) nor a synchronisation. What is not offered says why (`cuco transform --explain`).

The derived strategy is the rewritten program itself, compiled at a point by the same definitions as a workload's
strategy kernels (cuco/evolve/strategy.py), one strategy per CTA count; with no definition it is the rules'
conservative rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cuco.fastpath.analyze import Analysis, Op
from cuco.fastpath.annotate import ENTRY_POINTS, annotate
from cuco.fastpath.rewrite import rewrite
from cuco.workload.spec import Requirements, StrategySpec, WorkloadSpec

CTAS = (32, 64, 128)  # CTA counts offered (CUCO_COLL_CTAS; 64 is the rules' own)
ISSUERS = ("cta", "warp")
ENTRY = "cuco_run"  # the step the runner times: the only function whose collectives are placed
NOT_OFFERED = {
    "backend ce": "the copy engine needs every peer's window address on the host, fetched in cuco_setup with a "
                  "synchronisation; the rules do not add setup steps",
    "chunks > 1": "cutting the transfer pays only where its consumer waits per chunk (a GEMM on rows split by "
                  "per-chunk flags), which is not derived",
    "sync chunk": "needs a consumer that waits per chunk (as chunks)",
}
PREAMBLE = "// cuco derived strategy: the fast path's rewrite of {source}, its knobs set by the point's definitions.\n"
# A point's values as cuco_collectives.cuh's own knobs (StrategySpec.point_defines): defined where the point has them.
POINT_DEFINES = (("issuer", "warp", "CUCO_COLL_ISSUER_WARP"), ("placement", "stream_overlap", "CUCO_COLL_SIDE_STREAM"))


@dataclass
class Offer:
    """One rewritten collective (or send/recv group): the knobs offered for it and why any placement is not."""

    line: int
    name: str
    why_not: dict[str, str] = field(default_factory=dict)  # placement -> the reason it is not offered
    beside: list[str] = field(default_factory=list)  # stream_overlap: the operations that run beside it
    join: int | None = None  # stream_overlap, where offered: the byte where its side stream joins back
    index: int = -1  # the collective's operation in the analysis

    @property
    def placements(self) -> tuple[str, ...]:
        return ("deferred",) + (("stream_overlap",) if self.join is not None else ())


@dataclass
class Knobs:
    source: str
    offers: list[Offer]
    code: str  # the rewritten program with its side-stream sites, before the point's definitions

    @property
    def accepts(self) -> dict[str, tuple]:
        placements = ("deferred",) + (("stream_overlap",) if any(o.join is not None for o in self.offers) else ())
        return {"backend": ("lsa",), "placement": placements, "sync": ("global",), "issuer": ISSUERS,
                "chunks": (1,)}

    def points(self) -> int:
        return len(CTAS) * len(ISSUERS) * len(self.accepts["placement"])

    def explain(self) -> list[str]:
        lines = []
        for o in self.offers:
            lines.append(f"line {o.line}: {o.name}: backend lsa, issuer {' or '.join(ISSUERS)}, "
                         f"CTAs {', '.join(map(str, CTAS))}, placement {' or '.join(o.placements)}")
            if o.beside:
                lines.append(f"  stream_overlap: on a side stream beside {', '.join(o.beside)}")
            lines += [f"  {placement} not offered: {why}" for placement, why in o.why_not.items()]
        lines += [f"not offered for any: {what}: {why}" for what, why in NOT_OFFERED.items()]
        return lines

    def strategies(self, directory: Path, spec: WorkloadSpec) -> dict[str, StrategySpec]:
        """The derived program written into DIRECTORY, and one strategy per CTA count over it. Each needs every rank
        in one LSA team (its collectives store into the peers' windows): the runner says so before setup where
        a run's ranks are not."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "rewrite.cu"
        path.write_text(PREAMBLE.format(source=Path(self.source).name) + self.code)
        return {f"rewrite_ctas{n}": StrategySpec(f"rewrite_ctas{n}", path, self.accepts, spec.includes,
                                                 (("CUCO_COLL_CTAS", str(n)),), POINT_DEFINES,
                                                 Requirements(lsa_team=True)) for n in CTAS}


    @staticmethod
    def start_strategy(strategies: dict[str, StrategySpec]) -> StrategySpec:
        """Where an LLM search starts beside the seed: this strategy's points, every issuer and placement the rewrite
        offers at the most CTAs (the CTA count is a number in the same code, for the LLM to vary)."""
        return strategies[f"rewrite_ctas{max(CTAS)}"]


def derive(analysis: Analysis, spec: WorkloadSpec) -> Knobs:
    """The knobs of the rules' rewrite of the analysed program; raises RewriteError where the rules refuse it (the
    rewrite below refuses whatever the conservative one does: the joins are all it adds)."""
    offers = []
    group: Op | None = None
    for op in analysis.nccl:
        if op.kind == "group":
            group = op if op.name == "ncclGroupStart" else None
            if op.name == "ncclGroupEnd":
                continue
            offers.append(Offer(op.line, "group of ncclSend/ncclRecv",
                                {"stream_overlap": "a send/recv group's side-stream placement is not derived"}))
        elif group is None:
            offers.append(_offer(op, analysis))
    overlap = {o.index: o.join for o in offers if o.join is not None}
    code = annotate(rewrite(analysis, spec, overlap).code)
    return Knobs(analysis.path, offers, code)


def _offer(op: Op, analysis: Analysis) -> Offer:
    why, beside, join = _overlap(op, analysis)
    if why is not None:
        return Offer(op.line, op.name, {"stream_overlap": why}, index=op.index)
    return Offer(op.line, op.name, {}, beside, join, op.index)


def _overlap(op: Op, analysis: Analysis) -> tuple[str | None, list[str], int | None]:
    """(None, the operations beside it, the byte of the join) where a side stream is safe for OP, else (why not)."""
    if op.function != ENTRY:
        return f"it is in {op.function}(), not in {ENTRY}() (the step the runner times)", [], None
    if op.loops:
        return f"it is inside the loop of line {op.loops[-1]}: an overlap across iterations is not proven", [], None
    if not op.stream:
        return "its stream is not known", [], None
    if b"sideStreams" in analysis.source:
        return "the program uses ctx->sideStreams itself: the side stream is not free", [], None
    helper = next((o for o in analysis.ops if o.function not in ENTRY_POINTS), None)
    if helper is not None:  # where cuco_run calls it is not tracked, so it may use the buffers before the join
        return f"line {helper.line}: {helper.name} is in {helper.function}(), a function of the program's own that " \
               f"{ENTRY}() may call: what it does between the collective and the join is not known", [], None
    mine = set(op.reads) | set(op.writes)
    if ("send" in op.args and not op.reads) or ("recv" in op.args and not op.writes):
        return "one of its buffers is not known to the analysis", [], None
    beside: list[str] = []
    for o in (o for o in analysis.ops if o.function == op.function and o.index > op.index):
        touched = sorted(mine & (set(o.reads) | set(o.writes)))
        if touched:
            if not beside:
                return f"line {o.line}: {o.name} uses its buffer `{touched[0]}` next: nothing runs between them", \
                    [], None
            if o.statement < 0:
                return f"line {o.line}: {o.name}, which uses its buffers next, does not stand in a block of " \
                       "statements: the join cannot go before it", [], None
            return None, beside, o.statement
        reason = _blocks_overlap(op, o)
        if reason:
            return f"line {o.line}: {reason}", [], None
        beside.append(f"{o.name} (line {o.line})")
    if not beside:
        return "nothing follows it in cuco_run to overlap with", [], None
    end = analysis.ends.get(op.function, -1)
    return (None, beside, end) if end >= 0 else ("the end of cuco_run cannot be found", [], None)


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
            f"takes `{o.unplaced[0]}`, which names no buffer the analysis knows"
        return f"{o.name} {what}, so it may touch the collective's buffers"
    if o.loops:
        return f"{o.name} is inside the loop of line {o.loops[-1]}"
    if o.stream != op.stream:
        return f"{o.name} runs on {o.stream or 'an unknown stream'}, not on {op.stream}"
    return None
