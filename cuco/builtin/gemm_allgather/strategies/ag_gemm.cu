/*************************************************************************
 * GEMM + AllGather strategy kernel: one program for many design points, chosen at compile time.
 *
 * The design point (cuco_design_point.cuh; the values workload.toml accepts):
 *   backend    lsa   push stores through NCCL device-API windows (ncclGetLsaPointer)
 *              ce    copy engine: cudaMemcpyAsync pulls peers' shards (LSA-mapped)
 *   placement  deferred        all-gather, then one GEMM, on ctx->stream
 *              stream_overlap  transfers on side stream 0; the local rows' GEMM on the main stream; each chunk's
 *                              GEMM on side stream 1 once that chunk has arrived, so it fills SMs as the local
 *                              GEMM's tail frees them
 *              split_put_wait  transfers on a side stream; local GEMM; one wait; the peers' GEMMs
 *   sync       global  LSA barrier across all ranks (ce: one event after all copies, except under
 *                      stream_overlap, which waits per chunk with either scope)
 *              chunk   a counter per chunk, bumped on the receiver by each producer (ce: an event per chunk)
 *   issuer     cta or warp: the unit that copies a contiguous slice and signals it
 *   chunks     pieces each shard is sent in (1..16)
 *
 * Each dimension is one policy, picked once:
 *   IssuerUnit<kIssuer>            a put kernel's worker (CTA or warp) and how its threads meet
 *   Transport<kBackend, ...>       start and end barriers, the transfer of a chunk range, the wait for it
 *   Schedule<kPlacement>           which stream the transfers go on, and where the GEMMs go around them
 * so cuco_run is: start barrier, transfers, GEMMs, end barrier. The LSA put kernel's copy is the device
 * collectives' all-gather piece (cuco::pushSlice, cuco_collectives.cuh): each unit stores its contiguous share
 * of a chunk to every destination slot at once, then signals it.
 *
 * Invariants: the deferred placement fills this rank's own slot of a_gathered too (its one GEMM reads all
 * of it); the overlap placements leave it alone (the local GEMM reads a). A start barrier keeps a rank
 * from writing into a peer's a_gathered before that peer's previous GEMM is done. Chunk counters only grow
 * (epoch * signals per chunk), so they are zeroed once, in setup.
 * Small kernels that must run while a GEMM is running (CE barriers) go on the main stream before the fork
 * and after the join: cuBLAS's persistent GEMM kernels hold every SM, so a kernel queued on a side stream
 * behind them would not start until the GEMM ends.
 * Requires (workload.toml): a and a_gathered symmetric; all ranks in one LSA team; two side streams.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

using namespace cuco::point;
using cuco::Worker;

// ---- Constants ---------------------------------------------------------------------------------------

// The put kernel's shape. kPutCtas must equal the device communicator's lsaBarrierCount: CTA b uses LSA
// barrier b. 512 threads: the most a CTA can run at full occupancy of its registers here.
constexpr int kPutCtas = 32;
constexpr int kPutThreads = 512;
// Units per put kernel: the signals each producer sends per chunk.
constexpr int kUnitsPerPut = cuco::IssuerUnit<kIssuer>::perKernel(kPutCtas, kPutThreads);
// a, a_gathered, b and c hold bf16 elements (workload.toml).
constexpr size_t kBytesPerElem = sizeof(__nv_bfloat16);

// Chunk counters: how many units of the peers' put kernels have signalled chunk j, over all runs.
static cuco::Counters counters;

// Common's epoch counts the runs: chunk j is complete when its counter reaches epoch * signals.
struct State : cuco::Common<> {
  cublasHandle_t blasSide;  // side stream 1's: a handle's workspace must not be shared by concurrent GEMMs
  cudaEvent_t joinGemm;     // side stream 1 joined back
  char* peerA[cuco::kMaxRanks];   // CE: every rank's shard of A, mapped into this rank's address space

  int create(cuco_ctx_t* ctx, int reservedSms) {
    CUCO_TRY(Common::create(ctx, reservedSms));
    CUCO_CUBLAS(ctx, cuco_gemm_handle(&blasSide, ctx->sideStreams[1]));
    CUCO_CUDA(ctx, cuco::createEvents(&joinGemm, 1));
    return 0;
  }
  int destroy(cuco_ctx_t* ctx) {
    CUCO_CUBLAS(ctx, cublasDestroy(blasSide));
    CUCO_CUDA(ctx, cuco::destroyEvents(&joinGemm, 1));
    return Common::destroy(ctx);
  }
};

// The run's shape: A is M x K, gathered from nRanks shards of mLocal rows; B and C hold nLocal columns.
struct Shape {
  int64_t M, K, N, mLocal, nLocal;
  size_t rowBytes;  // one row of A
};

static Shape shapeOf(const cuco_ctx_t* ctx) {
  Shape sh;
  sh.M = cuco_param(ctx, "M"), sh.K = cuco_param(ctx, "K"), sh.N = cuco_param(ctx, "N");
  sh.mLocal = sh.M / ctx->nRanks, sh.nLocal = sh.N / ctx->nRanks;
  sh.rowBytes = (size_t)sh.K * kBytesPerElem;
  return sh;
}

// ---- Sync chunk over LSA: a counter per chunk on every rank, bumped by every unit of every peer ---------

// Unit `me` has stored its share of chunk j on every peer: count it there. bumpCounter releases at system scope,
// so this unit's stores (its threads' too, through the sync) are visible on a peer before its counter moves.
template <class Unit>
__device__ inline void signalChunk(const ncclDevComm& devComm, ncclDevResourceHandle_t counterHandle, int j,
                                   const Worker& me) {
  Unit::sync();  // every thread of the unit has issued its stores
  if (me.lane == 0)
    for (int peer = 0; peer < devComm.lsaSize; peer++)
      if (peer != devComm.lsaRank) cuco::bumpCounter(devComm, counterHandle, peer, j);
}

// ---- Backend LSA: the put kernel -------------------------------------------------------------------

// Push chunks [c0, c1) of this rank's shard into slot `rank` of every rank's a_gathered (this rank's own
// too unless skipSelf): each unit its share of each chunk (cuco::pushSlice), which at sync chunk it signals.
template <Issuer I, Sync S>
__global__ void __launch_bounds__(kPutThreads) putKernel(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle,
                                                         ncclWindow_t gatherWin,
                                                         const char* shard, int64_t mLocal, size_t rowBytes,
                                                         size_t slotOffset, int c0, int c1, int startBarrier,
                                                         int endBarrier, int skipSelf) {
  using Unit = cuco::IssuerUnit<I>;
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, blockIdx.x};
  // acq_rel: every peer's previous GEMM over its a_gathered is done before our stores land there.
  if (startBarrier) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  const Worker me = Unit::self();
  char* dst[cuco::kMaxRanks];
  int nDst = 0;
  for (int peer = 0; peer < devComm.lsaSize; peer++)
    if (!skipSelf || peer != devComm.lsaRank) dst[nDst++] = (char*)ncclGetLsaPointer(gatherWin, slotOffset, peer);
  for (int j = c0; j < c1; j++) {
    int64_t r0, r1;
    chunkRows(mLocal, j, &r0, &r1);
    cuco::pushSlice(dst, nDst, shard, r0 * rowBytes, r1 * rowBytes, me.index, me.count, me.lane, me.lanes);
    if constexpr (S == Sync::Chunk) signalChunk<Unit>(devComm, counterHandle, j, me);
  }
  // acq_rel: our stores are visible to the peers, theirs to us, before anything after this kernel.
  if (endBarrier) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

// ---- Backend: barriers, the transfer of a chunk range, the wait for it ------------------------------

template <Backend B, Issuer I, Sync S>
struct Transport;

// LSA: the put kernel pushes; its first launch of a run opens with the start barrier. Sync global: each put
// kernel ends in a barrier, and a stream waits for it through an event. Sync chunk: a wait kernel spins on
// the counters.
template <Issuer I, Sync S>
struct Transport<Backend::Lsa, I, S> {
  static constexpr bool kCounters = S == Sync::Chunk;  // a stream waits on chunk counters, not on events
  static constexpr bool kEventPerChunk = false;        // the counters, or the end barrier, signal chunks

  static int startBarrier(cuco_ctx_t*) { return 0; }
  static int endBarrier(cuco_ctx_t*) { return 0; }

  // Enqueue chunks [c0, c1) on `st`. `first`: the run's first transfer (it opens with the start barrier);
  // `skipSelf`: leave this rank's own slot of a_gathered alone.
  static int put(cuco_ctx_t* ctx, State*, cudaStream_t st, int c0, int c1, bool first, bool skipSelf) {
    const Shape sh = shapeOf(ctx);
    cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
    const int endBarrier = S == Sync::Global;
    putKernel<I, S><<<kPutCtas, kPutThreads, 0, st>>>(*ctx->devComm, counters.handle, aFull->window, (const char*)a->ptr,
                                                      sh.mLocal, sh.rowBytes, (size_t)ctx->rank * a->bytes, c0, c1,
                                                      first, endBarrier, skipSelf);
    CUCO_CUDA(ctx, cudaGetLastError());
    return 0;
  }

  // Make `st` wait until chunks [c0, c1) have arrived; `ev`: the event recorded after their transfer.
  static int wait(cuco_ctx_t* ctx, State* s, cudaStream_t st, int c0, int c1, cudaEvent_t ev) {
    if constexpr (kCounters) {
      // Every peer has signalled chunks [c0, c1) of this run: kUnitsPerPut signals each.
      const unsigned long long target = s->epoch * (unsigned long long)kUnitsPerPut * (ctx->nRanks - 1);
      CUCO_CUDA(ctx, counters.await(*ctx->devComm, st, c0, c1, target));
    } else {
      CUCO_CUDA(ctx, cudaStreamWaitEvent(st, ev, 0));
    }
    return 0;
  }
};

// Copy engine: cudaMemcpyAsync pulls every rank's shard through its LSA mapping (peerA), between a barrier
// before (the peers' shards are ready) and one after (they must not change while read). Sync chunk: an
// event per chunk.
template <Issuer I, Sync S>
struct Transport<Backend::Ce, I, S> {
  static constexpr bool kCounters = false;
  static constexpr bool kEventPerChunk = S == Sync::Chunk;

  static int startBarrier(cuco_ctx_t* ctx) { return barrier(ctx); }
  static int endBarrier(cuco_ctx_t* ctx) { return barrier(ctx); }

  static int put(cuco_ctx_t* ctx, State* s, cudaStream_t st, int c0, int c1, bool /*first*/, bool skipSelf) {
    const Shape sh = shapeOf(ctx);
    cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
    for (int j = c0; j < c1; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      if (r1 == r0) continue;
      for (int p = 0; p < ctx->nRanks; p++) {
        if (skipSelf && p == ctx->rank) continue;
        char* dst = (char*)aFull->ptr + (size_t)p * a->bytes + r0 * sh.rowBytes;
        const char* src = (p == ctx->rank ? (const char*)a->ptr : s->peerA[p]) + r0 * sh.rowBytes;
        CUCO_CUDA(ctx, cudaMemcpyAsync(dst, src, (r1 - r0) * sh.rowBytes, cudaMemcpyDeviceToDevice, st));
      }
    }
    return 0;
  }

  static int wait(cuco_ctx_t* ctx, State*, cudaStream_t st, int, int, cudaEvent_t ev) {
    CUCO_CUDA(ctx, cudaStreamWaitEvent(st, ev, 0));
    return 0;
  }

 private:
  // On the main stream, outside the fork: a GEMM on a side stream would hold it back (header).
  static int barrier(cuco_ctx_t* ctx) {
    CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, ctx->stream));
    return 0;
  }
};

