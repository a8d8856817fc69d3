/*************************************************************************
 * GEMM + ReduceScatter strategy kernel: one program for many design points, chosen at compile time.
 *
 * Every rank multiplies its slice of K into its own partial product (the `partial` window, M x N); rank r
 * then adds rows [r*mLocal, (r+1)*mLocal) of every rank's partial, in rank order in fp32, into c.
 * The directive proposer prepends the design point as macros (cuco/evolve/strategy.py):
 *   backend    CUCO_BACKEND_LSA   the reduction kernel loads peers' rows through NCCL device-API windows
 *              CUCO_BACKEND_CE    copy engine: cudaMemcpyAsync pulls peers' rows into `staging`, and the
 *                                 reduction kernel adds local memory only
 *   placement  CUCO_PLACEMENT_DEFERRED        one GEMM, then the reduction, on ctx->stream
 *              CUCO_PLACEMENT_STREAM_OVERLAP  chunk j's rows of every block in one batched GEMM on the main
 *                                             stream; chunk j's reduction on side stream 0 while chunk j+1
 *                                             is multiplied, on SMs the GEMM leaves free
 *   sync       CUCO_SYNC_GLOBAL   an LSA barrier across all ranks before a chunk is read
 *              CUCO_SYNC_CHUNK    a counter per chunk on every rank, bumped by each peer once its GEMM has
 *                                 written the chunk; the reader spins on it (stream overlap only)
 *   issuer     CUCO_ISSUER_CTA / CUCO_ISSUER_WARP: the unit of the reduction kernel that owns a contiguous
 *              slice of a chunk
 *   chunks     CUCO_CHUNKS: row ranges each rank's block is cut into (1..16)
 *
 * Invariants: a rank's partial is overwritten only by its next run's GEMM, and every run ends with an LSA
 * barrier, after which no peer reads it any more. Chunk counters only grow (epoch * (nRanks - 1) once chunk j
 * of this run is complete everywhere), so they are zeroed once, in setup. Chunks with no rows are skipped on
 * every rank alike (the row split depends on the shape only), so barriers and counters stay matched.
 * Requires: partial (and staging for CE) symmetric; all ranks in one LSA team; one side stream.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_design_point.cuh"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

// ---- The design point --------------------------------------------------------------------------------

#if defined(CUCO_BACKEND_LSA) + defined(CUCO_BACKEND_CE) != 1
#error "define exactly one backend: CUCO_BACKEND_LSA or CUCO_BACKEND_CE"
#endif
#if defined(CUCO_PLACEMENT_DEFERRED) + defined(CUCO_PLACEMENT_STREAM_OVERLAP) != 1
#error "define exactly one placement: CUCO_PLACEMENT_DEFERRED or CUCO_PLACEMENT_STREAM_OVERLAP"
#endif
#if defined(CUCO_SYNC_GLOBAL) + defined(CUCO_SYNC_CHUNK) != 1
#error "define exactly one sync scope"
#endif

enum class Backend { Lsa, Ce };
enum class Placement { Deferred, StreamOverlap };
enum class Sync { Global, Chunk };
using cuco::Issuer;

#if defined(CUCO_BACKEND_LSA)
constexpr Backend kBackend = Backend::Lsa;
#else
constexpr Backend kBackend = Backend::Ce;
#endif
#if defined(CUCO_PLACEMENT_DEFERRED)
constexpr Placement kPlacement = Placement::Deferred;
#else
constexpr Placement kPlacement = Placement::StreamOverlap;
#endif
#if defined(CUCO_SYNC_GLOBAL)
constexpr Sync kSync = Sync::Global;
#else
constexpr Sync kSync = Sync::Chunk;
#endif
using cuco::kIssuer;
using cuco::kChunks;
static_assert(kPlacement == Placement::StreamOverlap || kSync == Sync::Global,
              "placement deferred reads everything at once: sync global (cuco/designspace/constraints.py)");

// ---- Constants ---------------------------------------------------------------------------------------

constexpr int kThreads = CUCO_COLL_THREADS;
// Reduction CTAs. Deferred: the kernel runs alone, with as many CTAs as the device collectives' reduce-scatter
// (CUCO_COLL_CTAS, the count that moved data fastest over NVLink). Stream overlap: it runs beside the next
// chunk's GEMM on SMs kept from cuBLAS (cublasSetSmCountTarget). 8 CTAs of 512 threads, each with
// CUCO_COLL_REDUCE_PACKS 16-byte loads in flight per rank, keep 512 KiB in flight: at the ~1 us latency of a
// load over NVLink that covers the link's rate (notes-collectives.md), and 8 SMs are 6% of an H100's or H200's.
constexpr int kOverlapReduceCtas = 8;
constexpr int kReduceCtas = kPlacement == Placement::Deferred ? CUCO_COLL_CTAS : kOverlapReduceCtas;
// SMs kept from the GEMM under stream overlap: the reduction's CTAs, and one for the small kernels (signal,
// wait, barrier) that must run while a GEMM holds the rest.
constexpr int kReservedSms = kOverlapReduceCtas + 1;
constexpr int kMaxRanks = CUCO_COLL_MAX_RANKS;  // cuco::reduceRange takes at most this many inputs
using cuco::kMaxChunks;
static_assert(kChunks <= kMaxChunks, "a chunk counter per chunk");
using Elem = __nv_bfloat16;  // a, b, c, partial and staging hold bf16 (workload.toml)
constexpr size_t kPackElems = 16 / sizeof(Elem);  // a 16-byte pack: the reduction's widest access

#define CHECK(call)     \
  do {                  \
    if (call) return 1; \
  } while (0)

// Chunk counters (how many peers have written chunk j, over all runs) live in the device communicator's
// resource buffer, not in a workload buffer: the runner poisons those before every trial.
static ncclDevResourceRequirements flagsReq;
static ncclDevResourceHandle_t flagsHandle;

struct State {
  cublasHandle_t blas;
  cudaEvent_t fork, join, chunkReady[kChunks];
  unsigned long long epoch;        // runs so far: chunk j is complete everywhere at epoch * (nRanks - 1) signals
  char* peerPartial[kMaxRanks];    // every rank's partial, mapped into this rank's address space (LSA)
};

// The run's shape: A is M x kLocal, B kLocal x N; c holds mLocal rows of N.
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

// The inputs of one chunk's reduction, in rank order, and where the sum goes.
struct Inputs {
  const Elem* in[kMaxRanks];
  int n;
};

// ---- Small kernels ---------------------------------------------------------------------------------

// Chunk j of this rank's partial is written (the GEMM before this kernel on its stream): count it on every peer.
__global__ void signalKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle, int j) {
  if (threadIdx.x != 0) return;
  for (int peer = 0; peer < devComm.lsaSize; peer++)
    if (peer != devComm.lsaRank) cuco::bumpCounter(devComm, flagsHandle, peer, j);
}

// ---- The reduction kernel --------------------------------------------------------------------------

// out[i] = sum over p (in order, fp32) of in.in[p][i], i < count, each unit its contiguous pack-aligned slice.
// waitChunk >= 0: first wait until chunk waitChunk's counter reaches `target` (LSA at sync chunk).
template <Issuer I>
__global__ void __launch_bounds__(kThreads) reduceKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle,
                                                         Inputs in, Elem* out, size_t count, int waitChunk,
                                                         unsigned long long target) {
  if (waitChunk >= 0) cuco::awaitCounter(devComm, flagsHandle, waitChunk, target);
  const cuco::Worker me = cuco::IssuerUnit<I>::self();
  size_t lo, hi;
  cuco::packSlice(count, kPackElems, me.index, me.count, &lo, &hi);
  cuco::reduceRange<Elem>(in.in, in.n, &out, 1, lo, hi, me.lane, me.lanes);
}

// ---- Backend: the reduction of one chunk -------------------------------------------------------------

template <Backend B>
struct Transport;

// LSA: the reduction kernel loads every rank's rows of the chunk straight from its partial window.
template <>
struct Transport<Backend::Lsa> {
  static int reduce(cuco_ctx_t* ctx, State* s, cudaStream_t st, int64_t r0, int64_t r1, int waitChunk,
                    unsigned long long target) {
    const Shape sh = shapeOf(ctx);
    Inputs in;
    in.n = ctx->nRanks;
    for (int p = 0; p < ctx->nRanks; p++) in.in[p] = (const Elem*)s->peerPartial[p] + (ctx->rank * sh.mLocal + r0) * sh.N;
    Elem* out = (Elem*)cuco_buffer(ctx, "c")->ptr + r0 * sh.N;
    reduceKernel<kIssuer><<<kReduceCtas, kThreads, 0, st>>>(ctx->devComm, flagsHandle, in, out,
                                                            (size_t)(r1 - r0) * sh.N, waitChunk, target);
    CUCO_CUDA(ctx, cudaGetLastError());
    return 0;
  }
};

// Copy engine: the peers' rows of the chunk are copied into the same rows of `staging` (behind a wait kernel
// at sync chunk), then added to this rank's own from local memory.
template <>
struct Transport<Backend::Ce> {
  static int reduce(cuco_ctx_t* ctx, State* s, cudaStream_t st, int64_t r0, int64_t r1, int waitChunk,
                    unsigned long long target) {
    const Shape sh = shapeOf(ctx);
    if (waitChunk >= 0) {
      cuco::awaitCounterKernel<<<1, cuco::kSmallKernelThreads, 0, st>>>(ctx->devComm, flagsHandle, waitChunk, target);
      CUCO_CUDA(ctx, cudaGetLastError());
    }
    Elem* staging = (Elem*)cuco_buffer(ctx, "staging")->ptr;
    const Elem* partial = (const Elem*)cuco_buffer(ctx, "partial")->ptr;
    const size_t rowsOffset = (ctx->rank * sh.mLocal + r0) * sh.N;  // this rank's chunk rows in a partial
    const size_t bytes = (size_t)(r1 - r0) * sh.N * sizeof(Elem);
    Inputs in;
    in.n = ctx->nRanks;
    for (int p = 0; p < ctx->nRanks; p++) {
      if (p == ctx->rank) {
        in.in[p] = partial + rowsOffset;
        continue;
      }
      // Slot p of staging: the rows rank p's partial holds for this rank.
      Elem* slot = staging + (p * sh.mLocal + r0) * sh.N;
      CUCO_CUDA(ctx, cudaMemcpyAsync(slot, (const Elem*)s->peerPartial[p] + rowsOffset, bytes, cudaMemcpyDeviceToDevice, st));
      in.in[p] = slot;
    }
    Elem* out = (Elem*)cuco_buffer(ctx, "c")->ptr + r0 * sh.N;
    reduceKernel<kIssuer><<<kReduceCtas, kThreads, 0, st>>>(ctx->devComm, flagsHandle, in, out,
                                                            (size_t)(r1 - r0) * sh.N, -1, 0);
    CUCO_CUDA(ctx, cudaGetLastError());
    return 0;
  }
};

using Transfers = Transport<kBackend>;

static int barrier(cuco_ctx_t* ctx, cudaStream_t st) {
  cuco::barrierKernel<<<1, cuco::kSmallKernelThreads, 0, st>>>(ctx->devComm);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

// ---- Placement ------------------------------------------------------------------------------------

template <Placement>
struct Schedule;

// Deferred: the whole partial product, a barrier, then every chunk's reduction, all on the main stream.
template <>
struct Schedule<Placement::Deferred> {
  static int run(cuco_ctx_t* ctx, State* s) {
    const Shape sh = shapeOf(ctx);
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr,
                                    cuco_buffer(ctx, "partial")->ptr, sh.M, sh.kLocal, sh.N));
    CHECK(barrier(ctx, ctx->stream));
    for (int j = 0; j < kChunks; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      if (r1 > r0) CHECK(Transfers::reduce(ctx, s, ctx->stream, r0, r1, -1, 0));
    }
    return 0;
  }
};

// Stream overlap: chunk j of every block in one batched GEMM on the main stream, then (sync chunk) its signal
// to the peers; on side stream 0, once this rank's chunk j is written, a barrier (sync global) or the
// counter's wait (sync chunk), then chunk j's reduction.
template <>
struct Schedule<Placement::StreamOverlap> {
  static int run(cuco_ctx_t* ctx, State* s) {
    const Shape sh = shapeOf(ctx);
    cudaStream_t side = ctx->sideStreams[0];
    const Elem* a = (const Elem*)cuco_buffer(ctx, "a")->ptr;
    Elem* partial = (Elem*)cuco_buffer(ctx, "partial")->ptr;
    const unsigned long long target = s->epoch * (unsigned long long)(ctx->nRanks - 1);
    CUCO_CUDA(ctx, cudaEventRecord(s->fork, ctx->stream));
    CUCO_CUDA(ctx, cudaStreamWaitEvent(side, s->fork, 0));
    for (int j = 0; j < kChunks; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      if (r1 == r0) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16_batched(s->blas, a + r0 * sh.kLocal, sh.mLocal * sh.kLocal,
                                              cuco_buffer(ctx, "b")->ptr, partial + r0 * sh.N, sh.mLocal * sh.N,
                                              r1 - r0, sh.kLocal, sh.N, ctx->nRanks));
      CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], ctx->stream));
      if constexpr (kSync == Sync::Chunk) {
        signalKernel<<<1, cuco::kSmallKernelThreads, 0, ctx->stream>>>(ctx->devComm, flagsHandle, j);
        CUCO_CUDA(ctx, cudaGetLastError());
      }
      CUCO_CUDA(ctx, cudaStreamWaitEvent(side, s->chunkReady[j], 0));
      if constexpr (kSync == Sync::Global) {
        CHECK(barrier(ctx, side));
        CHECK(Transfers::reduce(ctx, s, side, r0, r1, -1, 0));
      } else {
        CHECK(Transfers::reduce(ctx, s, side, r0, r1, j, target));
      }
    }
    CUCO_CUDA(ctx, cudaEventRecord(s->join, side));
    CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->stream, s->join, 0));
    return 0;
  }
};

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = 1;  // barrierKernel: one CTA
  cuco::counterRequirements(reqs, &flagsReq, &flagsHandle, kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (ctx->nSideStreams < 1) CUCO_FAIL(ctx, "needs one side stream");
  if (ctx->nRanks > kMaxRanks) CUCO_FAIL(ctx, "at most %d ranks", kMaxRanks);
  if (!ctx->hasDevComm || ctx->devComm.lsaSize != ctx->nRanks)
    CUCO_FAIL(ctx, "all ranks must share one LSA team (one NVLink domain)");
  cuco_buffer_t *partial = cuco_buffer(ctx, "partial"), *staging = cuco_buffer(ctx, "staging");
  if (!partial->symmetric) CUCO_FAIL(ctx, "partial must be symmetric");
  if (kBackend == Backend::Ce && !staging) CUCO_FAIL(ctx, "backend ce needs the staging buffer");
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  if (kPlacement == Placement::StreamOverlap) {
    int sms = 0;
    CUCO_CUDA(ctx, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->cudaDevice));
    CUCO_CUBLAS(ctx, cublasSetSmCountTarget(s->blas, sms - kReservedSms));
  }
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
  for (int j = 0; j < kChunks; j++) CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->chunkReady[j], cudaEventDisableTiming));
  CUCO_CUDA(ctx, cuco::windowPointers(partial->window, ctx->nRanks, s->peerPartial, ctx->stream));
  cuco::zeroCountersKernel<<<1, cuco::kSmallKernelThreads, 0, ctx->stream>>>(ctx->devComm, flagsHandle, kMaxChunks);
  CUCO_CUDA(ctx, cudaGetLastError());
  // Every rank's counters are zero before any signal.
  CHECK(barrier(ctx, ctx->stream));
  CUCO_CUDA(ctx, cudaStreamSynchronize(ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  CHECK(Schedule<kPlacement>::run(ctx, s));
  // No peer reads this rank's partial once every rank is past this barrier: the next run may overwrite it.
  return barrier(ctx, ctx->stream);
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
