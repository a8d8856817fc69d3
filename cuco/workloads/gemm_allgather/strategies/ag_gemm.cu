/*************************************************************************
 * GEMM + AllGather strategy kernel: one program for many design points, chosen at compile time.
 *
 * The directive proposer prepends the design point as macros (cuco/evolve/strategy.py):
 *   backend    CUCO_BACKEND_LSA   push stores through NCCL device-API windows (ncclGetLsaPointer)
 *              CUCO_BACKEND_CE    copy engine: cudaMemcpyAsync pulls peers' shards (LSA-mapped)
 *   placement  CUCO_PLACEMENT_DEFERRED        all-gather, then one GEMM, on ctx->stream
 *              CUCO_PLACEMENT_STREAM_OVERLAP  transfers on side stream 0; the local rows' GEMM on the main
 *                                             stream; each chunk's GEMM on side stream 1 once that chunk
 *                                             has arrived, so it fills SMs as the local GEMM's tail frees them
 *              CUCO_PLACEMENT_SPLIT_PUT_WAIT  transfers on a side stream; local GEMM; one wait; one GEMM
 *   sync       CUCO_SYNC_GLOBAL   LSA barrier across all ranks (CE: one event after all copies, except
 *                                 under stream_overlap, which waits per chunk with either scope)
 *              CUCO_SYNC_CHUNK    a counter per chunk, bumped on the receiver by each producer (CE: an
 *                                 event per chunk)
 *   issuer     CUCO_ISSUER_CTA / CUCO_ISSUER_WARP: the unit that copies a contiguous slice and signals it
 *   chunks     CUCO_CHUNKS: pieces each shard is sent in (1..16)
 *
 * Invariants: the deferred placement fills this rank's own slot of a_gathered too (its one GEMM reads all
 * of it); the overlap placements leave it alone (the local GEMM reads a). A start barrier keeps a rank
 * from writing into a peer's a_gathered before that peer's previous GEMM is done. Chunk counters only grow
 * (epoch * signals per chunk), so they are zeroed once, in setup.
 * Small kernels that must run while a GEMM is running (CE barriers) go on the main stream before the fork
 * and after the join: cuBLAS's persistent GEMM kernels hold every SM, so a kernel queued on a side stream
 * behind them would not start until the GEMM ends.
 * Requires: a and a_gathered symmetric; all ranks in one LSA team; two side streams.
 *************************************************************************/
#include "cuco.h"
#include "cuco_gemm.h"

#if defined(CUCO_BACKEND_LSA) + defined(CUCO_BACKEND_CE) != 1
#error "define exactly one backend: CUCO_BACKEND_LSA or CUCO_BACKEND_CE"
#endif
#if defined(CUCO_PLACEMENT_DEFERRED) + defined(CUCO_PLACEMENT_STREAM_OVERLAP) + defined(CUCO_PLACEMENT_SPLIT_PUT_WAIT) != 1
#error "define exactly one placement"
#endif
#if defined(CUCO_SYNC_GLOBAL) + defined(CUCO_SYNC_CHUNK) != 1
#error "define exactly one sync scope"
#endif
#if defined(CUCO_ISSUER_CTA) + defined(CUCO_ISSUER_WARP) != 1
#error "define exactly one issuer"
#endif
#if !defined(CUCO_CHUNKS) || CUCO_CHUNKS < 1 || CUCO_CHUNKS > 16
#error "CUCO_CHUNKS must be 1..16"
#endif

// Put kernel shape. PUT_CTAS must equal the device communicator's lsaBarrierCount (one barrier per CTA).
#define PUT_CTAS 32
#define PUT_THREADS 512
#define WARP_SIZE 32
#define MAX_RANKS 8
#if defined(CUCO_ISSUER_CTA)
#define SIGNALS_PER_PRODUCER PUT_CTAS  // one signal per CTA per chunk
#else
#define SIGNALS_PER_PRODUCER (PUT_CTAS * PUT_THREADS / WARP_SIZE)  // one per warp per chunk
#endif