using Transfers = Transport<kBackend, kIssuer, kSync>;

// ---- GEMMs -----------------------------------------------------------------------------------------

// All of a_gathered times b, on the main stream.
static int gemmGathered(cuco_ctx_t* ctx, State* s) {
  const Shape sh = shapeOf(ctx);
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a_gathered")->ptr, cuco_buffer(ctx, "b")->ptr,
                                  cuco_buffer(ctx, "c")->ptr, sh.M, sh.K, sh.nLocal));
  return 0;
}

// This rank's own rows, straight from a (they need no communication), on the main stream.
static int gemmLocalRows(cuco_ctx_t* ctx, State* s) {
  const Shape sh = shapeOf(ctx);
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr,
                                  c + ctx->rank * sh.mLocal * sh.nLocal * kBytesPerElem, sh.mLocal, sh.K, sh.nLocal));
  return 0;
}

// Rows [r0, r1) of every peer's shard (not this rank's own), through `blas`.
static int gemmPeerRows(cuco_ctx_t* ctx, cublasHandle_t blas, int64_t r0, int64_t r1) {
  const Shape sh = shapeOf(ctx);
  const char* aFull = (const char*)cuco_buffer(ctx, "a_gathered")->ptr;
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
  if (r1 == r0) return 0;
  for (int p = 0; p < ctx->nRanks; p++) {
    if (p == ctx->rank) continue;
    const int64_t row = p * sh.mLocal + r0;
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(blas, aFull + row * sh.rowBytes, cuco_buffer(ctx, "b")->ptr,
                                    c + row * sh.nLocal * kBytesPerElem, r1 - r0, sh.K, sh.nLocal));
  }
  return 0;
}

