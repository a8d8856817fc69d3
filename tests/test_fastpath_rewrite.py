"""The rule-based rewrite: host collectives become cuco's device collectives, with no LLM call.

CPU: the rewrite, the re-analysis (no host collective left) and a real nvcc build. GPU: the rewritten
programs pass the runner's verification (same outputs as the reference on fresh inputs) at every shape.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from conftest import COLLECTIVES, GEMM_AG, ROOT

from cuco.fastpath.rewrite import RewriteError, no_host_collective_left, rewrite
from cuco.runner.build.nvcc import build
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

WORKLOADS = {"gemm_allgather": GEMM_AG, "allreduce_sum": ROOT / "cuco" / "builtin" / "allreduce_sum",
             "reducescatter_sum": ROOT / "cuco" / "builtin" / "reducescatter_sum",
             "allgather_bf16": ROOT / "cuco" / "builtin" / "allgather_bf16",
             "alltoall_bf16": ROOT / "cuco" / "builtin" / "alltoall_bf16",
             "sendrecv_ring": ROOT / "cuco" / "builtin" / "sendrecv_ring",
             "gemm_reducescatter": ROOT / "cuco" / "builtin" / "gemm_reducescatter",
             "gemm_allreduce": ROOT / "cuco" / "builtin" / "gemm_allreduce"}
# Host programs to rewrite: the workload seeds, and a program with a buffer of its own on allreduce_sum's buffers.
PROGRAMS = {**{name: (wl, wl / "seed.cu") for name, wl in WORKLOADS.items()},
            "allreduce_scratch": (WORKLOADS["allreduce_sum"],
                                  ROOT / "tests" / "fastpath" / "host_allreduce_scratch.cu"),
            "halo_exchange": (WORKLOADS["sendrecv_ring"], ROOT / "tests" / "fastpath" / "host_halo_exchange.cu")}
EXPECTED = {"gemm_allgather": "cuco::allGather(ctx, aFull->window, 0, a->ptr",
            "allreduce_sum": "cuco::allReduce<__nv_bfloat16>(ctx, x->window, 0, y->window, 0, n",
            "reducescatter_sum": "cuco::reduceScatter<__nv_bfloat16>(ctx, x->window, 0, y->ptr, n",
            "allgather_bf16": "cuco::allGather(ctx, y->window, 0, x->ptr",
            "alltoall_bf16": "cuco::allToAll(ctx, y->window, 0, x->ptr, (n) * sizeof(__nv_bfloat16)",
            "sendrecv_ring": "cucoSends1.add(x->ptr, (n) * sizeof(__nv_bfloat16), next, y->window, 0)",
            "allreduce_scratch": "cuco::allReduce<__nv_bfloat16>(ctx, cucoWin_s_scratch, 0, cucoWin_s_scratch, 0, n",
            "gemm_reducescatter": ("cuco::reduceScatter<__nv_bfloat16>(ctx, partial->window, 0, c->ptr, "
                                   "(size_t)mLocal * N"),
            "gemm_allreduce": "cuco::allReduce<__nv_bfloat16>(ctx, c->window, 0, c->window, 0, (size_t)M * N",
            "halo_exchange": "cucoSends1.add(x->ptr, (n) * sizeof(__nv_bfloat16), right, y->window, 0)"}


def _program(name):
    wl, src = PROGRAMS[name]
    return load_workload(wl), src


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_rewrite_leaves_no_host_collective(name):
    spec, src = _program(name)
    rw = rewrite(src, spec)
    assert EXPECTED[name] in rw.code and "CUCO_CUDA(ctx, cuco::" in rw.code
    assert no_host_collective_left(rw.code)
    assert "cuco_dev_requirements" in rw.code and '#include "cuco_collectives.cuh"' in rw.code
    assert rw.code.count("EVOLVE-BLOCK-START") == src.read_text().count("EVOLVE-BLOCK-START")


@pytest.mark.nvcc
def test_a_rewritten_program_builds_without_a_design_point(tmp_path):
    """The rewrite as `cuco transform` writes it, its knobs at the header's defaults. Every program's own rewritten
    code builds under a design point of its knobs (test_fastpath_knobs.py: each once, every way of every collective
    among them), which only adds the point's definitions to it."""
    spec, src = _program("gemm_allgather")
    out = tmp_path / "t.cu"
    out.write_text(rewrite(src, spec).code)
    res = build(out)
    assert res.ok, res.log