// Chunk counters live in the device communicator's resource buffer (not a workload buffer: the runner
// poisons those before every trial). Filled in during ncclDevCommCreate.
static ncclDevResourceRequirements flagsReq;
static ncclDevResourceHandle_t flagsHandle;

struct State {
  cublasHandle_t blas, blasSide;  // one per stream: a handle's workspace must not be shared by concurrent GEMMs
  cudaEvent_t fork, join, joinGemm, chunkReady[CUCO_CHUNKS];
  unsigned long long epoch;  // runs so far: chunk j is complete when its counter reaches epoch * signals
  char* peerA[MAX_RANKS];    // CE: every rank's shard of A, mapped into this rank's address space
};

// Row range [r0, r1) of chunk j of a shard of mLocal rows.
__host__ __device__ static inline void chunkRows(int64_t mLocal, int j, int64_t* r0, int64_t* r1) {
  *r0 = mLocal * j / CUCO_CHUNKS;
  *r1 = mLocal * (j + 1) / CUCO_CHUNKS;
}

// Copy bytes [lo, hi) of src to dst with 16-byte accesses where both are aligned, by `nWorkers` workers of
// `workerThreads` threads each; worker `w`, thread `t` within it.
__device__ __attribute__((unused)) static inline void copySlice(char* dst, const char* src, size_t lo, size_t hi, int w, int nWorkers,
                                        int t, int workerThreads) {
  const size_t n = hi - lo, per = (n + nWorkers - 1) / nWorkers;
  size_t b = lo + per * w, e = b + per < hi ? b + per : hi;
  if (b >= e) return;
  size_t vb = (b + 15) & ~(size_t)15, ve = e & ~(size_t)15;
  if (vb > ve) vb = ve = e;
  for (size_t i = b + t; i < vb; i += workerThreads) dst[i] = src[i];
  for (size_t i = vb + 16 * t; i < ve; i += 16 * (size_t)workerThreads) *(uint4*)(dst + i) = *(const uint4*)(src + i);
  for (size_t i = ve + t; i < e; i += workerThreads) dst[i] = src[i];
}

__global__ void zeroFlagsKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle) {
  unsigned long long* flags = (unsigned long long*)ncclGetResourceBufferLocalPointer(devComm, flagsHandle);
  if (threadIdx.x < CUCO_CHUNKS) flags[threadIdx.x] = 0;
  __threadfence_system();
}

__global__ void barrierKernel(ncclDevComm devComm) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, blockIdx.x};
  // acq_rel: what each rank did before is visible to every rank after.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

__global__ void peerPointersKernel(ncclWindow_t win, char** out, int n) {
  for (int p = threadIdx.x; p < n; p += blockDim.x) out[p] = (char*)ncclGetLsaPointer(win, 0, p);
}

#if defined(CUCO_BACKEND_LSA)
// Push chunks [c0, c1) of this rank's shard into slot `rank` of every rank's a_gathered.
__global__ void __launch_bounds__(PUT_THREADS) putKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle,
                                                         ncclWindow_t gatherWin,
                                                         const char* shard, int64_t mLocal, size_t rowBytes,
                                                         size_t slotOffset, int c0, int c1, int startBarrier,
                                                         int endBarrier, int skipSelf) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, blockIdx.x};
  // acq_rel: every peer's previous GEMM over its a_gathered is done before our stores land there.
  if (startBarrier) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
#if defined(CUCO_ISSUER_CTA)
  const int w = blockIdx.x, nWorkers = gridDim.x, t = threadIdx.x, workerThreads = blockDim.x;
#else
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE, nWorkers = gridDim.x * blockDim.x / WARP_SIZE;
  const int t = threadIdx.x % WARP_SIZE, workerThreads = WARP_SIZE;
