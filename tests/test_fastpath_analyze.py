"""The fast path's analysis, on the workload seed and on host programs written the way users write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import GEMM_AG, ROOT

from cuco.fastpath.analyze import AnalysisError, analyze

HERE = ROOT / "tests" / "fastpath"


def _by_name(a, name):
    return [o for o in a.ops if o.name == name]


def test_allgather_seed():
    a = analyze(GEMM_AG / "seed.cu")
    (ag,) = _by_name(a, "ncclAllGather")
    assert ag.kind == "collective" and ag.function == "cuco_run" and ag.stream == "ctx->stream"
    assert ag.reads == ["a"] and ag.writes == ["a_gathered"] and ag.args["dtype"] == "ncclBfloat16"
    (gemm,) = _by_name(a, "cuco_gemm_bf16")
    assert gemm.reads == ["a_gathered", "b"] and gemm.writes == ["c"] and gemm.stream == "ctx->stream"
    assert a.edges == [(ag.index, gemm.index, "a_gathered")] and not a.warnings


def test_a_stream_named_through_a_variable_is_the_stream_it_holds(tmp_path):
    """`cudaStream_t stream = ctx->stream;` and `cublasHandle_t blas = s->blas;`: the GEMM and the all-reduce are on
    ctx->stream; a variable given another value anywhere in the function is not followed."""
    code = (HERE / "knobs" / "gemm_ar_ex.cu").read_text()
    a = analyze(HERE / "knobs" / "gemm_ar_ex.cu")
    (gemm,), (ar,) = _by_name(a, "cublasGemmEx"), _by_name(a, "ncclAllReduce")
    assert gemm.stream == ar.stream == "ctx->stream" and ar.args["stream"] == "stream"
    again = "  if (M > 4096) stream = ctx->sideStreams[0];\n  CUCO_NCCL(ctx, ncclAllReduce("
    src = tmp_path / "again.cu"
    src.write_text(code.replace("  CUCO_NCCL(ctx, ncclAllReduce(", again))
    (ar,) = _by_name(analyze(src), "ncclAllReduce")
    assert ar.stream == "stream"


def test_allreduce_program_with_allocations_and_kernels():
    a = analyze(HERE / "host_allreduce.cu")
    assert a.buffers == {"sendbuff": "cudaMalloc", "recvbuff": "cudaMalloc", "out": "ncclMemAlloc"}
    (ar,) = _by_name(a, "ncclAllReduce")
    assert ar.args["op"] == "ncclSum" and ar.reads == ["sendbuff"] and ar.writes == ["recvbuff"]
    (produce,) = _by_name(a, "produce")
    (consume,) = _by_name(a, "consume")
    assert consume.writes == ["out"]  # const parameters are read, not written
    assert set(a.edges) == {(produce.index, ar.index, "sendbuff"), (ar.index, consume.index, "recvbuff")}
    assert [o.name for o in a.ops if o.kind == "sync"] == ["cudaStreamSynchronize"]
    assert json.loads(a.to_json())["ops"][ar.index]["name"] == "ncclAllReduce"


def test_reduce_scatter_after_cublas():
    a = analyze(HERE / "host_reducescatter.cu")
    (gemm,) = _by_name(a, "cublasGemmEx")
    (rs,) = _by_name(a, "ncclReduceScatter")
    assert gemm.writes == ["partial"] and gemm.stream == "stream"
    assert rs.reads == ["partial"] and rs.writes == ["out"] and rs.args["op"] == "ncclSum"
    assert (gemm.index, rs.index, "partial") in a.edges


def test_program_owned_buffer_through_a_struct_with_copies_and_free():
    a = analyze(HERE / "host_allreduce_scratch.cu")
    assert a.buffers["s->scratch"] == "cudaMalloc" and "ctx" not in a.buffers  # the context is not a buffer
    (ar,) = _by_name(a, "ncclAllReduce")
    assert ar.reads == ["s->scratch"] and ar.writes == ["s->scratch"]
    copy_in, copy_out = _by_name(a, "cudaMemcpyAsync")
    assert copy_in.kind == "copy" and copy_in.reads == ["x"] and copy_in.writes == ["s->scratch"]
    assert copy_out.reads == ["s->scratch"] and copy_out.writes == ["y"] and copy_out.stream == "ctx->stream"
    assert {(copy_in.index, ar.index, "s->scratch"), (ar.index, copy_out.index, "s->scratch")} <= set(a.edges)
    (free,) = _by_name(a, "cudaFree")
    assert free.kind == "free" and free.args["buffer"] == "s->scratch" and free.function == "cuco_teardown"


def test_grouped_send_recv():
    a = analyze(HERE / "host_sendrecv.cu")
    assert [o.name for o in a.nccl] == ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"]
    (recv,) = _by_name(a, "ncclRecv")
    assert recv.args["peer"] == "(rank + nRanks - 1) % nRanks" and recv.writes == ["recv"]
    (acc,) = _by_name(a, "accumulate")
    assert (recv.index, acc.index, "recv") in a.edges


def test_a_function_the_entry_points_never_reach_is_no_part_of_the_program(tmp_path):
    """A class kept for its fields whose method all-reduces a buffer it is given, never called: only what
    cuco_run reaches is analysed, so the method's collective neither appears nor blocks the rewrite."""
    src = tmp_path / "unused.cu"
    src.write_text("""#include "cuco.h"
struct Comm {
  ncclComm_t comm;
  void reduce(float* buf, size_t n, cudaStream_t s) { ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s); }
};
static void used(float* x, float* y, size_t n, cuco_ctx_t* ctx) {
  ncclAllReduce(x, y, n, ncclFloat, ncclSum, ctx->comm, ctx->stream);
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  Comm c;
  c.comm = ctx->comm;
  const size_t n = (size_t)cuco_param(ctx, "N");
  used((float*)cuco_buffer(ctx, "x")->ptr, (float*)cuco_buffer(ctx, "y")->ptr, n, ctx);
  return 0;
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
""")
    # cuco_run's call of used() is a use of the buffers it gives (a call the rules do not take apart)
    assert [(op.name, op.function) for op in analyze(src).ops] == [("ncclAllReduce", "used"), ("used", "cuco_run")]