// ---- Placement: the streams the transfers go on, and where the GEMMs go around them -----------------

// The overlapped placements' transfers: side stream 0, forked from the main stream, this rank's own slot
// left alone. perChunk: each chunk a transfer and an event (chunkReady[j]) of its own; otherwise one transfer
// and one event, chunkReady[kChunks - 1].
static int sideStreamTransfers(cuco_ctx_t* ctx, State* s, bool perChunk) {
  cudaStream_t comm = ctx->sideStreams[0];
  CUCO_CUDA(ctx, cuco::streamAfter(comm, ctx->stream, s->fork));
  if (perChunk) {
    for (int j = 0; j < kChunks; j++) {
      CUCO_TRY(Transfers::put(ctx, s, comm, j, j + 1, j == 0, true));
      CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], comm));
    }
  } else {
    CUCO_TRY(Transfers::put(ctx, s, comm, 0, kChunks, true, true));
    CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[kChunks - 1], comm));
  }
  return 0;
}

// The main stream waits for side stream 0 (the transfers) to finish.
static int joinSideStream(cuco_ctx_t* ctx, State* s) {
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, ctx->sideStreams[0], s->join));
  return 0;
}

template <Placement>
struct Schedule;

// Deferred: the whole all-gather, this rank's own slot too, then one GEMM, all on the main stream.
template <>
struct Schedule<Placement::Deferred> {
  static int transfers(cuco_ctx_t* ctx, State* s) {
    return Transfers::put(ctx, s, ctx->stream, 0, kChunks, true, false);
  }
  static int gemms(cuco_ctx_t* ctx, State* s) {
    // Stream order covers events and barriers; counters need their wait kernel.
    if constexpr (Transfers::kCounters) CUCO_TRY(Transfers::wait(ctx, s, ctx->stream, 0, kChunks, NULL));
    return gemmGathered(ctx, s);
  }
};

