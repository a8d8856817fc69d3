"""cuco_moe.cuh's layout of expert parallelism's moves, compiled by nvcc and run on the CPU for every rank of a
random routing, then the moves played out in numpy: every rank's rows land in their experts' owners grouped by
expert (sources in rank order), every output goes back to the sorted place its pair came from, and every counter
waits for exactly the runs it receives."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from conftest import ROOT

from cuco.runner.build.nvcc import build
from cuco.workload import load_workload

pytestmark = pytest.mark.nvcc
MAX_GROUPS = 16
COMBINE = MAX_GROUPS  # the combine's counter, after the dispatch's


@pytest.fixture(scope="module")
def lib():
    res = build(ROOT / "tests" / "cuda" / "moe_layout_host.cu",
                includes=load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3").includes)
    assert res.ok, res.log
    return ctypes.CDLL(str(res.library))


def _layout(lib, counts: np.ndarray, me: int, groups: int, per_group: bool) -> dict:
    world, n_experts = counts.shape
    local = n_experts // world
    runs = np.zeros((2 * world * local, 5), dtype=np.int32)
    meta = np.zeros(2 + groups + 1, dtype=np.int32)
    expert_at = np.zeros(local + 1, dtype=np.int64)
    dispatch_in = np.zeros(MAX_GROUPS, dtype=np.uint64)
    combine_in = np.zeros(1, dtype=np.uint64)
    c = np.ascontiguousarray(counts, dtype=np.int32)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    assert lib.cuco_test_moe_layout(ptr(c), world, me, ctypes.c_int64(n_experts), groups, int(per_group), COMBINE,
                                    ptr(runs), ptr(meta), ptr(expert_at), ptr(dispatch_in), ptr(combine_in)) == 0
    return {"runs": runs[:meta[1]], "n_dispatch": int(meta[0]), "combine_at": meta[2:], "expert_at": expert_at,
            "dispatch_in": dispatch_in, "combine_in": int(combine_in[0])}


@pytest.mark.parametrize("world,n_experts,groups,per_group,skew", [
    (2, 8, 1, False, 1), (2, 6, 3, True, 5), (4, 16, 4, True, 2), (8, 64, 5, True, 1), (2, 256, 8, True, 5)])
def test_moves_land_where_the_experts_and_the_sources_expect(lib, world, n_experts, groups, per_group, skew):
    rng = np.random.default_rng(world * 100 + n_experts)
    local, tokens, k = n_experts // world, 37, min(8, n_experts - 1)
    share = np.ones(n_experts)
    share[rng.choice(n_experts, max(1, n_experts // 16), replace=False)] = skew
    share[rng.integers(n_experts)] = 0  # an expert no token picks
    counts = np.zeros((world, n_experts), dtype=np.int64)
    for q in range(world):
        for _ in range(tokens):
            counts[q, rng.choice(n_experts, k, replace=False, p=share / share.sum())] += 1
    sorted_expert = [np.repeat(np.arange(n_experts), counts[q]) for q in range(world)]  # rank q's row r: its expert
    lay = [_layout(lib, counts, me, groups, per_group) for me in range(world)]

    # Dispatch: every rank's runs into the owners' expert-major buffers, marked (source, its sorted row).
    grouped = [np.full((world * tokens * k, 2), -1) for _ in range(world)]
    received = np.zeros((world, MAX_GROUPS), dtype=np.int64)
    for me in range(world):
        for src, dst, row, n, counter in lay[me]["runs"][:lay[me]["n_dispatch"]]:
            assert (grouped[dst][row:row + n] == -1).all(), "two runs land on the same rows"
            grouped[dst][row:row + n] = [(me, r) for r in range(src, src + n)]
            received[dst, counter] += 1
    for p in range(world):
        at = lay[p]["expert_at"]
        assert at[-1] == counts[:, p * local:(p + 1) * local].sum()
        for e in range(local):
            rows = grouped[p][at[e]:at[e + 1]]
            assert [sorted_expert[q][r] for q, r in rows] == [p * local + e] * len(rows)
            assert list(rows[:, 0]) == sorted(rows[:, 0])  # sources in rank order
        assert (grouped[p][at[-1]:] == -1).all()
        assert list(received[p]) == list(lay[p]["dispatch_in"].astype(np.int64))

    # Combine: each owner's outputs (its grouped rows) back to the sources' sorted places, group by group.
    back = [np.full((tokens * k, 2), -1) for _ in range(world)]
    returned = np.zeros(world, dtype=np.int64)
    for p in range(world):
        runs, bounds = lay[p]["runs"], lay[p]["combine_at"]
        assert bounds[0] == lay[p]["n_dispatch"] and bounds[-1] == len(runs)
        for g in range(groups):
            for src, dst, row, n, counter in runs[bounds[g]:bounds[g + 1]]:
                assert counter == COMBINE
                e = int(np.searchsorted(lay[p]["expert_at"], src, side="right")) - 1  # the run's expert: in group g
                assert g * local // groups <= e < (g + 1) * local // groups
                back[dst][row:row + n] = grouped[p][src:src + n]
                returned[dst] += 1
    for q in range(world):
        assert (back[q] == [(q, r) for r in range(tokens * k)]).all(), "an output went back to the wrong place"
        assert returned[q] == lay[q]["combine_in"]
