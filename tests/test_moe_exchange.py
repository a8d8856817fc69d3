"""cuco.kernels.moe_exchange: the MoE layer's exchange on the GPU.

The plan, played out in torch for every rank of random routings at world 2 to 4 (an expert no token picks, every
pick on one rank): every pair's row lands in its owner's rows grouped by expert, sources in rank order, within the
owner's offsets, and every received row goes back to the sorted place its pair came from. Then the whole layer
(counts, dispatch, both grouped GEMMs, the way back, the combine) for emulated ranks in one process, each rank's
step run for every rank before the next step (so each wait finds its counters at their target), against the
reference: in Triton's interpreter on the CPU, for real on a GPU.
"""

from __future__ import annotations

import pytest
from kernel_tensors import DEVICE, DTYPE, ptrs

torch = pytest.importorskip("torch")
from cuco.kernels.combine import combine  # noqa: E402
from cuco.kernels.grouped_gemm import grouped_gemm, grouped_swiglu, sort_by_expert, sorted_place  # noqa: E402
from cuco.kernels.moe_exchange import (  # noqa: E402
    COMBINE,
    COUNTS,
    DISPATCH,
    MAX_GROUPS,
    PROGRAMS_PER_SM,
    MoeExchange,
    exchange_plan,
    group_experts,
    token_plan,
    window_deltas,
)


def _routing(gen, tokens, experts, topk, world, skew):
    """Each token's k distinct experts; `skew`: every pick among rank 0's experts."""
    pool = experts // world if skew else experts
    return torch.stack([torch.randperm(pool, generator=gen)[:topk] for _ in range(tokens)])


def _sorted(idx, experts):
    layout = sort_by_expert(idx, experts)
    return layout, idx.flatten()[layout.order]


@pytest.mark.parametrize("world,skew", [(2, False), (2, True), (3, False), (4, False)])
def test_every_pair_lands_at_its_owner_by_expert_and_comes_back_to_its_sorted_place(world, skew):
    gen = torch.Generator().manual_seed(world)
    experts, tokens, topk = 4 * world, 9, 3
    local, pairs = experts // world, tokens * topk
    routes = [_routing(gen, tokens, experts, topk, world, skew).to(DEVICE) for _ in range(world)]
    sorted_ = [_sorted(idx, experts) for idx in routes]
    counts = torch.stack([lay.offs.diff() for lay, _ in sorted_])
    if skew:  # every pair to rank 0, none to the others
        assert counts.sum(0)[local:].sum() == 0
    plans = [exchange_plan(counts, r, expert, lay.offs, world * pairs) for r, (lay, expert) in enumerate(sorted_)]
    rows = [[None] * (world * pairs) for _ in range(world)]  # (source, sorted pair, expert) per received row
    for s, ((_, expert), plan) in enumerate(zip(sorted_, plans)):
        for i in range(pairs):
            o, row = int(plan.dest_rank[i]), int(plan.dest_row[i])
            assert rows[o][row] is None, "two pairs stored into one row"
            rows[o][row] = (s, i, int(expert[i]))
    for o, plan in enumerate(plans):
        n = int(plan.recv_offs[-1])
        assert all(r is not None for r in rows[o][:n]) and all(r is None for r in rows[o][n:])
        for e in range(local):
            got = rows[o][int(plan.recv_offs[e]):int(plan.recv_offs[e + 1])]
            assert all(g == o * local + e for _, _, g in got)
            assert got == sorted(got), "an expert's rows in source order, each source's in its sorted order"
        for j in range(n):
            source, pair, _ = rows[o][j]
            assert (int(plan.ret_rank[j]), int(plan.ret_row[j])) == (source, pair)


def _emulated(world, experts, tokens, topk, hidden, once):
    """Each rank's MoeExchange over plain tensors, the pointer tables naming the other ranks' tensors."""
    pairs = tokens * topk

    def nan(rows, cols=hidden):
        return torch.full((rows, cols), float("nan"), dtype=DTYPE, device=DEVICE)

    bufs = [{"counts": torch.zeros(world, experts, dtype=torch.int32, device=DEVICE),
             "rows": nan(world * (tokens if once else pairs)), "back": nan(world * tokens if once else pairs),
             "counters": torch.zeros(DISPATCH + MAX_GROUPS, world, dtype=torch.int32, device=DEVICE),
             "token_counts": torch.zeros(world, world, dtype=torch.int32, device=DEVICE),
             "token_pairs": torch.full((world * tokens, 2 * topk), -7, dtype=torch.int32, device=DEVICE)}
            for _ in range(world)]
    addr = {k: [b[k].data_ptr() for b in bufs] for k in bufs[0]}

    def deltas(k, r):  # on a GPU, checked as moe_exchange checks them (the scatter tells the compiler they align)
        return window_deltas(addr[k], r, DEVICE) if DEVICE.type == "cuda" else ptrs([a - addr[k][r] for a in addr[k]])

    return [MoeExchange(r, world, bufs[r]["counts"], bufs[r]["rows"], bufs[r]["back"], bufs[r]["counters"],
                        ptrs(addr["counts"]), ptrs(addr["counters"]), deltas("rows", r), deltas("back", r), sms=2,
                        max_rows=world * pairs, once=once, token_counts=bufs[r]["token_counts"],
                        token_counts_ptrs=ptrs(addr["token_counts"]), token_pairs=bufs[r]["token_pairs"],
                        token_pairs_deltas=deltas("token_pairs", r)) for r in range(world)]


