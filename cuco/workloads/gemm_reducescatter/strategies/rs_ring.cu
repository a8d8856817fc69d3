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
 * The design point (cuco/evolve/strategy.py): backend lsa, placement fused, sync chunk;
 *   issuer  CUCO_ISSUER_CTA / CUCO_ISSUER_WARP: the put kernel's unit that stores a contiguous slice and signals it
 *   chunks  CUCO_CHUNKS: row ranges per block (1..16)
 *
 * Sums run in ring order (rank d+1 first) in fp32 and are rounded to bf16 at every hop, the same way every run:
 * results are bitwise deterministic. Counters only grow (zeroed once, in setup): rank r's counter for chunk j
 * reaches ((epoch - 1) * (world - 1) + s) * units once the previous rank's step s-1 of this run has stored it.
 * A barrier opens each run's first put kernel: no rank stores into a peer's staging or c before that peer has
 * finished its previous run.
 * Requires: c and staging symmetric; all ranks in one LSA team; one side stream.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_design_point.cuh"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

// ---- The design point --------------------------------------------------------------------------------

#if !defined(CUCO_BACKEND_LSA) || !defined(CUCO_PLACEMENT_FUSED) || !defined(CUCO_SYNC_CHUNK)
#error "the ring is backend lsa, placement fused, sync chunk"
#endif

using cuco::Issuer;
using cuco::kIssuer;
using cuco::kChunks;

// ---- Constants ---------------------------------------------------------------------------------------

// The put kernel's shape; kPutCtas is also the device communicator's lsaBarrierCount (CTA b uses barrier b).
// Stores need no round trip before the next one, so a few CTAs keep NVLink busy: 8 of 512 threads, 6% of an
// H100's or H200's SMs, kept from the GEMM.
constexpr int kPutCtas = 8;
constexpr int kPutThreads = CUCO_COLL_THREADS;
// SMs kept from cuBLAS: the put kernel's, and one for the wait kernels on the main stream.
constexpr int kReservedSms = kPutCtas + 1;
constexpr int kUnitsPerPut = cuco::IssuerUnit<kIssuer>::perKernel(kPutCtas, kPutThreads);
constexpr int kMaxRanks = CUCO_COLL_MAX_RANKS;
using cuco::kMaxChunks;
using Elem = __nv_bfloat16;     // a, b, c and staging hold bf16 (workload.toml)

#define CHECK(call)     \
  do {                  \
    if (call) return 1; \
  } while (0)

// Chunk counters live in the device communicator's resource buffer (not a workload buffer: the runner poisons
// those before every trial). Filled in during ncclDevCommCreate.
static ncclDevResourceRequirements flagsReq;
static ncclDevResourceHandle_t flagsHandle;

struct State {
  cublasHandle_t blas;
  cudaEvent_t fork, join, chunkReady[kChunks];
  unsigned long long epoch;  // runs so far
  bool firstPut;             // the run's first put kernel opens with the barrier
};

struct Shape {
  int64_t M, K, N, mLocal, kLocal;
};

static Shape shapeOf(const cuco_ctx_t* ctx) {
  Shape sh;
  sh.M = cuco_param(ctx, "M"), sh.K = cuco_param(ctx, "K"), sh.N = cuco_param(ctx, "N");
  sh.mLocal = sh.M / ctx->nRanks, sh.kLocal = sh.K / ctx->nRanks;
  return sh;
}

// Row range [r0, r1) of chunk j of a block of mLocal rows.
static void chunkRows(int64_t mLocal, int j, int64_t* r0, int64_t* r1) {
  *r0 = mLocal * j / kChunks;
  *r1 = mLocal * (j + 1) / kChunks;
}

// ---- The put kernel --------------------------------------------------------------------------------

