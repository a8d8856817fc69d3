"""The MoE layer's exchange on the GPU: the counts, the dispatch and the combine as stores into the peers' memory
(torch symmetric memory), every size read from device memory by the kernels, so routing, exchange, experts and
combine follow one another on the stream with no host synchronisation (all_to_all_single needs the split sizes on
the host first; at decode that round trip costs more than the bytes).

The layout (`exchange_plan`), computed by every rank alike from every rank's per-expert counts:
  rows   what an owner receives, expert-major, an expert's rows in source-rank order, a source's in its own sorted
         order; the grouped GEMM reads them in place (`recv_offs`, the owner's local experts' offsets)
  back   a source's pairs' outputs, each at its sorted place: received row j goes back to rank ret_rank[j], row
         ret_row[j], so the combine reads them where they land
Each token once (`once`): a token goes once to each rank that owns one of its picks, with a row of its picks there
(`token_pairs`: each pick's place among the owner's expert-major rows, or -1 where another rank owns it, and its
weight); the owner's experts gather their pairs' rows from the token rows, and the owner sends back one row a
token, its picks there summed, weighted, into the source's back at (owner, the token's row for that owner). At
top-8 over two ranks both ways move about a quarter of the bytes of a row per pick.
Phases, each with one counter per (phase, sender) on every rank, the sender's own too: each program of the
sender's kernel bumps it once after its stores (release, system scope), and a receiver waits (acquire) for as many
releases as every rank has sent so far (every rank sends alike). The dispatch has a counter per group of experts,
so that a group's experts start once their own rows are in. Counters only grow, zeroed before the rendezvous. Each
wait also orders the next run's stores after the reads they overwrite: a rank stores into a peer's rows (and
token_pairs) only once it has the peer's counts of the same run (sent after the peer's previous run ended, its
experts' reads with it), into a peer's back only once it has the peer's dispatch of the same run (sent after the
peer's previous combine read its back), and into a peer's counts only once it has the peer's returned rows of the
previous run (sent after the peer's plan read its counts).
Rows move as the widest integer words their width and alignment allow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from cuco.kernels.common import sm_count
from cuco.kernels.grouped_gemm import MIN_EXPERT_LANES

COUNTS, COMBINE, DISPATCH = range(3)  # rows of every rank's counters: the counts, the way back, then the dispatch's
MAX_GROUPS = 8  # one counter each (DISPATCH + g): the experts of group g wait for their own rows only
BLOCK_H = 1024  # row elements a program moves at a time
ROWS = 8  # rows a program moves at a time: 16 KB in flight per program (64 bytes a thread at 8 warps)
PROGRAMS_PER_SM = 2  # a scatter on its own: two programs an SM
PLAN_BLOCK = 1024  # pairs and received rows a program of the plan lays out
TOKEN_BLOCK = 4096  # tokens the token plan's one program takes at a time: a prefill's in one pass
PUT_SMS = 16  # a scatter beside the experts' GEMM: two programs on each of this many SMs, the GEMM on the rest
# (cuco_strategy.cuh's kBulkPutSms: an MoE dispatch's hundreds of MB at the link's rate)
# Arguments that vary from run to run (the counters' targets), group to group or rank to rank are not specialised on:
# Triton compiles a new variant for a value of 1 or a multiple of 16, and a variant's first launch loads its module,
# which waits for the device to go idle: behind the runner's gate, or a peer's wait, that never happens.


@triton.jit
def _release(flag_ptrs, phase, rank, world):
    """Counter (phase, rank) on every rank, this one too, after every store of this program (system scope,
    cumulative): a wait on one's own counter orders a side stream's stores before the main stream's reads."""
    tl.debug_barrier()
    for p in range(world):
        flag = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
        tl.atomic_add(flag + phase * world + rank, 1, sem="release", scope="sys")


