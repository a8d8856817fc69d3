/*************************************************************************
 * cuco_coll_chunks.cuh: sync chunk (CUCO_COLL_CHUNK_SYNC): a collective and the GEMM beside it, piece by piece.
 *
 * A part of cuco_collectives.cuh, which includes it after its knobs and the parts before it; never included
 * on its own.
 *************************************************************************/
#ifndef CUCO_COLL_CHUNKS_CUH_
#define CUCO_COLL_CHUNKS_CUH_

#ifndef CUCO_COLLECTIVES_CUH_
#error "include cuco_collectives.cuh, not its parts"
#endif

namespace cuco {

// ---- Sync chunk (CUCO_COLL_CHUNK_SYNC): a collective and the GEMM beside it, piece by piece ----
// An all-gather whose consumer reads the gathered rows: allGatherChunks<Site> cuts this rank's block into
// CUCO_CHUNKS pieces on 16-byte boundaries; once every thread of a CTA has stored its part of piece j on every rank,
// the CTA bumps flag (Site, this rank, j) there, and the consumer (cuco::gemmByGatheredRows, cuco_gemm_rows.cuh)
// waits for the flags of the pieces its next rows lie in (complete at call * CUCO_COLL_CTAS).
// A reduce-scatter whose input a GEMM produces: the GEMM (cuco::gemmSignalRows) writes the peers' blocks first and
// its own last, each in CUCO_CHUNKS pieces of rows, and after piece j of block q bumps flag (Site, this rank, j) on
// rank q (complete at call); reduceScatterChunks<Site>, forked before the GEMM, sums each piece of its block (a
// kernel per piece, behind a one-thread wait) once every rank has flagged it.
// An all-reduce whose input a GEMM produces: the GEMM (cuco::gemmSignalColumns) writes its output in CUCO_CHUNKS
// pieces of columns, so that the weights are read once, and after piece j bumps flag (Site, this rank, j) on every
// rank; allReduceChunks<Site>, forked before the GEMM, sums each piece (a kernel per piece, behind a one-thread wait)
// once every rank has flagged it.
// Flags live in the device communicator's resource buffer, only grow, and are zeroed once, before the first call.
// Without CUCO_COLL_CHUNK_SYNC the collective runs on a side stream (onSideStream), the GEMM whole beside it.
#ifndef CUCO_CHUNKS
#define CUCO_CHUNKS 1  // a derived strategy's point defines it (cuco/evolve/strategy.py)
#endif
#define CUCO_COLL_MAX_CHUNKS 16  // the most pieces: the largest of CHUNK_CHOICES (cuco/designspace/dimensions.py)
#if defined(CUCO_COLL_CE) && defined(CUCO_COLL_CHUNK_SYNC)
#error "sync chunk raises its flags from the all-gather's kernel: backend lsa only"
#endif

// The program's pieces' flags: a static, since ncclDevCommCreate fills in the handle after coll_requirements.
inline Counters& chunkFlags() {
  static Counters flags;
  return flags;
}

__host__ __device__ inline int chunkFlag(int site, int rank, int piece) {
  return (site * CUCO_COLL_MAX_RANKS + rank) * CUCO_COLL_MAX_CHUNKS + piece;
}

inline void coll_requirements(ncclDevCommRequirements* reqs) {
  hostState() = HostState();  // a new device communicator: new windows, new flags
  reqs->lsaBarrierCount = CUCO_COLL_CTAS;
#if defined(CUCO_COLL_CHUNK_SYNC)
  chunkFlags().require(reqs, CUCO_COLL_MAX_SITES * CUCO_COLL_MAX_RANKS * CUCO_COLL_MAX_CHUNKS);
#endif
}

template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    gatherPiecesKernel(ncclDevComm dc, ncclWindow_t recvWin, size_t recvOffset, const char* send, size_t bytes,
                       ncclDevResourceHandle_t flags, int site, int nPieces) {
  Barrier bar(dc);
  bar.sync();
  char* dst[CUCO_COLL_MAX_RANKS];
  const char* src[CUCO_COLL_MAX_RANKS];
  for (int j = 0; j < nPieces; j++) {
    size_t lo, hi;
    packSlice(bytes, 16, j, nPieces, &lo, &hi);
    for (int p = 0; p < dc.lsaSize; p++)
      dst[p] = (char*)ncclGetLsaPointer(recvWin, recvOffset + (size_t)dc.lsaRank * bytes + lo, p), src[p] = send + lo;
    issueCopy(dst, src, dc.lsaSize, hi - lo);
    __syncthreads();  // every thread's stores of piece j precede its flags (bumpCounter releases)
    if (threadIdx.x == 0)
      for (int p = 0; p < dc.lsaSize; p++) bumpCounter(dc, flags, p, chunkFlag(site, dc.lsaRank, j));
  }
  bar.sync();  // every piece has landed everywhere before anything after the kernel
}

template <int Site>
inline PieceSite& pieceSite() {
  static_assert(Site >= 0 && Site < CUCO_COLL_MAX_SITES, "CUCO_COLL_MAX_SITES sites of sync chunk per program");
  return hostState().sites[Site];
}

// Flags are zeroed before the first call on a device communicator, then every rank meets, and the host waits: no
// peer bumps a flag that is still to be zeroed. A GEMM's pieces flag the peers before any barrier of the collective's
// own, so without this one a rank that reaches its first piece early would have its flag wiped by a slower peer's
// zeroing, and that peer would wait for it for ever.
template <int = 0>
inline cudaError_t chunkFlagsZeroed(const cuco_ctx_t* ctx, cudaStream_t st) {
  HostState& s = hostState();
  if (s.flagsZeroed) return cudaSuccess;
  const Counters& flags = chunkFlags();
  zeroCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(*ctx->devComm, flags.handle, flags.n);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = barrier(*ctx->devComm, st);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  s.flagsZeroed = err == cudaSuccess;
  return err;
}

// The all-gather of `bytes` from send into recvOffset + rank * bytes of every rank's recvWin, on a side stream
// forked from `stream`; `recv`: the gathered buffer's start on this rank, as the consumer names it.
template <int Site>
inline cudaError_t allGatherChunks(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const void* send,
                                   size_t bytes, cudaStream_t stream, const void* recv) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;  // dst[] / src[] and the flags per rank
  const cudaError_t err = chunkFlagsZeroed(ctx, stream);
  if (err != cudaSuccess) return err;
  PieceSite& site = pieceSite<Site>();
  site.buffer = recv, site.bytes = bytes, site.calls++;
  return onSideStream<Site>(ctx, stream, [&](cudaStream_t side) {
    gatherPiecesKernel<<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, side>>>(*ctx->devComm, recvWin, recvOffset,
                                                                      (const char*)send, bytes, chunkFlags().handle,
                                                                      Site, CUCO_CHUNKS);
    return cudaGetLastError();
  });
#else
  (void)recv;
  return onSideStream<Site>(ctx, stream,
                            [&](cudaStream_t side) { return allGather(ctx, recvWin, recvOffset, send, bytes, side); });
#endif
}

