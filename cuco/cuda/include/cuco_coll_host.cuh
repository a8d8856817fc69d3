/*************************************************************************
 * cuco_coll_host.cuh: the host side: symmetric allocations, the process's state (the windows' addresses for
 * the copy engine, sync chunk's sites), the launchers a program calls, the side stream of placement stream_overlap.
 *
 * A part of cuco_collectives.cuh, which includes it after its knobs and the parts before it; never included
 * on its own.
 *************************************************************************/
#ifndef CUCO_COLL_HOST_CUH_
#define CUCO_COLL_HOST_CUH_

#ifndef CUCO_COLLECTIVES_CUH_
#error "include cuco_collectives.cuh, not its parts"
#endif

namespace cuco {

// cudaMalloc's replacement for a buffer of the program's own that peers must reach: NCCL's allocator and a
// symmetric window over it (collective: every rank allocates the same size at the same point, as in
// cuco_setup). NCCL's error is printed; the caller's CUDA check sees a CUDA error code.
template <int = 0>
inline cudaError_t symmetricAlloc(const cuco_ctx_t* ctx, void** ptr, size_t bytes, ncclWindow_t* win) {
  ncclResult_t r = ncclMemAlloc(ptr, bytes);
  if (r == ncclSuccess) r = ncclCommWindowRegister(ctx->comm, *ptr, bytes, win, NCCL_WIN_COLL_SYMMETRIC);
  if (r == ncclSuccess) return cudaSuccess;
  fprintf(stderr, "cuco::symmetricAlloc of %zu bytes: %s\n", bytes, ncclGetErrorString(r));
  return cudaErrorMemoryAllocation;
}

template <int = 0>
inline cudaError_t symmetricFree(const cuco_ctx_t* ctx, void* ptr, ncclWindow_t win) {
  ncclResult_t r = ncclCommWindowDeregister(ctx->comm, win);
  if (r == ncclSuccess) r = ncclMemFree(ptr);
  if (r == ncclSuccess) return cudaSuccess;
  fprintf(stderr, "cuco::symmetricFree: %s\n", ncclGetErrorString(r));
  return cudaErrorInvalidValue;
}

// Backend ce (CUCO_COLL_CE): the copy engine moves what a collective only copies (an all-gather, an all-to-all, a
// send batch) with cudaMemcpyAsync into the peers' windows through their LSA mappings, between a barrier kernel
// before (every rank's receive buffer is free) and one after (every copy has landed); reductions stay on the SMs,
// since a copy engine cannot add. The host needs every rank's address of a window: fetched on a window's first use
// (a kernel reads them, and the stream synchronises once) and kept for the process's life.
#define CUCO_COLL_MAX_WINDOWS 16
#define CUCO_COLL_MAX_SITES 4  // collectives of one program whose consumer waits per piece (sync chunk, below)

// What a site of sync chunk keeps of its last call, for the other half of the site (an all-gather's for the GEMM
// that reads it, a GEMM's for the reduce-scatter or all-reduce of what it wrote): where the buffer starts, a rank
// block's bytes and the bytes of one of the GEMM's rows (a reduce-scatter's producer), the output's lines, their
// stride and the columns written, in elements of elemBytes (an all-reduce's producer, cut by columns), and the calls
// so far.
struct PieceSite {
  const void* buffer = nullptr;
  size_t bytes = 0;
  int64_t rowBytes = 0;
  int64_t lines = 0, ld = 0, cols = 0, elemBytes = 0;
  unsigned long long calls = 0;
};

// What the collectives keep on the host for one device communicator (the runner makes one per shape, and windows
// and flags with it): the windows' addresses for the copy engine, and sync chunk's sites. coll_requirements, called
// for every new device communicator, starts it afresh.
struct HostState {
  struct Known {
    ncclWindow_t win;
    char* at[CUCO_COLL_MAX_RANKS];
  };
  Known known[CUCO_COLL_MAX_WINDOWS];
  int nKnown = 0;
  PieceSite sites[CUCO_COLL_MAX_SITES];
  bool flagsZeroed = false;
};

inline HostState& hostState() {
  static HostState state;
  return state;
}

template <int = 0>
inline cudaError_t windowOnHost(const cuco_ctx_t* ctx, ncclWindow_t win, cudaStream_t st, char* const** at) {
  HostState& s = hostState();
  for (int i = 0; i < s.nKnown; i++)
    if (s.known[i].win == win) return *at = s.known[i].at, cudaSuccess;
  if (s.nKnown == CUCO_COLL_MAX_WINDOWS || ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;
  HostState::Known& k = s.known[s.nKnown];
  const cudaError_t err = windowPointers(win, ctx->nRanks, k.at, st);
  if (err != cudaSuccess) return err;
  k.win = win, s.nKnown++;
  *at = k.at;
  return cudaSuccess;
}

// `bytes` from src to `offset` of rank `peer`'s part of `win`, by the copy engine on `st`.
template <int = 0>
inline cudaError_t copyEngineTo(const cuco_ctx_t* ctx, ncclWindow_t win, int peer, size_t offset, const void* src,
                                size_t bytes, cudaStream_t st) {
  char* const* at = nullptr;
  const cudaError_t err = windowOnHost(ctx, win, st, &at);
  return err != cudaSuccess ? err : cudaMemcpyAsync(at[peer] + offset, src, bytes, cudaMemcpyDeviceToDevice, st);
}

template <int = 0>
inline cudaError_t copyEngineScatter(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const char* send,
                                     size_t blockBytes, size_t srcStride, cudaStream_t st) {
  cudaError_t err = barrier(*ctx->devComm, st);
  for (int i = 1; i <= ctx->nRanks && err == cudaSuccess; i++) {  // peers first, this rank's own block last
    const int p = (ctx->rank + i) % ctx->nRanks;
    err = copyEngineTo(ctx, recvWin, p, recvOffset + (size_t)ctx->rank * blockBytes, send + (size_t)p * srcStride,
                       blockBytes, st);
  }
  return err == cudaSuccess ? barrier(*ctx->devComm, st) : err;
}

template <int = 0>
inline cudaError_t scatterBlocks(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const void* send,
                                 size_t blockBytes, size_t srcStride, cudaStream_t stream) {
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;  // dst[] / src[] hold one pointer per rank
#if defined(CUCO_COLL_CE)
  return copyEngineScatter(ctx, recvWin, recvOffset, (const char*)send, blockBytes, srcStride, stream);
#else
  scatterBlocksKernel<<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, recvWin, recvOffset,
                                                                       (const char*)send, blockBytes, srcStride);
  return cudaGetLastError();
#endif
}

// All-gather: this rank's `bytes` of send land at recvOffset + rank * bytes of every rank's recv window.
template <int = 0>
inline cudaError_t allGather(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const void* send,
                             size_t bytes, cudaStream_t stream) {
  return scatterBlocks(ctx, recvWin, recvOffset, send, bytes, 0, stream);
}

// All-to-all: block p (`blockBytes`) of this rank's send lands in block `rank` of rank p's recv window.
template <int = 0>
inline cudaError_t allToAll(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const void* send,
                            size_t blockBytes, cudaStream_t stream) {
  return scatterBlocks(ctx, recvWin, recvOffset, send, blockBytes, blockBytes, stream);
}

template <typename T>
inline cudaError_t reduceScatter(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset, void* recv,
                                 size_t count, cudaStream_t stream) {
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;  // in[] / out[] hold one pointer per rank
  reduceScatterKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, sendWin, sendOffset,
                                                                          (T*)recv, count, 0, count, 1, 1);
  return cudaGetLastError();
}