def test_every_buffer_that_must_be_symmetric_is_named_at_once(tmp_path):
    import shutil

    wl = tmp_path / "wl"
    shutil.copytree(WORKLOADS["allreduce_sum"], wl)
    toml = (wl / "workload.toml").read_text()
    (wl / "workload.toml").write_text(toml.replace("symmetric = true\n", ""))
    spec = load_workload(wl)
    with pytest.raises(RewriteError, match=r"workload.toml: peers must reach 'x' "
                                           r"\(line 9: ncclAllReduce's send buffer\); "
                                           r"'y' \(line 9: ncclAllReduce's receive buffer\): add `symmetric = true` "
                                           r"under \[buffers.x\] and \[buffers.y\]"):
        rewrite(spec.seed_path, spec)


def test_send_recv_in_a_helper_with_the_rank_as_a_parameter_is_refused():
    """The helper's rank and nRanks are its caller's: the rules cannot prove where its sends land."""
    spec = load_workload(GEMM_AG)
    with pytest.raises(RewriteError, match=r"line 10: peer `\(rank \+ 1\) % nRanks` depends on `rank`, which the "
                                           "program does not define from ctx->rank and ctx->nRanks"):
        rewrite(ROOT / "tests" / "fastpath" / "host_sendrecv.cu", spec)


RING = WORKLOADS["sendrecv_ring"]
SEND = "  CUCO_NCCL(ctx, ncclSend(x->ptr, n, ncclBfloat16, next, ctx->comm, ctx->stream));\n"
RECV = "  CUCO_NCCL(ctx, ncclRecv(y->ptr, n, ncclBfloat16, prev, ctx->comm, ctx->stream));\n"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace(RECV, ""), "the group has 1 ncclSend and 0 ncclRecv"),
    (lambda t: t.replace("  CUCO_NCCL(ctx, ncclGroupStart());\n", "")
     .replace("  CUCO_NCCL(ctx, ncclGroupEnd());\n", ""),
     "ncclSend outside ncclGroupStart/ncclGroupEnd is not covered"),
    (lambda t: t.replace("  CUCO_NCCL(ctx, ncclGroupEnd());\n", ""), "ncclGroupStart without ncclGroupEnd"),
    (lambda t: t.replace(RECV, RECV.replace("n, ncclBfloat16", "n / 2, ncclBfloat16")), "differ in count or type"),
    (lambda t: t.replace(SEND, SEND + "  CUCO_NCCL(ctx, ncclAllReduce(x->ptr, y->ptr, n, ncclBfloat16, ncclSum, "
                         "ctx->comm, ctx->stream));\n"), "groups of collectives are not covered"),
], ids=["unpaired", "no-group", "unterminated", "count-mismatch", "collective-in-group"])
def test_send_recv_groups_the_rules_cannot_pair(edit, message, tmp_path):
    spec = load_workload(RING)
    src = tmp_path / "seed.cu"
    src.write_text(edit((RING / "seed.cu").read_text()))
    with pytest.raises(RewriteError, match=message):
        rewrite(src, spec)


def test_uneven_all_to_all_through_host_counts_is_left_to_the_llm_loop():
    wl = ROOT / "cuco" / "builtin" / "alltoallv_bf16"
    with pytest.raises(RewriteError, match=r"the ncclSend of line 35 sends `out` and the ncclRecv of line 36 receives "
                                           r"`in`: blocks of one size are an all-to-all; a size per peer \(an "
                                           r"all-to-allv\) is not covered by the rules"):
        rewrite(wl / "seed.cu", load_workload(wl))


