"""The MoE layer at expert parallelism with no host in the loop: routing, the exchange on the GPU
(cuco.kernels.moe_exchange), the local experts in the grouped GEMM (cuco.kernels.grouped_gemm, its group sizes
read from device memory) and the combine (cuco.kernels.combine), in stream order.

Deferred: the whole dispatch, every local expert (w13 with the SwiGLU epilogue, then w2), the whole way back; a row
per pick each way, or each token once (`once`: at top-8 over two ranks about a quarter of the bytes each way): sent
once to each rank that owns one of its picks, the experts gathering their pairs' rows in w13's loads, and sent back
once from each, its picks there summed.
Overlapped: the local experts in `groups` runs; the dispatch, group by group, on one side stream, each group's
experts starting once that group's rows are in (its counter), and each group's outputs going back on a second side
stream while the next group computes. The scatters then run on PUT_SMS SMs and the GEMMs on the others, so that
neither waits for the other's SMs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cuco.kernels.combine import combine
from cuco.kernels.grouped_gemm import grouped_gemm, grouped_swiglu, sort_by_expert, sorted_place
from cuco.kernels.moe_exchange import (
    COMBINE,
    COUNTS,
    DISPATCH,
    MAX_GROUPS,
    PUT_SMS,
    MoeExchange,
    exchange_plan,
    group_experts,
    moe_exchange,
    token_plan,
)


@dataclass
class MoeLayer:
    """One rank's layer: its exchange and the experts' activations (hidden, then outputs), sized for the worst
    routing, allocated once."""

    exchange: MoeExchange
    h: torch.Tensor  # [max_rows, FF]
    out: torch.Tensor  # [max_rows, HID]
    experts: int
    topk: int


def moe_layer(rank: int, world: int, tokens: int, hidden: int, experts: int, topk: int, ff: int, dtype: torch.dtype,
              device: torch.device, group_name: str | None, once: bool = False) -> MoeLayer:
    """Collective at world > 1: every rank calls it at the same point. once: each token is sent once to each rank
    that owns one of its picks and back once from each (moe_exchange), not once per pick."""
    ex = moe_exchange(rank, world, experts, tokens, topk, hidden, dtype, device, group_name, once)
    return MoeLayer(ex, torch.empty(ex.max_rows, ff, dtype=dtype, device=device),
                    torch.empty(ex.max_rows, hidden, dtype=dtype, device=device), experts, topk)


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def run_layer(layer: MoeLayer, x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              y: torch.Tensor, groups: int = 1, per_group: bool = True, sides: tuple = (),
              mark: Callable[[str], None] | None = None) -> None:
    """y = the layer of x. groups > 1: overlapped, on `sides`, two side streams (on the CPU none: the same order on
    one stream); per_group: a group's experts wait for their own rows only, else for the whole dispatch.
    `mark(phase)` after each phase is enqueued (a profile's events)."""
    mark = mark or (lambda phase: None)
    ex, k = layer.exchange, layer.topk
    if not 1 <= groups <= MAX_GROUPS or (ex.once and groups > 1):
        raise ValueError(f"run_layer: {groups} groups of experts (1 to {MAX_GROUPS}; 1 where tokens go once)")
    vals, idx = logits.topk(k, dim=-1)
    weight = torch.softmax(vals, dim=-1)
    layout = sort_by_expert(idx, layer.experts)
    tokens = token_plan(idx, layer.experts // ex.world, ex.world) if ex.once else None
    mark("route")
    ex.publish_counts(layout.offs, tokens)
    ex.wait(COUNTS)
    mark("counts")
    plan = exchange_plan(ex.counts, ex.rank, idx.flatten()[layout.order], layout.offs, ex.max_rows)
    token, place = layout.order // k, sorted_place(layout.order)
    mark("plan")
    if groups == 1:
        if tokens is not None:
            ex.dispatch_once(x, tokens, plan, place, weight)
        else:
            ex.dispatch(x, token, layout.offs, plan)
        ex.wait(DISPATCH)
        mark("dispatch")
        grouped_swiglu(ex.rows, plan.recv_offs, w13, layer.h, rows=ex.gather_rows() if tokens is not None else None)
        mark("w13")
        grouped_gemm(layer.h, plan.recv_offs, w2, layer.out)
        mark("w2")
        if tokens is not None:
            ex.send_back_summed(layer.out)
        else:
            ex.send_back(layer.out, plan)
        ex.wait(COMBINE)
        mark("back")
    else:
        _overlapped(layer, x, token, layout.offs, plan, w13, w2, groups, per_group, sides)
        mark("experts")
    if tokens is not None:  # a row from each owner, its picks there summed
        combine(ex.back, tokens.back_row, ex.ones, y)
    else:
        combine(ex.back, place, weight, y)
    mark("combine")


def _overlapped(layer: MoeLayer, x, token, offs, plan, w13, w2, groups: int, per_group: bool, sides: tuple) -> None:
    ex = layer.exchange
    put, back = sides if sides else (None, None)
    main = torch.cuda.current_stream() if put is not None else None
    puts = 2 * PUT_SMS if put is not None else None  # programs of each scatter beside a GEMM
    gemm = ex.sms - PUT_SMS if put is not None else None  # the GEMMs' programs, on the SMs the scatters leave
    local = len(plan.recv_offs) - 1
    if put is not None:
        put.wait_stream(main)
    with _on(put):
        for g in range(groups):
            ex.dispatch(x, token, offs, plan, g, groups, programs=puts)
    if not per_group:  # sync global: every group's experts wait for the whole dispatch
        for g in range(groups):
            ex.wait(DISPATCH + g)
    for g in range(groups):
        if per_group:
            ex.wait(DISPATCH + g)
        a, b = group_experts(local, g, groups)
        if b > a:
            grouped_swiglu(ex.rows, plan.recv_offs[a:b + 1], w13[a:b], layer.h, programs=gemm)
            grouped_gemm(layer.h, plan.recv_offs[a:b + 1], w2[a:b], layer.out, programs=gemm)
        if back is not None:
            back.wait_stream(main)
        with _on(back):
            ex.send_back(layer.out, plan, g, groups, programs=puts)
    if back is not None:
        main.wait_stream(back)
        main.wait_stream(put)
    ex.wait(COMBINE)