// The stage of reduceScatterPush<T> for blocks of `count` elements: collective, like symmetricAlloc
// (cuco_setup on every rank). The flags are zeroed before it returns; the first call's barrier orders that
// before any peer's store, whichever stream the calls use.
template <typename T>
inline cudaError_t reduceScatterStageAlloc(const cuco_ctx_t* ctx, size_t count, ReduceScatterStage* stage) {
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;
  stage->count = count, stage->calls = 0;
  stage->slotBytes = (count * sizeof(T) + 255) / 256 * 256;
  const size_t flags = stageFlagsOffset(ctx->nRanks, stage->slotBytes);
  const size_t flagBytes = (size_t)ctx->nRanks * CUCO_COLL_CTAS * sizeof(uint64_t);
  cudaError_t err = symmetricAlloc(ctx, &stage->buf, flags + flagBytes, &stage->win);
  if (err == cudaSuccess) err = cudaMemsetAsync((char*)stage->buf + flags, 0, flagBytes, ctx->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(ctx->stream);
  return err;
}

template <int = 0>
inline cudaError_t reduceScatterStageFree(const cuco_ctx_t* ctx, ReduceScatterStage* stage) {
  return symmetricFree(ctx, stage->buf, stage->win);
}

// recv (stage->count elements) = the sum over ranks of their send blocks for this rank. nChunks: chunks per
// CTA range, each one flag per peer; more of them hide more of the additions behind the stores, but a chunk
// shorter than the flag's round trip stalls its producer. 0 picks chunks of at least kMinChunkBytes, at most
// kMaxChunks of them.
template <typename T>
inline cudaError_t reduceScatterPush(const cuco_ctx_t* ctx, const void* send, ReduceScatterStage* stage, void* recv,
                                     int nChunks, cudaStream_t stream) {
  // Each chunk costs its producer a release that waits for the chunk's stores to be acknowledged (microseconds);
  // kMinChunkBytes per CTA take longer than that to store at the link rate one CTA gets (1/CUCO_COLL_CTAS of the
  // link), so the release hides behind the stores. kMaxChunks: beyond it, the flags cost more than the overlap
  // gains (benchmarks/results/notes-collectives.md).
  constexpr size_t kMinChunkBytes = 32 << 10;
  constexpr int kMaxChunks = 16;
  const size_t rangeBytes = stage->count * sizeof(T) / CUCO_COLL_CTAS;
  if (nChunks == 0) nChunks = (int)std::clamp<size_t>(rangeBytes / kMinChunkBytes, 1, kMaxChunks);
  if (nChunks < 1) return cudaErrorInvalidValue;  // the stage's allocation checked nRanks
  reduceScatterPushKernel<T><<<2 * CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, (const T*)send,
                                                                                  *stage, (T*)recv, nChunks);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) stage->calls++;  // the flags this launch raises
  return err;
}