# Every program the collective workloads ship: the NCCL seeds the rewrites are compared with, which must be right
# themselves (send/recv into the runner's windows were not under NCCL's defaults: see [nccl_env] there), and the
# device programs written against the library where the rules do not reach (alltoallv_bf16's device.cu,
# reducescatter_sum's push.cu).
SHIPPED = [(wl, name) for wl in COLLECTIVES for name in sorted(load_workload(wl).candidates)]
SHIPPED_IDS = [f"{wl.name}/{name}" for wl, name in SHIPPED]


@pytest.mark.nvcc
@pytest.mark.parametrize("wl,name", SHIPPED, ids=SHIPPED_IDS)
def test_shipped_programs_build(wl, name):
    res = build(load_workload(wl).candidates[name])
    assert res.ok, res.log


@pytest.mark.gpu(2)
@pytest.mark.nvcc
@pytest.mark.parametrize("wl,name", SHIPPED, ids=SHIPPED_IDS)
def test_shipped_programs_are_correct_on_gpus(wl, name, tmp_path):
    spec = load_workload(wl)
    rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", max_level="L3", gpus=[0, 1],
                                                            work_dir=tmp_path / "w"))
    assert rec.ok, rec.error


def test_program_owned_buffer_moves_to_nccl_memory_and_a_window():
    spec, src = _program("allreduce_scratch")
    rw = rewrite(src, spec)
    assert "static ncclWindow_t cucoWin_s_scratch;" in rw.code
    assert ("CUCO_CUDA(ctx, cuco::symmetricAlloc(ctx, (void**)&s->scratch, cuco_buffer(ctx, \"x\")->bytes, "
            "&cucoWin_s_scratch));") in rw.code
    assert "CUCO_CUDA(ctx, cuco::symmetricFree(ctx, s->scratch, cucoWin_s_scratch));" in rw.code
    assert "cudaMalloc(" not in rw.code and "cudaFree(" not in rw.code  # no call left (comments may name them)
    assert "line 12: cudaMalloc of s->scratch -> ncclMemAlloc + symmetric window" in rw.replaced


def test_group_becomes_one_batch_with_receives_left_as_comments():
    code = rewrite(RING / "seed.cu", load_workload(RING)).code
    assert "cuco::SendBatch cucoSends1;" in code
    assert "CUCO_CUDA(ctx, cuco::sendBatch(ctx, cucoSends1, ctx->stream));" in code
    assert "(void)0 /* ncclRecv: filled by the peer's cucoSends1 */;" in code