// Store `bytes` from src at `dstOffset` of rank `peer`'s window, each unit its contiguous share
// (cuco::pushSlice), then bump the peer's counter for chunk j. startBarrier: all ranks meet first.
template <Issuer I>
__global__ void __launch_bounds__(kPutThreads) putKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle,
                                                         ncclWindow_t win, size_t dstOffset, int peer,
                                                         const char* src, size_t bytes, int j, int startBarrier) {
  using Unit = cuco::IssuerUnit<I>;
  if (startBarrier) {
    ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier,
                                           blockIdx.x};
    // acq_rel: the peer's previous run, which read its staging and c, is done before our stores land there.
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  }
  const cuco::Worker me = Unit::self();
  char* dst = (char*)ncclGetLsaPointer(win, dstOffset, peer);
  cuco::pushSlice(&dst, 1, src, 0, bytes, me.index, me.count, me.lane, me.lanes);
  Unit::sync();  // every thread of the unit has issued its stores before lane 0 releases them
  if (me.lane == 0) cuco::bumpCounter(devComm, flagsHandle, peer, j);
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
    cuco::awaitCounterKernel<<<1, cuco::kSmallKernelThreads, 0, ctx->stream>>>(ctx->devComm, flagsHandle, j, target);
    CUCO_CUDA(ctx, cudaGetLastError());
    CUCO_CUBLAS(ctx, cuco_gemm_bf16_accumulate(s->blas, a, b, x, r1 - r0, sh.kLocal, sh.N));
  }
  if (last) return 0;
  // Step world-2 finishes block d = rank+1's sum: it goes to that rank's c, at the chunk's rows of its block.
  const bool toC = st == n - 2;
  const size_t dstOffset = toC ? r0 * sh.N * sizeof(Elem) : xOffset;
  cudaStream_t side = ctx->sideStreams[0];
  CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], ctx->stream));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(side, s->chunkReady[j], 0));
  putKernel<kIssuer><<<kPutCtas, kPutThreads, 0, side>>>(ctx->devComm, flagsHandle, (toC ? c : staging)->window,
                                                         dstOffset, (rank + 1) % n, (const char*)x,
                                                         (size_t)(r1 - r0) * sh.N * sizeof(Elem), j, s->firstPut);
  CUCO_CUDA(ctx, cudaGetLastError());
  s->firstPut = false;
  return 0;
}

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = kPutCtas;
  cuco::counterRequirements(reqs, &flagsReq, &flagsHandle, kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (ctx->nSideStreams < 1) CUCO_FAIL(ctx, "needs one side stream");
  if (ctx->nRanks > kMaxRanks) CUCO_FAIL(ctx, "at most %d ranks", kMaxRanks);
  if (!ctx->hasDevComm || ctx->devComm.lsaSize != ctx->nRanks)
    CUCO_FAIL(ctx, "all ranks must share one LSA team (one NVLink domain)");
  if (!cuco_buffer(ctx, "c")->symmetric || !cuco_buffer(ctx, "staging")->symmetric)
    CUCO_FAIL(ctx, "c and staging must be symmetric");
  State* s = new State();
  ctx->state = s;
  int sms = 0;
  CUCO_CUDA(ctx, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->cudaDevice));
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  CUCO_CUBLAS(ctx, cublasSetSmCountTarget(s->blas, sms - kReservedSms));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
  for (int j = 0; j < kChunks; j++) CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->chunkReady[j], cudaEventDisableTiming));
  CUCO_CUDA(ctx, cuco::resetCounters(ctx->devComm, flagsHandle, kMaxChunks, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  s->firstPut = true;
  CUCO_CUDA(ctx, cudaEventRecord(s->fork, ctx->stream));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->sideStreams[0], s->fork, 0));
  for (int st = 0; st < ctx->nRanks; st++)
    for (int j = 0; j < kChunks; j++) CHECK(step(ctx, s, st, j));
  CUCO_CUDA(ctx, cudaEventRecord(s->join, ctx->sideStreams[0]));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->stream, s->join, 0));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  CUCO_CUDA(ctx, cudaEventDestroy(s->fork));
  CUCO_CUDA(ctx, cudaEventDestroy(s->join));
  for (int j = 0; j < kChunks; j++) CUCO_CUDA(ctx, cudaEventDestroy(s->chunkReady[j]));
  delete s;
  ctx->state = NULL;
  return 0;
}