#endif
  for (int j = c0; j < c1; j++) {
    int64_t r0, r1;
    chunkRows(mLocal, j, &r0, &r1);
    for (int peer = 0; peer < devComm.lsaSize; peer++) {
      if (skipSelf && peer == devComm.lsaRank) continue;
      char* dst = (char*)ncclGetLsaPointer(gatherWin, slotOffset, peer);
      copySlice(dst, shard, r0 * rowBytes, r1 * rowBytes, w, nWorkers, t, workerThreads);
    }
#if defined(CUCO_SYNC_CHUNK)
#if defined(CUCO_ISSUER_CTA)
    __syncthreads();
#else
    __syncwarp();
#endif
    if (t == 0) {
      // Release at system scope: this worker's stores (and, through the barrier above, its threads') are
      // visible on every peer before the peer sees the counter move.
      __threadfence_system();
      for (int peer = 0; peer < devComm.lsaSize; peer++) {
        if (peer == devComm.lsaRank) continue;
        unsigned long long* f = (unsigned long long*)ncclGetResourceBufferLsaPointer(devComm, flagsHandle, peer);
        atomicAdd_system(f + j, 1ull);
      }
    }
#endif
  }
  // acq_rel: our stores are visible to the peers, theirs to us, before anything after this kernel.
  if (endBarrier) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

#if defined(CUCO_SYNC_CHUNK)
// Waits until every peer has signalled chunks [c0, c1) of this run.
__global__ void waitKernel(ncclDevComm devComm, ncclDevResourceHandle_t flagsHandle, int c0, int c1,
                           unsigned long long target) {
  unsigned long long* flags = (unsigned long long*)ncclGetResourceBufferLocalPointer(devComm, flagsHandle);
  if (threadIdx.x == 0) {
    for (int j = c0; j < c1; j++) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> f(flags[j]);
      // Acquire: the peers' stores that preceded their signals are visible to the GEMM that follows.
      while (f.load(cuda::memory_order_acquire) < target) {
      }
    }
  }
}
#endif
#endif  // CUCO_BACKEND_LSA

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = PUT_CTAS;
  memset(&flagsReq, 0, sizeof(flagsReq));
  flagsReq.bufferSize = 16 * sizeof(unsigned long long);
  flagsReq.bufferAlign = 128;  // a counter array on its own cache lines
  flagsReq.outBufferHandle = &flagsHandle;
  reqs->resourceRequirementsList = &flagsReq;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (ctx->nSideStreams < 2) CUCO_FAIL(ctx, "needs two side streams");
  if (ctx->nRanks > MAX_RANKS) CUCO_FAIL(ctx, "at most %d ranks", MAX_RANKS);
  if (!ctx->hasDevComm || ctx->devComm.lsaSize != ctx->nRanks)
    CUCO_FAIL(ctx, "all ranks must share one LSA team (one NVLink domain)");
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
  if (!a->symmetric || !aFull->symmetric) CUCO_FAIL(ctx, "a and a_gathered must be symmetric");
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  CUCO_CUBLAS(ctx, cublasCreate(&s->blasSide));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blasSide, ctx->sideStreams[1]));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
  CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->joinGemm, cudaEventDisableTiming));
  for (int j = 0; j < CUCO_CHUNKS; j++) CUCO_CUDA(ctx, cudaEventCreateWithFlags(&s->chunkReady[j], cudaEventDisableTiming));
  char** dPtrs;
  CUCO_CUDA(ctx, cudaMalloc(&dPtrs, MAX_RANKS * sizeof(char*)));
  peerPointersKernel<<<1, 32, 0, ctx->stream>>>(a->window, dPtrs, ctx->nRanks);
  CUCO_CUDA(ctx, cudaGetLastError());
  CUCO_CUDA(ctx, cudaMemcpyAsync(s->peerA, dPtrs, ctx->nRanks * sizeof(char*), cudaMemcpyDeviceToHost, ctx->stream));
  zeroFlagsKernel<<<1, 32, 0, ctx->stream>>>(ctx->devComm, flagsHandle);
  CUCO_CUDA(ctx, cudaGetLastError());
  barrierKernel<<<1, 32, 0, ctx->stream>>>(ctx->devComm);  // every rank's counters are zero before any signal
  CUCO_CUDA(ctx, cudaGetLastError());
  CUCO_CUDA(ctx, cudaStreamSynchronize(ctx->stream));
  CUCO_CUDA(ctx, cudaFree(dPtrs));
  return 0;
}