@pytest.mark.nvcc
def test_cli_transform_on_cpu_builds_and_says_what_is_left(tmp_path):
    out = tmp_path / "ag.cu"
    proc = subprocess.run([sys.executable, "-m", "cuco", "transform", "gemm_allgather", "--out", str(out),
                           "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 4, proc.stdout + proc.stderr  # ExitCode.INCOMPLETE: verification needs the GPUs
    assert "no host collective left" in proc.stdout and "needs 2 GPUs" in proc.stdout and out.is_file()


@pytest.mark.gpu(2)
@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_rewritten_program_is_correct_on_gpus(name, tmp_path):
    spec, src = _program(name)
    out = tmp_path / "t.cu"
    t0 = time.monotonic()
    out.write_text(rewrite(src, spec).code)
    assert time.monotonic() - t0 < 60  # the fast path's target: under a minute, rewrite alone
    rec = evaluate(spec, out, EvalOptions(device="cuda", max_level="L3", gpus=[0, 1], work_dir=tmp_path / "w"))
    assert rec.ok, rec.error


def test_every_place_the_rules_cannot_rewrite_is_named_in_one_refusal(tmp_path):
    """Two all-reduces the rules do not cover (max and product): both are named, in program order, in one run."""
    src = (ROOT / "tests" / "fastpath" / "corpus" / "two_halves.cu").read_text()
    assert src.count("ncclSum") == 2
    (tmp_path / "p.cu").write_text(src.replace("ncclSum", "ncclMax", 1).replace("ncclSum", "ncclProd", 1))
    with pytest.raises(RewriteError) as err:
        rewrite(tmp_path / "p.cu", load_workload(WORKLOADS["allreduce_sum"]))
    message = str(err.value)
    assert message.startswith("2 places the rules cannot rewrite: (1) line ") and "\n" not in message
    assert message.index("ncclMax is not covered") < message.index("(2) line ") < message.index("ncclProd is not")


KNOBS = ROOT / "tests" / "fastpath" / "knobs"
GATHER = "  CUCO_NCCL(ctx, ncclAllGather(x->ptr, y->ptr, n, ncclBfloat16, ctx->comm, ctx->stream));\n"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("  __nv_bfloat16* scratch;", "  __nv_bfloat16* scratch;\n  ncclComm_t tp;")
     .replace("  ctx->state = s;", "  CUCO_NCCL(ctx, ncclCommSplit(ctx->comm, ctx->rank % 2, ctx->rank, &s->tp, "
              "NULL));\n  ctx->state = s;").replace(GATHER, GATHER.replace("ctx->comm", "s->tp")),
     r"line \d+: ncclAllGather runs on `s->tp`, a communicator the program makes itself \(ncclCommSplit \(line "
     r"\d+\)\), not the runner's \(ctx->comm\)"),
    (lambda t: t.replace("struct State {", "static ncclResult_t ncclAllGather(const void* a, void* b, size_t n, "
                         "ncclDataType_t t, ncclComm_t c) {\n  return ::ncclAllGather(a, b, n, t, c, 0);\n}\n\n"
                         "struct State {").replace(GATHER, GATHER.replace(", ctx->stream));", "));")),
     r"line \d+: ncclAllGather is called without its stream \(nccl.h's takes send, recv, count, dtype, comm, "
     r"stream\)"),
    (lambda t: t.replace(GATHER, "  ncclResult_t r = " + GATHER.strip().removeprefix("CUCO_NCCL(ctx, ")
                         .removesuffix(");") + ";\n  (void)r;\n"),
     r"line \d+: ncclAllGather's result is kept as a value"),
    (lambda t: t.replace(GATHER, GATHER + "  CUCO_NCCL(ctx, ncclBcast(s->scratch, all, ncclBfloat16, 0, ctx->comm, "
                         "ctx->stream));\n"), r"line \d+: ncclBcast is not covered by the rules yet"),
    (lambda t: t.replace("  __nv_bfloat16* scratch;", "  __nv_bfloat16* scratch;\n  ncclComm_t tp;")
     .replace("  ctx->state = s;", "  CUCO_NCCL(ctx, ncclCommSplit(ctx->comm, ctx->rank % 2, ctx->rank, &s->tp, "
              "NULL));\n  ctx->state = s;")
     .replace(GATHER, "  ncclComm_t comm = ctx->comm;\n  if (all > 0) comm = s->tp;\n"
              + GATHER.replace("ctx->comm", "comm")),
     r"line \d+: ncclAllGather runs on `comm`, which cuco_run\(\) assigns more than once"),
    (lambda t: t.replace("struct State {", "static ncclComm_t g_comm;\n\nstruct State {")
     .replace("  __nv_bfloat16* scratch;", "  __nv_bfloat16* scratch;\n  ncclComm_t tp;")
     .replace("  ctx->state = s;", "  CUCO_NCCL(ctx, ncclCommSplit(ctx->comm, ctx->rank % 2, ctx->rank, &s->tp, "
              "NULL));\n  g_comm = s->tp;\n  ctx->state = s;").replace(GATHER, GATHER.replace("ctx->comm", "g_comm")),
     r"line \d+: ncclAllGather runs on `g_comm`, a communicator the program makes itself \(ncclCommSplit"),
], ids=["sub-communicator", "own-overload-without-stream", "result-kept", "bcast", "communicator-reassigned",
        "split-kept-in-a-global"])