// Piece j of every rank's GEMM of site `site` has been flagged to this rank. One thread spins, on its own small
// kernel: a spinning reduce-scatter of CUCO_COLL_CTAS CTAs would hold SMs the GEMM it waits for may need.
template <int = 0>
__global__ void awaitPieceKernel(ncclDevComm dc, ncclDevResourceHandle_t flags, int site, int j,
                                 unsigned long long complete) {
  for (int p = 0; p < dc.lsaSize; p++) awaitCounter(dc, flags, chunkFlag(site, p, j), complete);
}

template <int = 0>
__global__ void signalPieceKernel(ncclDevComm dc, ncclDevResourceHandle_t flags, int peer, int flag) {
  if (threadIdx.x == 0) bumpCounter(dc, flags, peer, flag);
}

template <int = 0>
__global__ void signalPieceEveryRankKernel(ncclDevComm dc, ncclDevResourceHandle_t flags, int flag) {
  if (threadIdx.x == 0)
    for (int p = 0; p < dc.lsaSize; p++) bumpCounter(dc, flags, p, flag);
}

// After piece j of block q of a GEMM that feeds a reduce-scatter of site Site: rank q may sum it.
template <int Site>
inline cudaError_t signalPiece(const cuco_ctx_t* ctx, cudaStream_t st, int q, int j) {
  signalPieceKernel<<<1, kSmallKernelThreads, 0, st>>>(*ctx->devComm, chunkFlags().handle, q,
                                                        chunkFlag(Site, ctx->rank, j));
  return cudaGetLastError();
}

// After piece j of a GEMM that feeds an all-reduce of site Site: every rank may sum its share of it.
template <int Site>
inline cudaError_t signalPieceEveryRank(const cuco_ctx_t* ctx, cudaStream_t st, int j) {
  signalPieceEveryRankKernel<<<1, kSmallKernelThreads, 0, st>>>(*ctx->devComm, chunkFlags().handle,
                                                                 chunkFlag(Site, ctx->rank, j));
  return cudaGetLastError();
}

// Where the GEMM of site Site starts: zero the flags on the first call and record the fork the reduce-scatter's
// side stream starts from, so that the reduce-scatter runs beside the GEMM.
template <int Site>
inline cudaError_t beforePieces(const cuco_ctx_t* ctx, cudaStream_t stream) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  cudaEvent_t fork;
  cudaError_t err = chunkFlagsZeroed(ctx, stream);
  if (err == cudaSuccess) err = overlapEvent<Site, 0>(&fork);
  return err == cudaSuccess ? cudaEventRecord(fork, stream) : err;
#else
  (void)ctx, (void)stream;
  return cudaSuccess;
