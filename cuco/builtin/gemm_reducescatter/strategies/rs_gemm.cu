/*************************************************************************
 * GEMM + ReduceScatter strategy kernel: one program for many design points, chosen at compile time.
 *
 * Every rank multiplies its slice of K into its own partial product (the `partial` window, M x N); rank r
 * then adds rows [r*mLocal, (r+1)*mLocal) of every rank's partial, in rank order in fp32, into c.
 * The design point (cuco_design_point.cuh; the values workload.toml accepts):
 *   backend    lsa    the reduction kernel loads peers' rows through NCCL device-API windows
 *              ce     copy engine: cudaMemcpyAsync pulls peers' rows into `staging`, and the reduction kernel
 *                     adds local memory only
 *   placement  deferred        one GEMM, then the reduction, on ctx->stream
 *              stream_overlap  chunk j's rows of every block in one batched GEMM on the main stream; chunk j's
 *                              reduction on side stream 0 while chunk j+1 is multiplied, on SMs the GEMM leaves free
 *   sync       global  an LSA barrier across all ranks before a chunk is read
 *              chunk   a counter per chunk on every rank, bumped by each peer once its GEMM has written the
 *                      chunk; the reader spins on it (stream overlap only)
 *   issuer     cta or warp: the unit of the reduction kernel that owns a contiguous slice of a chunk
 *   chunks     row ranges each rank's block is cut into (1..16)
 *
 * Invariants: a rank's partial is overwritten only by its next run's GEMM, and every run ends with an LSA
 * barrier, after which no peer reads it any more. Chunk counters only grow (epoch * (nRanks - 1) once chunk j
 * of this run is complete everywhere), so they are zeroed once, in setup. Chunks with no rows are skipped on
 * every rank alike (the row split depends on the shape only), so barriers and counters stay matched.
 * Requires (workload.toml): partial symmetric; all ranks in one LSA team; one side stream.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_rs.cuh"
#include "cuco_strategy.cuh"

using namespace cuco::point;

// ---- Constants ---------------------------------------------------------------------------------------

constexpr int kThreads = CUCO_COLL_THREADS;
// Reduction CTAs. Deferred: the kernel runs alone, with as many CTAs as the device collectives' reduce-scatter
// (CUCO_COLL_CTAS, the count that moved data fastest over NVLink). Stream overlap: it runs beside the next
// chunk's GEMM (cuco::kBesideCtas).
constexpr int kReduceCtas = kPlacement == Placement::Deferred ? CUCO_COLL_CTAS : cuco::kBesideCtas;
using Elem = cuco::rs::Elem;
constexpr size_t kPackElems = 16 / sizeof(Elem);  // a 16-byte pack: the reduction's widest access

// Chunk counters: how many peers have written chunk j, over all runs.
static cuco::Counters counters;

// epoch: chunk j is complete everywhere at epoch * (nRanks - 1) signals.
struct State : cuco::Common<> {
  char* peerPartial[cuco::kMaxRanks];  // every rank's partial, mapped into this rank's address space (LSA)
};

using cuco::rs::Shape;
using cuco::rs::shapeOf;

// The inputs of one chunk's reduction, in rank order, and where the sum goes.
using Inputs = cuco::RankPointers<Elem>;

// ---- Small kernels ---------------------------------------------------------------------------------

// Chunk j of this rank's partial is written (the GEMM before this kernel on its stream): count it on every peer.
__global__ void signalKernel(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle, int j) {
  if (threadIdx.x != 0) return;
  for (int peer = 0; peer < devComm.lsaSize; peer++)
    if (peer != devComm.lsaRank) cuco::bumpCounter(devComm, counterHandle, peer, j);
}

// ---- The reduction kernel --------------------------------------------------------------------------

// out[i] = sum over p (in order, fp32) of in.at[p][i], i < count, each unit its contiguous pack-aligned slice.
// waitChunk >= 0: first wait until chunk waitChunk's counter reaches `target` (LSA at sync chunk).
template <Issuer I>
__global__ void __launch_bounds__(kThreads) reduceKernel(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle,
                                                         Inputs in, Elem* out, size_t count, int waitChunk,
                                                         unsigned long long target) {
  if (waitChunk >= 0) cuco::awaitCounter(devComm, counterHandle, waitChunk, target);
  const cuco::Worker me = cuco::IssuerUnit<I>::self();
  size_t lo, hi;
  cuco::packSlice(count, kPackElems, me.index, me.count, &lo, &hi);
  cuco::reduceRange<Elem>(in.at, in.n, &out, 1, lo, hi, me.lane, me.lanes);
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
    for (int p = 0; p < ctx->nRanks; p++) in.at[p] = (const Elem*)s->peerPartial[p] + (ctx->rank * sh.mLocal + r0) * sh.N;
    Elem* out = (Elem*)cuco_buffer(ctx, "c")->ptr + r0 * sh.N;
    reduceKernel<kIssuer><<<kReduceCtas, kThreads, 0, st>>>(*ctx->devComm, counters.handle, in, out,
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
    if (waitChunk >= 0) CUCO_CUDA(ctx, counters.await(*ctx->devComm, st, waitChunk, waitChunk + 1, target));
    Elem* staging = (Elem*)cuco_buffer(ctx, "staging")->ptr;
    const Elem* partial = (const Elem*)cuco_buffer(ctx, "partial")->ptr;
    const size_t rowsOffset = (ctx->rank * sh.mLocal + r0) * sh.N;  // this rank's chunk rows in a partial
    const size_t bytes = (size_t)(r1 - r0) * sh.N * sizeof(Elem);
    Inputs in;
    in.n = ctx->nRanks;
    for (int p = 0; p < ctx->nRanks; p++) {
      if (p == ctx->rank) {
        in.at[p] = partial + rowsOffset;
        continue;
      }
      // Slot p of staging: the rows rank p's partial holds for this rank.
      Elem* slot = staging + (p * sh.mLocal + r0) * sh.N;
      CUCO_CUDA(ctx, cudaMemcpyAsync(slot, (const Elem*)s->peerPartial[p] + rowsOffset, bytes, cudaMemcpyDeviceToDevice, st));
      in.at[p] = slot;
    }
    Elem* out = (Elem*)cuco_buffer(ctx, "c")->ptr + r0 * sh.N;
    reduceKernel<kIssuer><<<kReduceCtas, kThreads, 0, st>>>(*ctx->devComm, counters.handle, in, out,
                                                            (size_t)(r1 - r0) * sh.N, -1, 0);
    CUCO_CUDA(ctx, cudaGetLastError());
    return 0;
  }
};

using Transfers = Transport<kBackend>;

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
    CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, ctx->stream));
    for (int j = 0; j < kChunks; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      if (r1 > r0) CUCO_TRY(Transfers::reduce(ctx, s, ctx->stream, r0, r1, -1, 0));
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
    CUCO_CUDA(ctx, cuco::streamAfter(side, ctx->stream, s->fork));
    for (int j = 0; j < kChunks; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      if (r1 == r0) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16_batched(s->blas, a + r0 * sh.kLocal, sh.mLocal * sh.kLocal,
                                              cuco_buffer(ctx, "b")->ptr, partial + r0 * sh.N, sh.mLocal * sh.N,
                                              r1 - r0, sh.kLocal, sh.N, ctx->nRanks));
      if constexpr (kSync == Sync::Chunk) {
        signalKernel<<<1, cuco::kSmallKernelThreads, 0, ctx->stream>>>(*ctx->devComm, counters.handle, j);
        CUCO_CUDA(ctx, cudaGetLastError());
      }
      CUCO_CUDA(ctx, cuco::streamAfter(side, ctx->stream, s->chunkReady[j]));
      if constexpr (kSync == Sync::Global) {
        CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, side));
        CUCO_TRY(Transfers::reduce(ctx, s, side, r0, r1, -1, 0));
      } else {
        CUCO_TRY(Transfers::reduce(ctx, s, side, r0, r1, j, target));
      }
    }
    CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, side, s->join));
    return 0;
  }
};

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = 1;  // cuco::barrier: one CTA
  counters.require(reqs, cuco::kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, kPlacement == Placement::StreamOverlap ? cuco::kBesideReservedSms : 0));
  CUCO_CUDA(ctx, cuco::windowPointers(cuco_buffer(ctx, "partial")->window, ctx->nRanks, s->peerPartial, ctx->stream));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  CUCO_TRY(Schedule<kPlacement>::run(ctx, s));
  // No peer reads this rank's partial once every rank is past this barrier: the next run may overwrite it.
  CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