@pytest.mark.parametrize("world,groups,once", [(1, 1, False), (2, 1, False), (2, 3, False), (2, 8, False),
                                              (2, 1, True), (3, 1, True)])
def test_the_layer_through_the_exchange_is_each_tokens_weighted_sum_of_its_experts(world, groups, once):
    """groups > 1: the dispatch and the way back group by group (3 groups of 4 experts: uneven; 8: some empty), the
    experts of a group computed once that group's counter says its rows are in. once: each token sent once to each
    rank that owns one of its picks, the experts gathering their pairs' rows from those, and sent back once from
    each, its picks there summed (every window starts as NaN: a row read before it is written shows). On the CPU in
    Triton's interpreter, on a GPU for real."""
    gen = torch.Generator().manual_seed(11)
    tokens, hidden, experts, topk, ff = 7, 32, 4 * world, 3, 16
    local, pairs = experts // world, tokens * topk
    x = [torch.randn(tokens, hidden, generator=gen).to(DTYPE).to(DEVICE) for _ in range(world)]
    w13 = [(torch.randn(local, hidden, 2 * ff, generator=gen) / 6).to(DTYPE).to(DEVICE) for _ in range(world)]
    w2 = [(torch.randn(local, ff, hidden, generator=gen) / 4).to(DTYPE).to(DEVICE) for _ in range(world)]
    routes = [_routing(gen, tokens, experts, topk, world, skew=r == 0).to(DEVICE) for r in range(world)]
    weight = [torch.softmax(torch.randn(tokens, topk, generator=gen), -1).to(DEVICE) for _ in range(world)]
    exs = _emulated(world, experts, tokens, topk, hidden, once)
    for run in range(2):  # the second run's counters start where the first's ended
        lays = [_sorted(idx, experts) for idx in routes]
        sent = [token_plan(idx, local, world) if once else None for idx in routes]
        for ex, (lay, _), tp in zip(exs, lays, sent):
            ex.publish_counts(lay.offs, tp)
        for ex in exs:
            ex.wait(COUNTS)
        plans = [exchange_plan(ex.counts, ex.rank, expert, lay.offs, world * pairs) for ex, (lay, expert)
                 in zip(exs, lays)]
        for r, (ex, (lay, _), plan) in enumerate(zip(exs, lays, plans)):
            if once:
                ex.dispatch_once(x[r], sent[r], plan, sorted_place(lay.order), weight[r])
            for g in range(groups) if not once else ():
                ex.dispatch(x[r], lay.order // topk, lay.offs, plan, g, groups)
        outs = [torch.full((world * pairs, hidden), float("nan"), dtype=DTYPE, device=DEVICE) for _ in exs]
        for g in range(groups):
            for r, (ex, plan) in enumerate(zip(exs, plans)):
                ex.wait(DISPATCH + g)
                a, b = group_experts(local, g, groups)
                h = torch.empty(world * pairs, ff, dtype=DTYPE, device=DEVICE)
                if b > a:
                    grouped_swiglu(ex.rows, plan.recv_offs[a:b + 1], w13[r][a:b], h,
                                   rows=ex.gather_rows() if once else None)
                    grouped_gemm(h, plan.recv_offs[a:b + 1], w2[r][a:b], outs[r])
                if once:
                    ex.send_back_summed(outs[r])
                else:
                    ex.send_back(outs[r], plan, g, groups)
        for r, (ex, (lay, _)) in enumerate(zip(exs, lays)):
            ex.wait(COMBINE)
            y = torch.empty(tokens, hidden, dtype=DTYPE, device=DEVICE)
            if once:
                combine(ex.back, sent[r].back_row, ex.ones, y)
            else:
                combine(ex.back, sorted_place(lay.order), weight[r], y)
            want = torch.zeros(tokens, hidden)
            for t in range(tokens):
                for j in range(topk):
                    e = int(routes[r][t, j])
                    g, u = (x[r][t].float() @ w13[e // local][e % local].float()).cpu().chunk(2)
                    hid = (torch.nn.functional.silu(g) * u).to(DTYPE).float()
                    want[t] += weight[r][t, j].cpu() * (hid @ w2[e // local][e % local].float().cpu())
            err = ((y.float().cpu() - want).norm() / want.norm()).item()
            assert err < 2e-2, (run, r, err)
    programs = PROGRAMS_PER_SM * exs[0].sms
    for ex in exs:  # two runs: every rank's counters (its own too) at two runs' worth of every rank's releases
        assert ex.counters[COUNTS].tolist() == [2] * world
        assert ex.counters[COMBINE].tolist() == [2 * groups * programs] * world
        dispatches = 2 if once else 1  # once: the token rows, then their picks
        assert ex.counters[DISPATCH:DISPATCH + groups].tolist() == [[2 * dispatches * programs] * world] * groups
        assert ex.sent[COMBINE] == 2 * groups * programs