#endif
}

// Reduce-scatter (sum) of `count` elements per rank from sendWin at sendOffset (`send` on this rank) into recv (T,
// the element type, is read from it), on a side stream. At sync chunk, where its GEMM wrote `send` in whole rows of
// every rank's block, it starts from the fork before the GEMM and sums piece by piece; otherwise it waits for
// everything before it on `stream`.
template <int Site, typename T>
inline cudaError_t reduceScatterChunks(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset, T* recv,
                                       size_t count, cudaStream_t stream, const void* send) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  const PieceSite& site = pieceSite<Site>();
  const bool byPieces = ctx->nSideStreams >= 1 && ctx->nRanks <= CUCO_COLL_MAX_RANKS && send == site.buffer &&
                        count * sizeof(T) == site.bytes && site.rowBytes > 0 && site.rowBytes % sizeof(T) == 0;
  if (byPieces) {
    cudaStream_t side = ctx->sideStreams[0];
    cudaEvent_t fork;
    cudaError_t err = overlapEvent<Site, 0>(&fork);  // recorded by beforePieces, ahead of the GEMM
    if (err == cudaSuccess) err = cudaStreamWaitEvent(side, fork, 0);
    const size_t rowElems = site.rowBytes / sizeof(T), rows = count / rowElems;
    for (int j = 0; j < CUCO_CHUNKS && err == cudaSuccess; j++) {  // piece j: rows [rows j / n, rows (j + 1) / n)
      awaitPieceKernel<<<1, kSmallKernelThreads, 0, side>>>(*ctx->devComm, chunkFlags().handle, Site, j, site.calls);
      reduceScatterKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, side>>>(
          *ctx->devComm, sendWin, sendOffset, recv, count, rows * j / CUCO_CHUNKS * rowElems,
          rows * (j + 1) / CUCO_CHUNKS * rowElems, j == 0, j == CUCO_CHUNKS - 1);
      err = cudaGetLastError();
    }
    return err;
  }
  static bool said = false;
  sayOnce(&said, "cuco::reduceScatterChunks: its GEMM did not write the input in whole rows of every rank's block: it "
                 "waits for the whole GEMM");
#endif
  (void)send;
  return onSideStream<Site>(
      ctx, stream, [&](cudaStream_t side) { return reduceScatter<T>(ctx, sendWin, sendOffset, recv, count, side); });
}

// All-reduce (sum) of `count` elements from sendWin at sendOffset (`send` on this rank; T, the element type, is
// read from it) into recvWin at recvOffset, on a side stream. At sync chunk, where its GEMM wrote `send` as whole
// lines cut by columns (gemmSignalColumns), it starts from the fork before the GEMM and sums piece by piece;
// otherwise it waits for everything before it on `stream`.
template <int Site, typename T>
inline cudaError_t allReduceChunks(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset,
                                   ncclWindow_t recvWin, size_t recvOffset, size_t count, cudaStream_t stream,
                                   const T* send) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  const PieceSite& site = pieceSite<Site>();
  const bool byPieces = ctx->nSideStreams >= 1 && ctx->nRanks <= CUCO_COLL_MAX_RANKS && send == site.buffer &&
                        site.elemBytes == (int64_t)sizeof(T) && site.cols > 0 && site.ld == site.cols &&
                        (size_t)(site.lines * site.ld) == count;
  if (byPieces) {
    cudaStream_t side = ctx->sideStreams[0];
    cudaEvent_t fork;
    cudaError_t err = overlapEvent<Site, 0>(&fork);  // recorded by beforePieces, ahead of the GEMM
    if (err == cudaSuccess) err = cudaStreamWaitEvent(side, fork, 0);
    for (int j = 0; j < CUCO_CHUNKS && err == cudaSuccess; j++) {
      size_t c0, c1;  // the GEMM's piece j (gemmSignalColumns cuts it the same way)
      packSlice(site.cols, 16 / sizeof(T), j, CUCO_CHUNKS, &c0, &c1);
      awaitPieceKernel<<<1, kSmallKernelThreads, 0, side>>>(*ctx->devComm, chunkFlags().handle, Site, j, site.calls);
      allReducePieceKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, side>>>(
          *ctx->devComm, sendWin, sendOffset, recvWin, recvOffset, site.ld, site.lines, c0, c1, j == CUCO_CHUNKS - 1);
      err = cudaGetLastError();
    }
    return err;
  }
  static bool said = false;
  sayOnce(&said, "cuco::allReduceChunks: its GEMM did not write the input as whole lines cut by columns: it waits for "
                 "the whole GEMM");
#endif
  (void)send;
  return onSideStream<Site>(ctx, stream, [&](cudaStream_t side) {
    return allReduce<T>(ctx, sendWin, sendOffset, recvWin, recvOffset, count, side);
  });
}

}  // namespace cuco

#endif  // CUCO_COLL_CHUNKS_CUH_