// Stream overlap: the local GEMM on the main stream; on side stream 1, chunk by chunk, a wait for the chunk
// and the GEMM over its rows of every peer.
template <>
struct Schedule<Placement::StreamOverlap> {
  static int transfers(cuco_ctx_t* ctx, State* s) {
    // A wait per chunk needs an event per chunk, unless counters signal the chunks.
    return sideStreamTransfers(ctx, s, !Transfers::kCounters);
  }
  static int gemms(cuco_ctx_t* ctx, State* s) {
    const Shape sh = shapeOf(ctx);
    CUCO_TRY(gemmLocalRows(ctx, s));
    cudaStream_t gemmSide = ctx->sideStreams[1];
    CUCO_CUDA(ctx, cudaStreamWaitEvent(gemmSide, s->fork, 0));
    for (int j = 0; j < kChunks; j++) {
      int64_t r0, r1;
      chunkRows(sh.mLocal, j, &r0, &r1);
      CUCO_TRY(Transfers::wait(ctx, s, gemmSide, j, j + 1, s->chunkReady[j]));
      CUCO_TRY(gemmPeerRows(ctx, s->blasSide, r0, r1));
    }
    CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, gemmSide, s->joinGemm));
    return joinSideStream(ctx, s);
  }
};

// Split put / wait: the local GEMM on the main stream, then one wait for every chunk, then one GEMM per peer.
template <>
struct Schedule<Placement::SplitPutWait> {
  static int transfers(cuco_ctx_t* ctx, State* s) { return sideStreamTransfers(ctx, s, Transfers::kEventPerChunk); }
  static int gemms(cuco_ctx_t* ctx, State* s) {
    const Shape sh = shapeOf(ctx);
    CUCO_TRY(gemmLocalRows(ctx, s));
    CUCO_TRY(Transfers::wait(ctx, s, ctx->stream, 0, kChunks, s->chunkReady[kChunks - 1]));
    CUCO_TRY(gemmPeerRows(ctx, s->blas, 0, sh.mLocal));
    return joinSideStream(ctx, s);
  }
};

using Scheduled = Schedule<kPlacement>;

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = kPutCtas;
  counters.require(reqs, cuco::kMaxChunks);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, 0));
  CUCO_CUDA(ctx, cuco::windowPointers(cuco_buffer(ctx, "a")->window, ctx->nRanks, s->peerA, ctx->stream));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  CUCO_TRY(Transfers::startBarrier(ctx));
  CUCO_TRY(Scheduled::transfers(ctx, s));
  CUCO_TRY(Scheduled::gemms(ctx, s));
  CUCO_TRY(Transfers::endBarrier(ctx));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