@triton.jit(do_not_specialize=["rank", "world"])
def _publish_counts_kernel(offs, counts_ptrs, per_owner, token_counts_ptrs, flag_ptrs, rank, world, E,
                           E_PAD: tl.constexpr, W_PAD: tl.constexpr, ONCE: tl.constexpr):
    """This rank's rows per expert (offs' differences) into row `rank` of every rank's counts (ONCE: and its token
    rows per owner into row `rank` of every rank's token counts), then released."""
    i = tl.arange(0, E_PAD)
    inside = i < E
    c = tl.load(offs + i + 1, mask=inside, other=0) - tl.load(offs + i, mask=inside, other=0)
    o = tl.arange(0, W_PAD)
    for p in range(world):
        dest = tl.load(counts_ptrs + p).to(tl.pointer_type(tl.int32))
        tl.store(dest + rank * E + i, c, mask=inside)
        if ONCE:
            dest = tl.load(token_counts_ptrs + p).to(tl.pointer_type(tl.int32))
            tl.store(dest + rank * world + o, tl.load(per_owner + o, mask=o < world), mask=o < world)
    _release(flag_ptrs, 0, rank, world)


@triton.jit(do_not_specialize=["phase", "world", "target"])
def _await_kernel(counters, phase, world, target):
    for s in range(world):
        while tl.atomic_add(counters + phase * world + s, 0, sem="acquire", scope="sys") < target:
            pass


