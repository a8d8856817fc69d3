"""The MoE layer's exchange on the GPU: the counts, the dispatch and the combine as stores into the peers' memory
(torch symmetric memory), every size read from device memory by the kernels, so routing, exchange, experts and
combine follow one another on the stream with no host synchronisation (all_to_all_single needs the split sizes on
the host first; at decode that round trip costs more than the bytes).

The layout (`exchange_plan`), computed by every rank alike from every rank's per-expert counts:
  rows   what an owner receives, expert-major, an expert's rows in source-rank order, a source's in its own sorted
         order; the grouped GEMM reads them in place (`recv_offs`, the owner's local experts' offsets)
  back   a source's pairs' outputs, each at its sorted place: received row j goes back to rank ret_rank[j], row
         ret_row[j], so the combine reads them where they land
Phases, each with one counter per (phase, sender) on every receiver: each program of the sender's kernel bumps it
once after its stores (release, system scope) and the receiver waits (acquire) for run x programs. Counters only
grow, zeroed before the rendezvous. Each wait also orders the next run's stores after the reads they overwrite: a
rank stores into a peer's rows only once it has the peer's counts of the same run (sent after the peer's previous
combine, so after its experts read their rows), into a peer's back only once it has the peer's dispatch of the
same run (sent after the peer's previous combine read its back), and into a peer's counts only once it has the
peer's returned rows of the previous run (sent after the peer's plan read its counts).
Rows move as 16-bit words: a copy needs no arithmetic, and Triton's interpreter misreads bf16 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cuco.kernels.common import sm_count
from cuco.kernels.grouped_gemm import MIN_EXPERT_LANES

COUNTS, DISPATCH, COMBINE = range(3)  # the phases, each a row of every rank's counters
BLOCK_H = 1024  # row elements a program moves at a time: 2 KB, 16 bytes per thread at 4 warps
PROGRAMS_PER_SM = 4  # a program's load and store are serial: several per SM keep enough bytes in flight
# Arguments that vary from run to run (the counters' targets) or from rank to rank are not specialised on: Triton
# compiles a new variant for a value of 1 or a multiple of 16, and a variant's first launch loads its module, which
# waits for the device to go idle, behind a gate or a peer's wait that never ends (a timed run hung that way).


@triton.jit
def _release_peers(flag_ptrs, phase, rank, world):
    """Counter (phase, rank) on every peer, after every store of this program (system scope, cumulative)."""
    tl.debug_barrier()
    for p in range(world):
        if p != rank:  # this rank's own stores are ordered by its stream
            flag = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
            tl.atomic_add(flag + phase * world + rank, 1, sem="release", scope="sys")


@triton.jit(do_not_specialize=["rank", "world"])
def _publish_counts_kernel(offs, counts_ptrs, flag_ptrs, rank, world, E, E_PAD: tl.constexpr):
    """This rank's rows per expert (offs' differences) into row `rank` of every rank's counts, then released."""
    i = tl.arange(0, E_PAD)
    inside = i < E
    c = tl.load(offs + i + 1, mask=inside, other=0) - tl.load(offs + i, mask=inside, other=0)
    for p in range(world):
        dest = tl.load(counts_ptrs + p).to(tl.pointer_type(tl.int32))
        tl.store(dest + rank * E + i, c, mask=inside)
    _release_peers(flag_ptrs, 0, rank, world)


@triton.jit(do_not_specialize=["phase", "rank", "world", "target"])
def _await_kernel(counters, phase, rank, world, target):
    for s in range(world):
        if s != rank:
            while tl.atomic_add(counters + phase * world + s, 0, sem="acquire", scope="sys") < target:
                pass


@triton.jit(do_not_specialize=["phase", "rank", "world"])
def _scatter_rows_kernel(src, src_row, dest_ptrs, dest_rank, dest_row, n_rows, count, flag_ptrs, phase, rank, world,
                         programs, H, BLOCK: tl.constexpr, GATHER: tl.constexpr, COUNTED: tl.constexpr):
    """Row i (i < n_rows, and < *count where COUNTED) of src (row src_row[i] where GATHER) into rank dest_rank[i]'s
    buffer at row dest_row[i]; then counter (phase, rank) released on every peer."""
    n = n_rows
    if COUNTED:
        n = tl.minimum(tl.load(count), n_rows)
    cols = tl.arange(0, BLOCK)
    for i in range(tl.program_id(0), n, programs):
        r = i
        if GATHER:
            r = tl.load(src_row + i)
        dest = tl.load(dest_ptrs + tl.load(dest_rank + i)).to(tl.pointer_type(src.dtype.element_ty))
        at = dest + tl.load(dest_row + i).to(tl.int64) * H
        row = src + r.to(tl.int64) * H
        for c0 in range(0, H, BLOCK):
            c = c0 + cols
            tl.store(at + c, tl.load(row + c, mask=c < H), mask=c < H)
    _release_peers(flag_ptrs, phase, rank, world)


@dataclass(frozen=True)
class ExchangePlan:
    """Where this rank's sorted pairs go and where its received rows come back to (module docstring)."""

    dest_rank: torch.Tensor  # [pairs]: the owner of sorted pair i's expert
    dest_row: torch.Tensor  # [pairs]: its row in the owner's rows
    recv_offs: torch.Tensor  # int32 [local + 1]: this rank's experts' rows in its rows
    ret_rank: torch.Tensor  # [max_rows]: received row j's source (rows past recv_offs[-1]: meaningless)
    ret_row: torch.Tensor  # [max_rows]: its place in the source's back


