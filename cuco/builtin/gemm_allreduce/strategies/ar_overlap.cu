/*************************************************************************
 * GEMM + AllReduce (decode) strategy kernel: the GEMM in column chunks, each chunk's all-reduce overlapped with
 * the next chunk's GEMM.
 *
 * A decode GEMM ([M, K/world] x [K/world, N], M small) is bound by reading B, so it is cut along N: chunk j's
 * columns of B are read once, by chunk j's GEMM alone, and the chunks together cost what the whole GEMM does.
 * After chunk j's GEMM (main stream) a small kernel bumps counter j on every rank; side stream 0 waits until
 * every rank's chunk j has landed in its `partial` slot, then adds chunk j of every rank's slot (rank order, fp32)
 * into c, row by row, while the main stream multiplies chunk j+1. cuBLAS is held to fewer SMs
 * (cublasSetSmCountTarget) so that the waits and additions have SMs to run on.
 * The design point (cuco_design_point.cuh; workload.toml accepts backend lsa (loads through NCCL windows),
 * placement stream_overlap, sync chunk (a counter per chunk)):
 *   issuer  cta or warp: the addition's unit, which owns whole rows of a chunk
 *   chunks  column chunks (1 = the GEMM whole, then the addition)
 *
 * Slots alternate between runs, and every run ends with its side stream joined: when a rank's counter j shows
 * that every peer has finished run e-1's chunk j, those peers have also finished reading run e-2's slot (their
 * run e-2 was joined before run e-1 began), which run e now overwrites. Counters only grow (zeroed once, in
 * setup): counter j reaches epoch * world once every rank's chunk j of this run is in its slot.
 * Requires: partial with two slots of M x N; N a multiple of 8 (rows of 16-byte packs); (workload.toml) partial
 * symmetric, all ranks in one LSA team, one side stream.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

using namespace cuco::point;

// ---- Constants ---------------------------------------------------------------------------------------

// The addition runs beside the GEMM (cuco::kBesideCtas): 8 CTAs of 512 threads are 128 warps, one per row of the
// M = 128 decode shape.
constexpr int kAddCtas = cuco::kBesideCtas;
constexpr int kAddThreads = CUCO_COLL_THREADS;
constexpr int kSlots = 2;                       // partial's slots (workload.toml), used by alternate runs
using Elem = __nv_bfloat16;                     // a, b, c and partial hold bf16 (workload.toml)
constexpr int64_t kPackElems = 16 / sizeof(Elem);

// Counter j: how many ranks have written chunk j of their slot, over all runs.
static cuco::Counters counters;

// epoch: this run writes slot (epoch - 1) % kSlots.
struct State : cuco::Common<> {
  char* peerPartial[cuco::kMaxRanks];  // every rank's partial, mapped into this rank's address space
};

using Inputs = cuco::RankPointers<Elem>;

// ---- Kernels -----------------------------------------------------------------------------------------

// Chunk j of this rank's slot is complete (the GEMM before it on the stream): bump counter j on every rank.
__global__ void signalChunk(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle, int j) {
  if (threadIdx.x < devComm.lsaSize) cuco::bumpCounter(devComm, counterHandle, threadIdx.x, j);
}

// Columns [c0, c1) of every row of c = the sum over ranks of their slots; each unit adds whole rows.
template <Issuer I>
__global__ void __launch_bounds__(kAddThreads) addColumns(Inputs in, Elem* c, int64_t M, int64_t N, int64_t c0,
                                                          int64_t c1) {
  const cuco::Worker me = cuco::IssuerUnit<I>::self();
  for (int64_t m = me.index; m < M; m += me.count) {
    const Elem* row[cuco::kMaxRanks];
    for (int p = 0; p < in.n; p++) row[p] = in.at[p] + m * N;
    Elem* out = c + m * N;
    cuco::reduceRange<Elem>(row, in.n, &out, 1, c0, c1, me.lane, me.lanes);
  }
}

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = 1;  // setup's barrier
  counters.require(reqs, cuco::kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (cuco_param(ctx, "N") % kPackElems) CUCO_FAIL(ctx, "N must be a multiple of %ld", (long)kPackElems);
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, cuco::kBesideReservedSms));
  CUCO_CUDA(ctx, cuco::windowPointers(cuco_buffer(ctx, "partial")->window, ctx->nRanks, s->peerPartial, ctx->stream));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const size_t slotOffset = (s->epoch++ % kSlots) * (size_t)M * N * sizeof(Elem);
  const unsigned long long target = s->epoch * (unsigned long long)ctx->nRanks;
  const Elem* a = (const Elem*)cuco_buffer(ctx, "a")->ptr;
  const Elem* b = (const Elem*)cuco_buffer(ctx, "b")->ptr;
  Elem* mine = (Elem*)((char*)cuco_buffer(ctx, "partial")->ptr + slotOffset);
  Elem* c = (Elem*)cuco_buffer(ctx, "c")->ptr;
  Inputs in;
  in.n = ctx->nRanks;
  for (int p = 0; p < ctx->nRanks; p++) in.at[p] = (const Elem*)(s->peerPartial[p] + slotOffset);
  cudaStream_t side = ctx->sideStreams[0];
  CUCO_CUDA(ctx, cuco::streamAfter(side, ctx->stream, s->fork));
  for (int j = 0; j < kChunks; j++) {
    size_t c0, c1;
    cuco::packSlice((size_t)N, kPackElems, j, kChunks, &c0, &c1);
    if (c1 == c0) continue;
    CUCO_CUBLAS(ctx, cuco_gemm_bf16_ld(s->blas, a, b + c0, mine + c0, M, K / ctx->nRanks, (int64_t)(c1 - c0), N, 0.0f));
    signalChunk<<<1, cuco::kSmallKernelThreads, 0, ctx->stream>>>(*ctx->devComm, counters.handle, j);
    CUCO_CUDA(ctx, cudaGetLastError());
    CUCO_CUDA(ctx, counters.await(*ctx->devComm, side, j, j + 1, target));
    addColumns<kIssuer><<<kAddCtas, kAddThreads, 0, side>>>(in, c, M, N, (int64_t)c0, (int64_t)c1);
    CUCO_CUDA(ctx, cudaGetLastError());
  }
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, side, s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