def test_nccl_calls_the_device_collectives_cannot_stand_for_are_refused_by_line(edit, message, tmp_path):
    """A collective on a communicator the program splits off (the device collectives span ctx->comm), a call to the
    program's own overload that takes no stream, a result kept as a value (the device call returns a cudaError_t),
    ncclBcast: each refused with its line, never rewritten into something else or a traceback."""
    src = tmp_path / "seed.cu"
    code = (KNOBS / "overlap_beside.cu").read_text()
    src.write_text(edit(code))
    assert src.read_text() != code
    with pytest.raises(RewriteError, match=message):
        rewrite(src, load_workload(ROOT / "cuco" / "builtin" / "allgather_bf16"))


def test_an_offset_is_followed_through_a_variable_named_like_a_type_and_a_parameter_is_the_same_everywhere(tmp_path):
    """`const size_t half = prev * n; ncclRecv(y + half, ...)`: `half` is the program's variable, not CUDA's type,
    so the rank in it is seen (refused: a peer would compute another offset). `x + n` with n a workload parameter
    (cuco_param(ctx, "N")) is the same on every rank: rewritten."""
    seed = (RING / "seed.cu").read_text()
    typed = "  __nv_bfloat16* yb = (__nv_bfloat16*)y->ptr;\n  const int64_t half = (int64_t)prev * n;\n"
    src = tmp_path / "half.cu"
    src.write_text(seed.replace(RECV, typed + RECV.replace("y->ptr", "yb + half")))
    with pytest.raises(RewriteError, match=r"receive buffer `yb \+ half` lies at an offset that depends on the rank"):
        rewrite(src, load_workload(RING))
    spec = load_workload(WORKLOADS["allreduce_sum"])
    code = (WORKLOADS["allreduce_sum"] / "seed.cu").read_text()
    call = next(ln for ln in code.splitlines() if "ncclAllReduce(" in ln)
    send, recv = re.search(r"ncclAllReduce\(([^,]+), ([^,]+),", call).groups()
    halves = call.replace(f"({send}, {recv},", f"((__nv_bfloat16*){send} + n / 2, (__nv_bfloat16*){recv} + n / 2,")
    src = tmp_path / "offset.cu"
    src.write_text(code.replace(call, halves.replace(", n,", ", n / 2,", 1)))
    assert "n / 2" in src.read_text()
    out = rewrite(src, spec).code
    assert "cuco::allReduce<__nv_bfloat16>(ctx, " in out and "(n / 2) * sizeof(__nv_bfloat16)" in out


def test_a_group_inside_a_group_is_part_of_it_and_every_collective_in_a_group_is_named(tmp_path):
    """NCCL merges a group opened inside an open one into it: the ring's send and receive in a nested group are
    one batch. A group of collectives is refused naming every collective in it, not the first alone."""
    seed = (RING / "seed.cu").read_text()
    start, end = "  CUCO_NCCL(ctx, ncclGroupStart());\n", "  CUCO_NCCL(ctx, ncclGroupEnd());\n"
    src = tmp_path / "nested.cu"
    src.write_text(seed.replace(start, start + start, 1).replace(RECV, RECV + end, 1))
    out = rewrite(src, load_workload(RING))
    assert "cuco::SendBatch cucoSends1" in out.code and "ncclGroup" not in out.code.split("cuco_run", 1)[1]
    both = SEND + "  CUCO_NCCL(ctx, ncclAllReduce(x->ptr, y->ptr, n, ncclBfloat16, ncclSum, ctx->comm, " \
        "ctx->stream));\n  CUCO_NCCL(ctx, ncclAllGather(x->ptr, y->ptr, n, ncclBfloat16, ctx->comm, ctx->stream));\n"
    src.write_text(seed.replace(SEND, both, 1))
    with pytest.raises(RewriteError, match=r"line \d+: ncclAllReduce inside the group of line \d+; line \d+: "
                                           r"ncclAllGather inside the group of line \d+: groups of collectives"):
        rewrite(src, load_workload(RING))