@triton.jit(do_not_specialize=["first", "stride", "span", "segments", "phase", "rank", "world"])
def _scatter_rows_kernel(src, src_row, base, deltas, dest_rank, dest_row, bounds, first, stride, span, segments,
                         flag_ptrs, phase, rank, world, programs, H, WORD: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr):
    """Rows i of [bounds[f], bounds[f + span]) for f = first + s * stride, s < segments: row i of src (row
    src_row[i] where GATHER) into rank dest_rank[i]'s window at row dest_row[i] (this rank's window at `base`,
    rank r's at base + deltas[r] bytes; none where dest_row[i] < 0); then counter (phase, rank) released on every
    rank. Rows are H words of WORD bytes."""
    rr = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    for s in range(segments):
        lo = tl.load(bounds + first + s * stride)
        hi = tl.load(bounds + first + s * stride + span)
        for i0 in range(lo + tl.program_id(0) * ROWS, hi, programs * ROWS):
            i = i0 + rr
            to = tl.load(dest_row + i, mask=i < hi, other=-1)
            inside = to >= 0
            r = i
            if GATHER:
                r = tl.load(src_row + i, mask=inside, other=0)
            # the windows lie whole pages apart (moe_exchange checks it): the compiler may then store 16 bytes a
            # thread, where an address it cannot place would take a store per word
            delta = tl.multiple_of(tl.load(deltas + tl.load(dest_rank + i, mask=inside, other=0)) // WORD, 16)
            at = base + delta + to.to(tl.int64) * H
            row = src + r.to(tl.int64) * H
            for c0 in range(0, H, BLOCK):
                c = c0 + cols
                m = inside[:, None] & (c[None, :] < H)
                tl.store(at[:, None] + c[None, :], tl.load(row[:, None] + c[None, :], mask=m), mask=m)
    _release(flag_ptrs, phase, rank, world)


@triton.jit(do_not_specialize=["rank", "world"])
def _token_pairs_kernel(place, dest_rank, dest_row, weight, index, token_counts, meta, to, entries, rank, world,
                        K: tl.constexpr, BLOCK: tl.constexpr):
    """Entry e = t * world + o: where token t's row goes at owner o (to[e]: after every earlier source's rows for
    o, -1 where t has no pick there), and its picks that o owns, as [their rows there (-1: another owner's), their
    weights' fp32 bits], in pick order (place[t * K + j]: pick j's sorted pair)."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = e < entries
    t, o = e // world, e % world
    first = tl.zeros([BLOCK], dtype=tl.int64)
    for s in range(rank):
        first += tl.load(token_counts + s * world + o, mask=inside, other=0)
    i = tl.load(index + e, mask=inside, other=-1)
    tl.store(to + e, tl.where(i >= 0, first + i, -1), mask=inside)
    for j in tl.static_range(K):
        p = tl.load(place + t * K + j, mask=inside, other=0)
        here = tl.load(dest_rank + p, mask=inside, other=-1) == o
        row = tl.where(here, tl.load(dest_row + p, mask=inside, other=0), -1)
        tl.store(meta + e * (2 * K) + j, row.to(tl.int32), mask=inside)
        w = tl.load(weight + t * K + j, mask=inside, other=0).to(tl.float32)
        tl.store(meta + e * (2 * K) + K + j, w.to(tl.int32, bitcast=True), mask=inside)


@triton.jit(do_not_specialize=["T", "local", "world"])
def _token_plan_kernel(idx, index, back_row, per_owner, T, local, world, K: tl.constexpr, W_PAD: tl.constexpr,
                       BLOCK: tl.constexpr):
    """One program, tokens in order: whether token t has a pick on owner o, its row among this rank's rows for o
    (index[t, o], -1: none), where o's sum for it lands in this rank's back (back_row[t, o] = o * T + index, -1:
    none), and this rank's rows for each owner. Owners by tokens, so the scan runs along the tokens."""
    o = tl.arange(0, W_PAD)[:, None]
    before = tl.zeros([W_PAD], dtype=tl.int32)
    for t0 in range(0, T, BLOCK):
        t = t0 + tl.arange(0, BLOCK)[None, :]
        inside = t < T
        present = tl.zeros([W_PAD, BLOCK], dtype=tl.int32)
        for j in tl.static_range(K):
            owner = tl.load(idx + t * K + j, mask=inside, other=0).to(tl.int32) // local  # not a 64-bit divide
            present = tl.where(inside & (owner == o), 1, present)
        i = tl.where(present > 0, before[:, None] + tl.cumsum(present, axis=1) - present, -1)
        m = inside & (o < world)
        tl.store(index + t * world + o, i.to(tl.int64), mask=m)
        tl.store(back_row + t * world + o, tl.where(i >= 0, o * T + i, -1).to(tl.int64), mask=m)
        before += tl.sum(present, axis=1)
    tl.store(per_owner + tl.arange(0, W_PAD), before, mask=tl.arange(0, W_PAD) < world)


@triton.jit
def _received_tokens(token_counts, rank, world):
    n = 0
    for s in range(world):
        n += tl.load(token_counts + s * world + rank)
    return n


@triton.jit(do_not_specialize=["rank", "world"])
def _pair_token_kernel(meta, token_counts, pair_token, rank, world, programs, K: tl.constexpr, BLOCK: tl.constexpr):
    """pair_token[p] = r for each pick p of each received token row r (the experts' gather of their rows)."""
    n = _received_tokens(token_counts, rank, world)
    for r0 in range(tl.program_id(0) * BLOCK, n, programs * BLOCK):
        r = r0 + tl.arange(0, BLOCK)
        for j in tl.static_range(K):
            p = tl.load(meta + r.to(tl.int64) * (2 * K) + j, mask=r < n, other=-1)
            tl.store(pair_token + p, r, mask=p >= 0)


@triton.jit(do_not_specialize=["phase", "rank", "world", "tokens"])
def _sum_back_kernel(out, meta, token_counts, base, deltas, flag_ptrs, phase, rank, world, tokens, programs, H,
                     K: tl.constexpr, ELEM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Each received token row r: its picks' outputs here (out[meta[r, j]]), weighted, summed in fp32 in pick
    order and rounded once, into its source's back at row rank * tokens + (r less the source's first row); then
    counter (phase, rank) released on every rank. Rows of H elements of ELEM bytes."""
    n = _received_tokens(token_counts, rank, world)
    blocks = tl.cdiv(H, BLOCK)  # tiles of ROWS rows by BLOCK columns: at decode a few rows fill the SMs still
    for tile in range(tl.program_id(0), tl.cdiv(n, ROWS) * blocks, programs):
        r = tile // blocks * ROWS + tl.arange(0, ROWS)
        c = tile % blocks * BLOCK + tl.arange(0, BLOCK)
        inside = r < n
        source = tl.zeros([ROWS], dtype=tl.int32)  # the rows of sources 0, 1, ... follow one another
        first = tl.zeros([ROWS], dtype=tl.int32)
        end = 0
        for s in range(world):
            end += tl.load(token_counts + s * world + rank)
            past = r >= end
            source += past.to(tl.int32)
            first = tl.where(past, end, first)
        delta = tl.multiple_of(tl.load(deltas + source, mask=inside, other=0) // ELEM, 16)  # page multiples
        at = base + delta + (rank * tokens + r - first).to(tl.int64) * H
        entry = meta + r.to(tl.int64) * (2 * K)
        m = inside[:, None] & (c[None, :] < H)
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for j in tl.static_range(K):
            p = tl.load(entry + j, mask=inside, other=-1)
            w = tl.load(entry + K + j, mask=inside, other=0).to(tl.float32, bitcast=True)
            v = tl.load(out + p.to(tl.int64)[:, None] * H + c[None, :], mask=m & (p >= 0)[:, None], other=0.0)
            acc += w[:, None] * v.to(tl.float32)
        tl.store(at[:, None] + c[None, :], acc.to(base.dtype.element_ty), mask=m)
    _release(flag_ptrs, phase, rank, world)


def group_experts(local: int, group: int, groups: int) -> tuple[int, int]:
    """Group `group` of `groups` runs of a rank's `local` experts: [a, b), as even as they come (empty where there
    are more groups than experts)."""
    return group * local // groups, (group + 1) * local // groups


@dataclass(frozen=True)
class ExchangePlan:
    """Where this rank's sorted pairs go and where its received rows come back to (module docstring)."""

    dest_rank: torch.Tensor  # [pairs]: the owner of sorted pair i's expert
    dest_row: torch.Tensor  # [pairs]: its row in the owner's rows
    recv_offs: torch.Tensor  # int32 [local + 1]: this rank's experts' rows in its rows
    ret_rank: torch.Tensor  # [max_rows]: received row j's source (rows past recv_offs[-1]: meaningless)
    ret_row: torch.Tensor  # [max_rows]: its place in the source's back