template <typename T>
inline cudaError_t allReduce(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin,
                             size_t recvOffset, size_t count, cudaStream_t stream) {
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;  // in[] / out[] hold one pointer per rank
  allReduceKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, sendWin, sendOffset, recvWin,
                                                                      recvOffset, count);
  return cudaGetLastError();
}

template <int = 0>
inline cudaError_t sendBatch(const cuco_ctx_t* ctx, const SendBatch& batch, cudaStream_t stream) {
  for (int i = 0; i < batch.n; i++)
    if (batch.peer[i] < 0 || batch.peer[i] >= ctx->nRanks) return cudaErrorInvalidValue;
#if defined(CUCO_COLL_CE)
  cudaError_t err = barrier(*ctx->devComm, stream);
  for (int i = 0; i < batch.n && err == cudaSuccess; i++)
    err = copyEngineTo(ctx, batch.recvWin[i], batch.peer[i], batch.recvOffset[i], batch.send[i], batch.bytes[i],
                       stream);
  return err == cudaSuccess ? barrier(*ctx->devComm, stream) : err;
#else
  sendKernel<<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, batch);
  return cudaGetLastError();
#endif
}

template <int = 0>
inline cudaError_t allToAllv(const cuco_ctx_t* ctx, ncclWindow_t countsWin, size_t countsOffset, const void* send,
                             ncclWindow_t recvWin, size_t recvOffset, size_t elemBytes, size_t recvCapacity,
                             bool zeroTail, cudaStream_t stream) {
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) return cudaErrorInvalidValue;  // per-rank offsets in shared memory
  allToAllvKernel<<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(*ctx->devComm, countsWin, countsOffset,
                                                                   (const char*)send, recvWin, recvOffset, elemBytes,
                                                                   recvCapacity, zeroTail);
  return cudaGetLastError();
}

// Placement stream_overlap of a rewritten collective: `issue` runs on ctx->sideStreams[0] behind everything queued
// on `from` so far (an event), so the kernels that follow on `from` and touch none of its buffers run beside it;
// joinSideStream makes `to` wait for it where its buffers are next used. `Site` numbers the collective: its own
// pair of events. Without CUCO_COLL_SIDE_STREAM both are the plain call on `from`.
template <int Site, int End>
inline cudaError_t overlapEvent(cudaEvent_t* ev) {
  // Created on first use and kept for the process's life (the candidate's process ends with its evaluation): a
  // record and a wait per run, never a create.
  static cudaEvent_t event = nullptr;
  cudaError_t err = event ? cudaSuccess : cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  *ev = event;
  return err;
}

template <int Site, typename Issue>
inline cudaError_t onSideStream(const cuco_ctx_t* ctx, cudaStream_t from, Issue issue) {
#if defined(CUCO_COLL_SIDE_STREAM)
  if (ctx->nSideStreams < 1) return issue(from);
  cudaEvent_t fork;
  cudaError_t err = overlapEvent<Site, 0>(&fork);
  if (err == cudaSuccess) err = cudaEventRecord(fork, from);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(ctx->sideStreams[0], fork, 0);
  return err == cudaSuccess ? issue(ctx->sideStreams[0]) : err;
#else
  (void)ctx;
  return issue(from);
#endif
}

template <int Site>
inline cudaError_t joinSideStream(const cuco_ctx_t* ctx, cudaStream_t to) {
#if defined(CUCO_COLL_SIDE_STREAM)
  if (ctx->nSideStreams < 1) return cudaSuccess;
  cudaEvent_t join;
  cudaError_t err = overlapEvent<Site, 1>(&join);
  if (err == cudaSuccess) err = cudaEventRecord(join, ctx->sideStreams[0]);
  return err == cudaSuccess ? cudaStreamWaitEvent(to, join, 0) : err;
#else
  (void)ctx, (void)to;
  return cudaSuccess;
#endif
}

}  // namespace cuco

#endif  // CUCO_COLL_HOST_CUH_
