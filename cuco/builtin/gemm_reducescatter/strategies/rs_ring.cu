/*************************************************************************
 * GEMM + ReduceScatter as a ring whose additions happen in cuBLAS's epilogue: the fused placement.
 *
 * The sum for rank d's rows starts on rank d+1 and travels the ring d+1 -> d+2 -> ... -> d, each rank adding
 * its own product on the way. At step s = 0..world-1 rank r works on block d = r - s - 1 (mod world):
 *   s = 0        staging[d] = A_r[d rows] @ B_r                       (a GEMM, beta 0)
 *   0 < s        wait until the previous rank's block d has landed here, then
 *                X[d] = A_r[d rows] @ B_r + X[d]                      (one GEMM, beta 1: the reduction)
 *                where X is c at the last step (d = r) and staging before it
 *   s < world-1  a put kernel stores block d into the next rank's staging[d] (its c at step world-2)
 * Each block is cut into CUCO_CHUNKS row ranges, so a chunk travels on while the next one is multiplied; the
 * put kernels run on side stream 0 on SMs kept from cuBLAS (cublasSetSmCountTarget), and each unit of a put
 * kernel bumps the receiver's counter for the chunk once its stores are issued.
 * The design point (cuco_design_point.cuh; workload.toml accepts backend lsa, placement fused, sync chunk):
 *   issuer  cta or warp: the put kernel's unit that stores a contiguous slice and signals it
 *   chunks  row ranges per block (1..16)
 *
 * Sums run in ring order (rank d+1 first) in fp32 and are rounded to bf16 at every hop, the same way every run:
 * results are bitwise deterministic. Counters only grow (zeroed once, in setup): rank r's counter for chunk j
 * reaches ((epoch - 1) * (world - 1) + s) * units once the previous rank's step s-1 of this run has stored it.
 * A barrier opens each run's first put kernel: no rank stores into a peer's staging or c before that peer has
 * finished its previous run.
 * Requires (workload.toml): c and staging symmetric; all ranks in one LSA team; one side stream.
 *************************************************************************/
#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_rs.cuh"
#include "cuco_strategy.cuh"

using namespace cuco::point;

// ---- Constants ---------------------------------------------------------------------------------------

// The put kernel runs beside the GEMM (cuco::kBesideCtas); kPutCtas is also the device communicator's
// lsaBarrierCount (CTA b uses barrier b).
constexpr int kPutCtas = cuco::kBesideCtas;
constexpr int kPutThreads = CUCO_COLL_THREADS;
constexpr int kUnitsPerPut = cuco::IssuerUnit<kIssuer>::perKernel(kPutCtas, kPutThreads);
using Elem = cuco::rs::Elem;

// Chunk counters: how many units of the previous rank's put kernels have stored chunk j here, over all runs.
static cuco::Counters counters;

struct State : cuco::Common<> {
  bool firstPut;  // the run's first put kernel opens with the barrier
};

using cuco::rs::Shape;
using cuco::rs::shapeOf;

// ---- The put kernel --------------------------------------------------------------------------------

// Store `bytes` from src at `dstOffset` of rank `peer`'s window, each unit its contiguous share
// (cuco::pushSlice), then bump the peer's counter for chunk j. startBarrier: all ranks meet first.
template <Issuer I>
__global__ void __launch_bounds__(kPutThreads) putKernel(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle,
                                                         ncclWindow_t win, size_t dstOffset, int peer,
                                                         const char* src, size_t bytes, int j, int startBarrier) {
  using Unit = cuco::IssuerUnit<I>;
  // The peer's previous run, which read its staging and c, is done before our stores land there.
  if (startBarrier) cuco::lsaBarrier(devComm);
  const cuco::Worker me = Unit::self();
  char* dst = (char*)ncclGetLsaPointer(win, dstOffset, peer);
  cuco::pushSlice(&dst, 1, src, 0, bytes, me.index, me.count, me.lane, me.lanes);
  Unit::sync();  // every thread of the unit has issued its stores before lane 0 releases them
  if (me.lane == 0) cuco::bumpCounter(devComm, counterHandle, peer, j);
}

// ---- One step of the ring ----------------------------------------------------------------------------

// Step s's GEMM over chunk j of block d, into X (c at the last step, staging before), then its put to the next
// rank on side stream 0.
static int step(cuco_ctx_t* ctx, State* s, int st, int j) {
  const Shape sh = shapeOf(ctx);
  const int n = ctx->nRanks, rank = ctx->rank, d = ((rank - st - 1) % n + n) % n;
  int64_t r0, r1;
  chunkRows(sh.mLocal, j, &r0, &r1);
  if (r1 == r0) return 0;
  cuco_buffer_t *c = cuco_buffer(ctx, "c"), *staging = cuco_buffer(ctx, "staging");
  const Elem* a = (const Elem*)cuco_buffer(ctx, "a")->ptr + (d * sh.mLocal + r0) * sh.kLocal;
  const void* b = cuco_buffer(ctx, "b")->ptr;
  const bool last = st == n - 1;
  const size_t xOffset = (last ? r0 : d * sh.mLocal + r0) * sh.N * sizeof(Elem);  // the chunk's bytes in X
  Elem* x = (Elem*)((char*)(last ? c : staging)->ptr + xOffset);
  if (st == 0) {
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a, b, x, r1 - r0, sh.kLocal, sh.N));
  } else {
    const unsigned long long target = ((s->epoch - 1) * (n - 1) + st) * (unsigned long long)kUnitsPerPut;
    CUCO_CUDA(ctx, counters.await(*ctx->devComm, ctx->stream, j, j + 1, target));
    CUCO_CUBLAS(ctx, cuco_gemm_bf16_accumulate(s->blas, a, b, x, r1 - r0, sh.kLocal, sh.N));
  }
  if (last) return 0;
  // Step world-2 finishes block d = rank+1's sum: it goes to that rank's c, at the chunk's rows of its block.
  const bool toC = st == n - 2;
  const size_t dstOffset = toC ? r0 * sh.N * sizeof(Elem) : xOffset;
  cudaStream_t side = ctx->sideStreams[0];
  CUCO_CUDA(ctx, cuco::streamAfter(side, ctx->stream, s->chunkReady[j]));
  putKernel<kIssuer><<<kPutCtas, kPutThreads, 0, side>>>(*ctx->devComm, counters.handle, (toC ? c : staging)->window,
                                                         dstOffset, (rank + 1) % n, (const char*)x,
                                                         (size_t)(r1 - r0) * sh.N * sizeof(Elem), j, s->firstPut);
  CUCO_CUDA(ctx, cudaGetLastError());
  s->firstPut = false;
  return 0;
}

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = kPutCtas;
  counters.require(reqs, cuco::kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, cuco::kBesideReservedSms));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  s->firstPut = true;
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->sideStreams[0], ctx->stream, s->fork));
  for (int st = 0; st < ctx->nRanks; st++)
    for (int j = 0; j < kChunks; j++) CUCO_TRY(step(ctx, s, st, j));
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, ctx->sideStreams[0], s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