@triton.jit(do_not_specialize=["rank"])
def _plan_tables_kernel(counts, base, src_off, recv_offs, starts, rank, world, E, L,
                        W_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """From counts [world, E]: base[s, g] (source s's run of expert g in g's owner's rows), src_off[s, g] (where
    expert g's pairs start in source s's sorted order), this rank's recv_offs [L + 1], and the starts of the runs
    it receives, expert-major (run e * world + s)."""
    s = tl.arange(0, W_PAD)[:, None]
    g = tl.arange(0, E_PAD)[None, :]
    inside = (s < world) & (g < E)
    c = tl.load(counts + s * E + g, mask=inside, other=0).to(tl.int64)
    total = tl.sum(c, axis=0)  # each expert's rows over every source
    e = tl.arange(0, E_PAD)
    before = tl.cumsum(total, axis=0) - total
    start = before  # expert g's first row in its owner's rows: `before` less the owner's first expert's
    for o in range(world):
        start = tl.where(e // L == o, before - tl.sum(tl.where(e == o * L, before, 0), axis=0), start)
    b = start[None, :] + tl.cumsum(c, axis=0) - c
    tl.store(base + s * E + g, b, mask=inside)
    tl.store(src_off + s * E + g, tl.cumsum(c, axis=1) - c, mask=inside)
    mine = (e >= rank * L) & (e < rank * L + L)
    tl.store(recv_offs + 1 + e - rank * L, tl.cumsum(tl.where(mine, total, 0), axis=0).to(tl.int32), mask=mine)
    tl.store(recv_offs, 0)
    tl.store(starts + (g - rank * L) * world + s, b, mask=inside & (g >= rank * L) & (g < rank * L + L))


@triton.jit(do_not_specialize=["rank"])
def _plan_rows_kernel(expert, offs, base, src_off, starts, dest_rank, dest_row, ret_rank, ret_row, pairs, max_rows,
                      rank, world, E, L, BLOCK: tl.constexpr, SEARCH: tl.constexpr):
    """Per sorted pair: its owner and its row there; per row this rank may receive: the source it comes from and
    its place in the source's back (the run holding it found by a binary search of the runs' starts)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mp = i < pairs
    g = tl.load(expert + i, mask=mp, other=0)
    tl.store(dest_rank + i, g // L, mask=mp)
    tl.store(dest_row + i, tl.load(base + rank * E + g, mask=mp, other=0) + i - tl.load(offs + g, mask=mp, other=0),
             mask=mp)
    mr = i < max_rows
    runs = L * world
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = tl.zeros([BLOCK], dtype=tl.int32) + runs
    for _ in tl.static_range(SEARCH):  # lo: how many runs start at or before i
        mid = (lo + hi) // 2
        go = (tl.load(starts + mid, mask=mid < runs, other=0) <= i) & (lo < hi)
        stop = (lo < hi) & ~go
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(stop, mid, hi)
    run = tl.maximum(lo - 1, 0)  # among runs of equal start the last: the one that holds i (the others are empty)
    source = run % world
    tl.store(ret_rank + i, source, mask=mr)
    at = tl.load(src_off + source * E + rank * L + run // world, mask=mr, other=0)
    tl.store(ret_row + i, at + i - tl.load(starts + run, mask=mr, other=0), mask=mr)


def exchange_plan(counts: torch.Tensor, rank: int, expert: torch.Tensor, offs: torch.Tensor,
                  max_rows: int) -> ExchangePlan:
    """The layout from counts ([world, E]: rows of each expert from each source), this rank's sorted pairs' experts
    (`expert`, nondecreasing) and their offsets (`offs`, E + 1). Two launches on the device, no size read on the
    host."""
    world, experts = counts.shape
    local, dev = experts // world, counts.device
    base = torch.empty(world, experts, dtype=torch.int64, device=dev)
    src_off = torch.empty_like(base)
    starts = torch.empty(local * world, dtype=torch.int64, device=dev)
    recv_offs = torch.empty(local + 1, dtype=torch.int32, device=dev)
    _plan_tables_kernel[(1,)](counts, base, src_off, recv_offs, starts, rank, world, experts, local,
                              W_PAD=max(2, triton.next_power_of_2(world)),
                              E_PAD=max(MIN_EXPERT_LANES, triton.next_power_of_2(experts)))
    pairs = len(expert)
    out = [torch.empty(n, dtype=torch.int64, device=dev) for n in (pairs, pairs, max_rows, max_rows)]
    _plan_rows_kernel[(triton.cdiv(max(pairs, max_rows), PLAN_BLOCK),)](
        expert, offs, base, src_off, starts, *out, pairs, max_rows, rank, world, experts, local, BLOCK=PLAN_BLOCK,
        SEARCH=(local * world).bit_length())
    return ExchangePlan(out[0], out[1], recv_offs, out[2], out[3])


@dataclass(frozen=True)
class TokenPlan:
    """Sending each token once to each rank that owns any of its picks: where this rank's tokens go, and where
    their sums come back."""

    index: torch.Tensor  # int64 [T, world]: the token's row among this rank's rows for that owner, -1: no pick there
    back_row: torch.Tensor  # int64 [T, world]: the owner's sum for it in this rank's back, -1: none
    per_owner: torch.Tensor  # int32 [world]: this rank's token rows for each owner


def token_plan(idx: torch.Tensor, local: int, world: int) -> TokenPlan:
    """From the picks ([T, k] expert ids): which owners each token goes to, and its row among those they get from
    this rank (tokens in order). One launch, no size read on the host."""
    tokens, k = idx.shape
    index = torch.empty(tokens, world, dtype=torch.int64, device=idx.device)
    back_row = torch.empty_like(index)
    per_owner = torch.empty(world, dtype=torch.int32, device=idx.device)
    _token_plan_kernel[(1,)](idx, index, back_row, per_owner, tokens, local, world, K=k,
                             W_PAD=max(2, triton.next_power_of_2(world)),
                             BLOCK=min(TOKEN_BLOCK, max(MIN_EXPERT_LANES, triton.next_power_of_2(tokens))), num_warps=8)
    return TokenPlan(index, back_row, per_owner)


@dataclass
class MoeExchange:
    """This rank's windows and counters (torch symmetric memory, or plain tensors at world 1), and how many releases
    each counter of every rank has been sent so far (every rank sends alike, so that is each wait's target).
    Sending each token once (`once`): an owner receives token rows and a row of their picks, and sends back a row a
    token; otherwise a row per pair each way."""

    rank: int
    world: int
    counts: torch.Tensor  # [world, E] int32: every source's rows per expert
    rows: torch.Tensor  # [max_rows, H]: received rows, expert-major (once: token rows, [world * T, H])
    back: torch.Tensor  # [pairs, H]: this rank's pairs' outputs, in its sorted order (once: [world * T, H], owner o's
    # sum for token t at row o * T + its row among those sent to o)
    counters: torch.Tensor  # [DISPATCH + MAX_GROUPS, world] int32
    counts_ptrs: torch.Tensor  # int64 [world]: each rank's address of its counts, and of its counters
    flag_ptrs: torch.Tensor
    rows_deltas: torch.Tensor  # int64 [world]: rank r's rows at this rank's rows + rows_deltas[r] bytes
    back_deltas: torch.Tensor
    sms: int
    max_rows: int  # received pairs at most: every rank's every pair
    once: bool = False
    token_counts: torch.Tensor | None = None  # once: [world, world] int32: token rows from each source to each owner
    token_counts_ptrs: torch.Tensor | None = None
    token_pairs: torch.Tensor | None = None  # once: [world * T, 2k] int32: each received token row's picks here
    token_pairs_deltas: torch.Tensor | None = None  # (rows among the received pairs, or -1; then fp32 weights)
    sent: list[int] = field(default_factory=lambda: [0] * (DISPATCH + MAX_GROUPS))
    pair_token: torch.Tensor | None = field(default=None, init=False)  # once: [max_rows] int32: pair j's token row
    token_src: torch.Tensor | None = field(default=None, init=False)  # once: entry t * world + o's token, t
    token_owner: torch.Tensor | None = field(default=None, init=False)  # and its owner, o
    token_bounds: torch.Tensor | None = field(default=None, init=False)
    ones: torch.Tensor | None = field(default=None, init=False)  # once: [T, world] fp32, the combine's weights

    def __post_init__(self) -> None:
        """once: what every run reads and no run changes, made here: entry t * world + o is token t's row for owner
        o, the scatters' range ([0, world * T] on the device), the combine's weights."""
        if self.once:
            dev, entries = self.back.device, torch.arange(self.rows.shape[0], device=self.back.device)
            self.token_src, self.token_owner = entries // self.world, entries % self.world
            self.token_bounds = torch.tensor([0, len(entries)], device=dev)
            self.pair_token = torch.zeros(self.max_rows, dtype=torch.int32, device=dev)
            self.ones = torch.ones(len(entries) // self.world, self.world, device=dev)

    def publish_counts(self, offs: torch.Tensor, tokens: TokenPlan | None = None) -> None:
        experts = self.counts.shape[1]
        _publish_counts_kernel[(1,)](
            offs, self.counts_ptrs, offs if tokens is None else tokens.per_owner,
            self.counts_ptrs if tokens is None else self.token_counts_ptrs, self.flag_ptrs, self.rank, self.world,
            experts, E_PAD=max(MIN_EXPERT_LANES, triton.next_power_of_2(experts)),
            W_PAD=max(2, triton.next_power_of_2(self.world)), ONCE=tokens is not None)
        self.sent[COUNTS] += 1

    def dispatch(self, x: torch.Tensor, token: torch.Tensor, offs: torch.Tensor, plan: ExchangePlan,
                 group: int = 0, groups: int = 1, programs: int | None = None) -> None:
        """Sorted pair i's token row (x[token[i]]) into its owner's rows, for the pairs of group `group` of every
        owner's local experts (cut into `groups` runs: group_experts); released on counter DISPATCH + group."""
        local = self.counts.shape[1] // self.world
        a, b = group_experts(local, group, groups)
        self._scatter(x, token, self.rows, self.rows_deltas, plan.dest_rank, plan.dest_row, offs, a, local, b - a,
                      self.world, DISPATCH + group, programs)

    def dispatch_once(self, x: torch.Tensor, tokens: TokenPlan, plan: ExchangePlan, place: torch.Tensor,
                      weight: torch.Tensor) -> None:
        """Each token row once into every rank that owns one of its picks (after every source's before it, in token
        order), and beside it the row of its picks there (place [T * k]: each pick's sorted pair; weight [T, k]);
        both released on counter DISPATCH."""
        entries = tokens.index.numel()
        to = torch.empty(entries, dtype=torch.int64, device=x.device)
        meta = torch.empty(entries, self.token_pairs.shape[1], dtype=torch.int32, device=x.device)
        _token_pairs_kernel[(triton.cdiv(entries, PLAN_BLOCK),)](
            place, plan.dest_rank, plan.dest_row, weight, tokens.index, self.token_counts, meta, to, entries,
            self.rank, self.world, K=weight.shape[1], BLOCK=PLAN_BLOCK)
        for src, src_row, window, deltas in ((x, self.token_src, self.rows, self.rows_deltas),
                                             (meta, None, self.token_pairs, self.token_pairs_deltas)):
            self._scatter(src, src_row, window, deltas, self.token_owner, to, self.token_bounds, 0, 0, 1, 1, DISPATCH,
                          None)

    def gather_rows(self) -> torch.Tensor:
        """once, after the dispatch: each received pair's token row (pair_token), which the experts' w13 reads."""
        k = self.token_pairs.shape[1] // 2
        programs = PROGRAMS_PER_SM * self.sms
        _pair_token_kernel[(programs,)](self.token_pairs, self.token_counts, self.pair_token, self.rank, self.world,
                                        programs, K=k, BLOCK=PLAN_BLOCK)
        return self.pair_token

    def send_back(self, out: torch.Tensor, plan: ExchangePlan, group: int = 0, groups: int = 1,
                  programs: int | None = None) -> None:
        """Received row j's output (out[j]) into its source's back, for the rows of group `group` of this rank's
        experts; released on counter COMBINE."""
        a, b = group_experts(len(plan.recv_offs) - 1, group, groups)
        self._scatter(out, None, self.back, self.back_deltas, plan.ret_rank, plan.ret_row, plan.recv_offs, a, 0, b - a,
                      1, COMBINE, programs)

    def send_back_summed(self, out: torch.Tensor) -> None:
        """once: each received token's picks here summed (weighted, fp32, rounded once) into its source's back, a row
        a token; released on counter COMBINE."""
        k, programs = self.token_pairs.shape[1] // 2, PROGRAMS_PER_SM * self.sms
        _sum_back_kernel[(programs,)](
            out, self.token_pairs, self.token_counts, self.back, self.back_deltas, self.flag_ptrs, COMBINE, self.rank,
            self.world, self.rows.shape[0] // self.world, programs, out.shape[1], K=k, ELEM=out.element_size(),
            ROWS=ROWS, BLOCK=BLOCK_H, num_warps=8)
        self.sent[COMBINE] += programs

    def _scatter(self, src, src_row, window, deltas, dest_rank, dest_row, bounds, first, stride, span, segments,
                 phase, programs) -> None:
        word = _word(src, window)
        programs = programs or PROGRAMS_PER_SM * self.sms
        _scatter_rows_kernel[(programs,)](
            src.view(word), src if src_row is None else src_row, window.view(word), deltas, dest_rank, dest_row,
            bounds, first, stride, span, segments, self.flag_ptrs, phase, self.rank, self.world, programs,
            src.shape[1] * src.element_size() // word.itemsize, WORD=word.itemsize, ROWS=ROWS, BLOCK=BLOCK_H,
            GATHER=src_row is not None, num_warps=8)
        self.sent[phase] += programs

    def wait(self, phase: int) -> None:
        """Until every rank's stores of `phase` so far have landed here (a one-program kernel on the stream)."""
        _await_kernel[(1,)](self.counters, phase, self.world, self.sent[phase])


def _word(*rows: torch.Tensor) -> torch.dtype:
    """The widest integer word a row of each tensor is made of, from an address of that alignment: a copy moves
    words (no arithmetic; Triton's interpreter misreads bf16 values)."""
    for word in (torch.int64, torch.int32, torch.int16):
        if all((t.shape[1] * t.element_size()) % word.itemsize == 0 and t.data_ptr() % word.itemsize == 0
               for t in rows):
            return word
    return torch.uint8


def window_deltas(addresses: list[int], rank: int, device: torch.device) -> torch.Tensor:
    """Each rank's window as a byte offset from this rank's (int64 on the device), refused unless every offset is a
    multiple of 16 words of 8 bytes, as the scatter tells the compiler (symmetric memory maps whole pages)."""
    deltas = [a - addresses[rank] for a in addresses]
    if any(d % (16 * 8) for d in deltas):
        raise ValueError(f"moe_exchange: the ranks' windows are not 128-byte multiples apart ({deltas})")
    return torch.tensor(deltas, dtype=torch.int64, device=device)


def moe_exchange(rank: int, world: int, experts: int, tokens: int, topk: int, hidden: int, dtype: torch.dtype,
                 device: torch.device, group_name: str | None, once: bool = False) -> MoeExchange:
    """The windows of a layer whose ranks each route `tokens` tokens to `topk` of `experts` experts (collective
    at world > 1: every rank calls it at the same point). once: tokens are sent once per owner."""
    pairs = tokens * topk
    max_rows = world * pairs  # the worst case: every rank's every pair to one owner

    def window(shape, dt, zeroed=False):
        if world == 1:
            return torch.zeros(shape, dtype=dt, device=device), None
        from cuco.kernels.symmetric import symmetric_tensor

        return symmetric_tensor(shape, dt, device, group_name, zeroed=zeroed)

    def addresses(t, handle) -> list[int]:
        return [t.data_ptr()] if handle is None else list(handle.buffer_ptrs)

    def ptrs(t, handle):
        return torch.tensor(addresses(t, handle), dtype=torch.int64, device=device)

    counts, hc = window((world, experts), torch.int32)
    rows, hr = window((world * tokens if once else max_rows, hidden), dtype)
    back, hb = window((world * tokens if once else pairs, hidden), dtype)
    counters, hf = window((DISPATCH + MAX_GROUPS, world), torch.int32, zeroed=True)
    once_windows = {}
    if once:
        token_counts, ht = window((world, world), torch.int32)
        token_pairs, hp = window((world * tokens, 2 * topk), torch.int32)
        once_windows = dict(token_counts=token_counts, token_counts_ptrs=ptrs(token_counts, ht),
                            token_pairs=token_pairs, token_pairs_deltas=window_deltas(addresses(token_pairs, hp), rank,
                                                                                      device))
    return MoeExchange(rank, world, counts, rows, back, counters, ptrs(counts, hc), ptrs(counters, hf),
                       window_deltas(addresses(rows, hr), rank, device),
                       window_deltas(addresses(back, hb), rank, device), sm_count(device), max_rows, once,
                       **once_windows)