def exchange_plan(counts: torch.Tensor, rank: int, expert: torch.Tensor, offs: torch.Tensor,
                  max_rows: int) -> ExchangePlan:
    """The layout from counts ([world, E]: rows of each expert from each source), this rank's sorted pairs' experts
    (`expert`, nondecreasing) and their offsets (`offs`, E + 1). On the device, no size read on the host."""
    world, experts = counts.shape
    local = experts // world
    c = counts.to(torch.int64)
    total = c.sum(0).view(world, local)  # each expert's rows over every source, by owner
    expert_start = (total.cumsum(1) - total).flatten()  # expert g's first row in its owner's rows
    base = expert_start + (c.cumsum(0) - c)  # [world, E]: source s's run of expert g starts at base[s, g]
    pair = torch.arange(len(expert), device=expert.device)
    dest_row = base[rank, expert] + pair - offs[expert]
    zero = torch.zeros(1, dtype=torch.int64, device=counts.device)
    recv_offs = torch.cat([zero, total[rank].cumsum(0)]).to(torch.int32)
    mine = slice(rank * local, (rank + 1) * local)
    starts = base[:, mine].t().flatten()  # run (e, s), expert-major: nondecreasing
    j = torch.arange(max_rows, device=counts.device)
    run = (torch.searchsorted(starts, j, right=True) - 1).clamp(min=0)  # among equal starts the last: the run
    source, e = run % world, rank * local + run // world  # that holds j (the others are empty)
    ret_row = (c.cumsum(1) - c)[source, e] + j - starts[run]
    return ExchangePlan(expert // local, dest_row, recv_offs, source, ret_row)


@dataclass
class MoeExchange:
    """This rank's windows and counters (torch symmetric memory, or plain tensors at world 1) and the runs so far."""

    rank: int
    world: int
    counts: torch.Tensor  # [world, E] int32: every source's rows per expert
    rows: torch.Tensor  # [max_rows, H]: received rows, expert-major
    back: torch.Tensor  # [pairs, H]: this rank's pairs' outputs, in its sorted order
    counters: torch.Tensor  # [3, world] int32
    counts_ptrs: torch.Tensor  # int64 [world]: each rank's address of its counts (and so on)
    rows_ptrs: torch.Tensor
    back_ptrs: torch.Tensor
    flag_ptrs: torch.Tensor
    programs: int  # of each scatter: every rank's the same, as the counters' targets assume
    run: int = 0

    def next_run(self) -> None:
        self.run += 1

    def publish_counts(self, offs: torch.Tensor) -> None:
        experts = self.counts.shape[1]
        _publish_counts_kernel[(1,)](offs, self.counts_ptrs, self.flag_ptrs, self.rank, self.world, experts,
                                     E_PAD=max(MIN_EXPERT_LANES, triton.next_power_of_2(experts)))

    def dispatch(self, x: torch.Tensor, token: torch.Tensor, plan: ExchangePlan) -> None:
        """Sorted pair i's token row (x[token[i]]) into its owner's rows."""
        self._scatter(x, token, self.rows_ptrs, plan.dest_rank, plan.dest_row, len(token), None, DISPATCH)

    def send_back(self, out: torch.Tensor, plan: ExchangePlan) -> None:
        """Received row j's output (out[j], j < recv_offs[-1]) into its source's back."""
        self._scatter(out, None, self.back_ptrs, plan.ret_rank, plan.ret_row, len(plan.ret_rank),
                      plan.recv_offs[-1:], COMBINE)

    def _scatter(self, src, src_row, dest_ptrs, dest_rank, dest_row, n_rows, count, phase) -> None:
        words = src.view(torch.int16)
        _scatter_rows_kernel[(self.programs,)](
            words, words if src_row is None else src_row, dest_ptrs, dest_rank, dest_row, n_rows,
            dest_row if count is None else count, self.flag_ptrs, phase, self.rank, self.world, self.programs,
            src.shape[1], BLOCK=BLOCK_H, GATHER=src_row is not None, COUNTED=count is not None, num_warps=4)

    def wait(self, phase: int) -> None:
        """Until every peer's stores of this run's `phase` have landed here (a one-program kernel on the stream)."""
        if self.world > 1:
            programs = 1 if phase == COUNTS else self.programs
            _await_kernel[(1,)](self.counters, phase, self.rank, self.world, self.run * programs)


def moe_exchange(rank: int, world: int, experts: int, pairs: int, hidden: int, dtype: torch.dtype,
                 device: torch.device, group_name: str | None) -> MoeExchange:
    """The windows of a layer whose ranks each route `pairs` token-expert pairs over `experts` experts (collective
    at world > 1: every rank calls it at the same point)."""
    max_rows = world * pairs  # the worst case: every rank's every pair to one owner

    def window(shape, dt, zeroed=False):
        if world == 1:
            return torch.zeros(shape, dtype=dt, device=device), None
        from cuco.kernels.symmetric import symmetric_tensor

        return symmetric_tensor(shape, dt, device, group_name, zeroed=zeroed)

    def ptrs(t, handle):
        addr = [t.data_ptr()] if handle is None else list(handle.buffer_ptrs)
        return torch.tensor(addr, dtype=torch.int64, device=device)

    counts, hc = window((world, experts), torch.int32)
    rows, hr = window((max_rows, hidden), dtype)
    back, hb = window((pairs, hidden), dtype)
    counters, hf = window((3, world), torch.int32, zeroed=True)
    programs = PROGRAMS_PER_SM * sm_count(device)
    return MoeExchange(rank, world, counts, rows, back, counters, ptrs(counts, hc), ptrs(rows, hr), ptrs(back, hb),
                       ptrs(counters, hf), programs)