#if defined(CUCO_BACKEND_CE)
// Pulling needs a barrier before (peers' shards are ready) and after (they must not change while read).
static int ceBarrier(cuco_ctx_t* ctx, cudaStream_t st) {
  barrierKernel<<<1, 32, 0, st>>>(ctx->devComm);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}
#endif

// Enqueue the transfer of chunks [c0, c1) on `st`. `first`: the run's first transfer (LSA start barrier);
// `skipSelf`: leave this rank's own slot of a_gathered alone.
static int transfer(cuco_ctx_t* ctx, State* s, cudaStream_t st, int c0, int c1, bool first, bool skipSelf) {
  const int64_t mLocal = cuco_param(ctx, "M") / ctx->nRanks;
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
  const size_t rowBytes = (size_t)cuco_param(ctx, "K") * 2, shardBytes = a->bytes;
#if defined(CUCO_BACKEND_LSA)
  (void)s;
#if defined(CUCO_SYNC_GLOBAL)
  const int endBarrier = 1;
#else
  const int endBarrier = 0;
#endif
  putKernel<<<PUT_CTAS, PUT_THREADS, 0, st>>>(ctx->devComm, flagsHandle, aFull->window, (const char*)a->ptr, mLocal, rowBytes,
                                              (size_t)ctx->rank * shardBytes, c0, c1, first, endBarrier, skipSelf);
  CUCO_CUDA(ctx, cudaGetLastError());
#else
  (void)first;
  for (int j = c0; j < c1; j++) {
    int64_t r0, r1;
    chunkRows(mLocal, j, &r0, &r1);
    if (r1 == r0) continue;
    for (int p = 0; p < ctx->nRanks; p++) {
      if (skipSelf && p == ctx->rank) continue;
      char* dst = (char*)aFull->ptr + (size_t)p * shardBytes + r0 * rowBytes;
      const char* src = (p == ctx->rank ? (const char*)a->ptr : s->peerA[p]) + r0 * rowBytes;
      CUCO_CUDA(ctx, cudaMemcpyAsync(dst, src, (r1 - r0) * rowBytes, cudaMemcpyDeviceToDevice, st));
    }
  }
#endif
  return 0;
}

// Make `st` wait until chunks [c0, c1) have arrived; `ev` is the event recorded after their transfer.
__attribute__((unused)) static int waitFor(cuco_ctx_t* ctx, State* s, cudaStream_t st, int c0, int c1, cudaEvent_t ev) {
#if defined(CUCO_BACKEND_LSA) && defined(CUCO_SYNC_CHUNK)
  (void)ev;
  const unsigned long long target = s->epoch * (unsigned long long)SIGNALS_PER_PRODUCER * (ctx->nRanks - 1);
  waitKernel<<<1, 32, 0, st>>>(ctx->devComm, flagsHandle, c0, c1, target);
  CUCO_CUDA(ctx, cudaGetLastError());
#else
  CUCO_CUDA(ctx, cudaStreamWaitEvent(st, ev, 0));
#endif
  return 0;
}

#define CHECK(call) \
  do {              \
    if (call) return 1; \
  } while (0)

// GEMM over rows [r0, r1) of every peer's shard (not this rank's own), through `blas`.
__attribute__((unused)) static int gemmPeerRows(cuco_ctx_t* ctx, cublasHandle_t blas, int64_t r0, int64_t r1) {
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int64_t mLocal = M / ctx->nRanks, nLocal = N / ctx->nRanks;
  const char* aFull = (const char*)cuco_buffer(ctx, "a_gathered")->ptr;
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
  if (r1 == r0) return 0;
  for (int p = 0; p < ctx->nRanks; p++) {
    if (p == ctx->rank) continue;
    const int64_t row = p * mLocal + r0;
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(blas, aFull + row * K * 2, cuco_buffer(ctx, "b")->ptr, c + row * nLocal * 2,
                                    r1 - r0, K, nLocal));
  }
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  s->epoch++;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int64_t nLocal = N / ctx->nRanks;
  const void* b = cuco_buffer(ctx, "b")->ptr;
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
#if defined(CUCO_BACKEND_CE)
  CHECK(ceBarrier(ctx, ctx->stream));