def test_a_templated_kernel_is_the_kernel_it_instantiates(tmp_path):
    """`scale<float><<<...>>>(in, out, n)`: the kernel scale, whose const parameter it only reads."""
    src = tmp_path / "t.cu"
    src.write_text("""#include "cuco.h"
template <typename T> __global__ void scale(const T* in, T* out, int64_t n) { out[0] = in[0]; }
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  float* x = (float*)cuco_buffer(ctx, "x")->ptr;
  float* y = (float*)cuco_buffer(ctx, "y")->ptr;
  scale<float><<<1, 1, 0, ctx->stream>>>(x, y, 1);
  ncclAllReduce(y, y, 1, ncclFloat, ncclSum, ctx->comm, ctx->stream);
  return 0;
}
""")
    kernel = analyze(src).ops[0]
    assert (kernel.name, kernel.reads, kernel.writes) == ("scale", ["x", "y"], ["y"])


def test_program_without_nccl_is_refused(tmp_path):
    src = tmp_path / "plain.cu"
    src.write_text("__global__ void k(float* x) { x[0] = 1; }\nint main() { k<<<1, 1>>>(nullptr); return 0; }\n")
    with pytest.raises(AnalysisError, match="no NCCL call found"):
        analyze(src)


@pytest.mark.parametrize("content", [b"\x7fELF\x02\x01\x00\x00binary", b"}}} this is not C {{{ ;;; ((("])
def test_unparsable_source_is_refused(tmp_path, content):
    src = tmp_path / "broken.cu"
    src.write_bytes(content)
    with pytest.raises(AnalysisError, match="not a text file|cannot parse"):
        analyze(src)


def _cuco(*args):
    return subprocess.run([sys.executable, "-m", "cuco", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})


def test_cli_analyze_only_table_and_json():
    proc = _cuco("transform", "gemm_allgather", "--analyze-only")
    assert proc.returncode == 0 and "ncclAllGather" in proc.stdout and "a_gathered" in proc.stdout
    proc = _cuco("transform", "gemm_allgather", "--source", str(HERE / "host_sendrecv.cu"), "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["ops"]) == 5  # the JSON alone: it stops there


@pytest.mark.parametrize("source,words", [("missing.cu", "no such source file"),
                                          ("cuco/builtin/cpu_allgather_matmul/seed.py", "CUDA C++")])
def test_cli_bad_source_is_one_line(source, words):
    proc = _cuco("transform", "gemm_allgather", "--source", source, "--analyze-only")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr


@pytest.mark.parametrize("beta,reads_c", [("0.0f", False), ("0", False), ("1.0f", True), ("0.5f", True)])
def test_a_gemm_reads_its_c_unless_beta_is_zero(tmp_path, beta, reads_c):
    """C = alpha A B + beta C: with beta zero cuBLAS never reads C; with any other beta (a residual accumulated into
    C) it does, so C is the GEMM's input as well as its output."""
    code = (HERE / "knobs" / "gemm_ar_ex.cu").read_text()
    assert "zero = 0.0f" in code and "&zero, y," in code
    src = tmp_path / "beta.cu"
    src.write_text(code.replace("zero = 0.0f", f"zero = {beta}"))
    (gemm,) = _by_name(analyze(src), "cublasGemmEx")
    c = gemm.writes[0]
    assert (c in gemm.reads) == reads_c


def test_a_cublaslt_matmul_runs_on_the_stream_it_is_given():
    """cublasLtMatmul takes its stream as an argument (no cublasSetStream on its handle)."""
    (mm,) = _by_name(analyze(ROOT / "tests" / "init_programs" / "lt_allgather_gemm.cu"), "cublasLtMatmul")
    assert mm.stream == "ctx->stream"


def test_a_beta_both_gemms_take_by_address_stays_zero_for_the_second(tmp_path):
    """`&beta` handed to cuBLAS is read, not written: a second GEMM given the same zero beta does not read its C."""
    code = (HERE / "knobs" / "gemm_ar_ex.cu").read_text()
    gemm = code[code.index("  CUCO_CUBLAS(ctx, cublasGemmEx("):code.index("  CUCO_NCCL(ctx, ncclAllReduce(")]
    src = tmp_path / "two.cu"
    src.write_text(code.replace(gemm, gemm + gemm))
    first, second = _by_name(analyze(src), "cublasGemmEx")
    assert first.reads == second.reads and first.writes[0] not in second.reads


def test_an_address_only_read_does_not_change_which_buffer_a_pointer_names(tmp_path):
    """`cudaMemcpyToSymbolAsync(g_out, &y, ...)` copies y's value and `void* args[] = {&y}` hands it to a kernel:
    neither writes y, so it stays the buffer it was declared from; `init(&y)` may change it."""
    code = (HERE / "knobs" / "overlap_beside.cu").read_text()
    consumer = "  addInto<<<64, 256, 0, ctx->stream>>>((__nv_bfloat16*)y->ptr, s->scratch, all);\n"
    assert consumer in code
    reads = ("  __nv_bfloat16* out = (__nv_bfloat16*)y->ptr;\n"
             "  CUCO_CUDA(ctx, cudaMemcpyToSymbolAsync(g_out, &out, sizeof(out), 0, cudaMemcpyHostToDevice, "
             "ctx->stream));\n  void* args[] = {&out, &all};\n"
             "  addInto<<<64, 256, 0, ctx->stream>>>(out, s->scratch, all);\n")
    src = tmp_path / "address.cu"
    src.write_text(code.replace(consumer, reads).replace("struct State {", "__device__ __nv_bfloat16* g_out;\n"
                                                         "void init(__nv_bfloat16** p);\n\nstruct State {"))
    a = analyze(src)
    assert not any("written through its address" in w for w in a.warnings), a.warnings
    (add,) = _by_name(a, "addInto")
    assert "y" in add.reads
    src.write_text(src.read_text().replace("  void* args[] = {&out, &all};\n", "  init(&out);\n"))
    assert any("`out` is written through its address" in w for w in analyze(src).warnings)