#endif
#if defined(CUCO_PLACEMENT_DEFERRED)
  CHECK(transfer(ctx, s, ctx->stream, 0, CUCO_CHUNKS, true, false));
#if defined(CUCO_BACKEND_LSA) && defined(CUCO_SYNC_CHUNK)
  CHECK(waitFor(ctx, s, ctx->stream, 0, CUCO_CHUNKS, NULL));
#endif
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a_gathered")->ptr, b, c, M, K, nLocal));
#else
  const int64_t mLocal = M / ctx->nRanks;
  cudaStream_t comm = ctx->sideStreams[0];
  CUCO_CUDA(ctx, cudaEventRecord(s->fork, ctx->stream));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(comm, s->fork, 0));
#if (defined(CUCO_PLACEMENT_STREAM_OVERLAP) && !defined(CUCO_SYNC_CHUNK)) || (defined(CUCO_BACKEND_CE) && defined(CUCO_SYNC_CHUNK))
  // One transfer per chunk, each followed by its event (LSA: each ends in a barrier).
  for (int j = 0; j < CUCO_CHUNKS; j++) {
    CHECK(transfer(ctx, s, comm, j, j + 1, j == 0, true));
    CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], comm));
  }
#else
  CHECK(transfer(ctx, s, comm, 0, CUCO_CHUNKS, true, true));
  CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[CUCO_CHUNKS - 1], comm));
#endif
  // This rank's own rows need no communication.
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, b, c + ctx->rank * mLocal * nLocal * 2,
                                  mLocal, K, nLocal));
#if defined(CUCO_PLACEMENT_STREAM_OVERLAP)
  cudaStream_t gemmSide = ctx->sideStreams[1];
  CUCO_CUDA(ctx, cudaStreamWaitEvent(gemmSide, s->fork, 0));
  for (int j = 0; j < CUCO_CHUNKS; j++) {
    int64_t r0, r1;
    chunkRows(mLocal, j, &r0, &r1);
#if defined(CUCO_BACKEND_LSA) && defined(CUCO_SYNC_CHUNK)
    CHECK(waitFor(ctx, s, gemmSide, j, j + 1, NULL));
#else
    CHECK(waitFor(ctx, s, gemmSide, j, j + 1, s->chunkReady[j]));
#endif
    CHECK(gemmPeerRows(ctx, s->blasSide, r0, r1));
  }
  CUCO_CUDA(ctx, cudaEventRecord(s->joinGemm, gemmSide));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->stream, s->joinGemm, 0));
#else  // split put / wait: one wait for everything, one GEMM per peer
  CHECK(waitFor(ctx, s, ctx->stream, 0, CUCO_CHUNKS, s->chunkReady[CUCO_CHUNKS - 1]));
  CHECK(gemmPeerRows(ctx, s->blas, 0, mLocal));
#endif
  CUCO_CUDA(ctx, cudaEventRecord(s->join, comm));
  CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->stream, s->join, 0));
#endif
#if defined(CUCO_BACKEND_CE)
  CHECK(ceBarrier(ctx, ctx->stream));
#endif
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  CUCO_CUBLAS(ctx, cublasDestroy(s->blasSide));
  CUCO_CUDA(ctx, cudaEventDestroy(s->fork));
  CUCO_CUDA(ctx, cudaEventDestroy(s->join));
  CUCO_CUDA(ctx, cudaEventDestroy(s->joinGemm));
  for (int j = 0; j < CUCO_CHUNKS; j++) CUCO_CUDA(ctx, cudaEventDestroy(s->chunkReady[j]));
  delete s;
  ctx->state = NULL;
  return 0;
}
