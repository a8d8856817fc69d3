/*************************************************************************
 * cuco_collectives.cuh: cuco's device-side collectives over NCCL 2.28 LSA windows.
 *
 * The conservative design point of the fast path: one kernel per collective (placement deferred),
 * CUCO_COLL_CTAS CTAs each owning one LSA barrier (sync global, issuer cta), the whole buffer at once;
 * reduceScatterPush is the same collective at another point (sync chunk: producer CTAs raise a flag per
 * chunk on the peer, consumer CTAs wait for it). Every kernel starts with a barrier (no rank writes into,
 * or reads from, a peer buffer that peer may still be using) and ends with one (every store has landed
 * before anything after the kernel runs), but reduceScatterPush, whose consumers end only once every
 * peer's stores to them have landed. pushSlice is the all-gather's copy for a caller that cuts the transfer
 * itself (into chunks, among CTAs or warps) and signals each piece its own way, as the GEMM+AllGather strategy
 * kernel does.
 * Knobs a program may define before the include (cuco's derived strategies do, cuco/fastpath/knobs.py):
 * CUCO_COLL_CTAS, the CTAs of every collective kernel; CUCO_COLL_ISSUER_WARP, under which each warp of the
 * grid moves (or reduces) a contiguous slice of its own instead of the grid's threads striding over the whole
 * buffer together; CUCO_COLL_SIDE_STREAM, under which onSideStream / joinSideStream move a collective to
 * ctx->sideStreams[0] (placement stream_overlap; without it they are the plain call); CUCO_COLL_CE, under which
 * the copy engine moves what is only copied (backend ce); and CUCO_COLL_CHUNK_SYNC with CUCO_CHUNKS, under which
 * allGatherChunks raises a flag per piece for a consumer that reads piece by piece (sync chunk).
 * Reductions add in fixed rank order in fp32, so results are bitwise deterministic. Data moves by stores
 * into peers' windows (all-gather, all-to-all(v), send, reduceScatterPush), or loads from them (reduce-scatter,
 * all-reduce).
 *
 * Requires: the device communicator has CUCO_COLL_CTAS LSA barriers (cuco::coll_requirements); the
 * windows are symmetric buffers of the workload; all ranks in one LSA team.
 *************************************************************************/
#ifndef CUCO_COLLECTIVES_CUH_
#define CUCO_COLLECTIVES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl_device.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "cuco.h"

// One LSA barrier per CTA, so this is also the lsaBarrierCount the device communicator needs. 64: the count that
// moved data fastest over NVLink in the collectives benchmark (benchmarks/results/notes-collectives.md). A program
// may define it before the include (the collectives benchmark compares counts).
#ifndef CUCO_COLL_CTAS
#define CUCO_COLL_CTAS 64
#endif
#define CUCO_COLL_THREADS 512
#define CUCO_COLL_MAX_RANKS 8
// 16-byte packs each thread has in flight per rank before it adds or stores: enough bytes outstanding to
// cover the latency of loads over NVLink (about a microsecond) at link rate with CUCO_COLL_CTAS x
// CUCO_COLL_THREADS. Like CUCO_COLL_CTAS, a program may define it first.
#ifndef CUCO_COLL_UNROLL
#define CUCO_COLL_UNROLL 4
#endif

namespace cuco {

// Every kernel, and every host function that launches one, is a template (of an unused `int = 0`): a program
// compiles the kernels it launches, not all of them (unused, they were a third of a small program's build).

// A line said once a process at a call site (`said`: that site's own flag): a fallback that changes no result, so
// that a test can tell a program that ran as designed from one that fell back.
inline void sayOnce(bool* said, const char* line) {
  if (*said) return;
  *said = true;
  fprintf(stderr, "%s\n", line);
}

// Element helpers and the copy and reduction loops are __host__ too: tests/test_collectives_host.py runs
// them on the CPU, one emulated thread after another, to check every alignment and tail path.
__host__ __device__ inline float toFloat(float v) { return v; }
__host__ __device__ inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ inline float toFloat(__half v) { return __half2float(v); }
template <typename T> __host__ __device__ inline T fromFloat(float v);
template <> __host__ __device__ inline float fromFloat<float>(float v) { return v; }
template <> __host__ __device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __host__ __device__ inline __half fromFloat<__half>(float v) { return __float2half(v); }

// This thread's index in the grid, and the grid's size.
__device__ inline size_t gridThread() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline size_t gridThreads() { return (size_t)gridDim.x * blockDim.x; }

// n bytes from src[d] to dst[d] for every pair d < nPairs, in accesses of V, by thread `tid` of `nThreads`.
// The pairs advance together, so the local copy of an all-gather or all-to-all runs beside the remote ones
// instead of after them; pairs that share a source (an all-gather) load it once. Every dst[d] and src[d] is
// aligned like dst[0] modulo sizeof(V): bytes up to dst[0]'s first V boundary, then V words with
// CUCO_COLL_UNROLL loads in flight before their stores, then the tail.
template <typename V>
__host__ __device__ inline void copyAs(char* const* dst, const char* const* src, int nPairs, size_t n, size_t tid,
                                       size_t nThreads) {
  size_t head = (sizeof(V) - (uintptr_t)dst[0] % sizeof(V)) % sizeof(V);
  if (head > n) head = n;
  for (size_t i = tid; i < head; i += nThreads)
    for (int d = 0; d < nPairs; d++) dst[d][i] = src[d][i];
  const size_t nVec = (n - head) / sizeof(V);
  for (size_t base = tid; base < nVec; base += nThreads * CUCO_COLL_UNROLL) {
    V v[CUCO_COLL_UNROLL];
    for (int d = 0; d < nPairs; d++) {
      if (d == 0 || src[d] != src[d - 1]) {
        const V* in = (const V*)(src[d] + head);
#pragma unroll
        for (int u = 0; u < CUCO_COLL_UNROLL; u++)
          if (base + u * nThreads < nVec) v[u] = in[base + u * nThreads];
      }
      V* out = (V*)(dst[d] + head);
#pragma unroll
      for (int u = 0; u < CUCO_COLL_UNROLL; u++)
        if (base + u * nThreads < nVec) out[base + u * nThreads] = v[u];
    }
  }
  for (size_t i = head + nVec * sizeof(V) + tid; i < n; i += nThreads)
    for (int d = 0; d < nPairs; d++) dst[d][i] = src[d][i];
}

// The same with the widest access (16 bytes down to 1) that every pointer can share.
__host__ __device__ inline void copyBytes(char* const* dst, const char* const* src, int nPairs, size_t n, size_t tid,
                                          size_t nThreads) {
  uintptr_t rel = 0;  // low bits set where two of the pointers disagree
  for (int d = 0; d < nPairs; d++) rel |= ((uintptr_t)dst[d] - (uintptr_t)src[d]) | ((uintptr_t)dst[d] - (uintptr_t)dst[0]);
  if (rel % 16 == 0) copyAs<uint4>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 8 == 0) copyAs<uint2>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 4 == 0) copyAs<uint32_t>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 2 == 0) copyAs<uint16_t>(dst, src, nPairs, n, tid, nThreads);
  else copyAs<char>(dst, src, nPairs, n, tid, nThreads);
}

// The grid's part of a copy: every thread of the grid strides over the n bytes, or, under CUCO_COLL_ISSUER_WARP,
// each warp copies a contiguous slice (a multiple of 16 bytes, so every slice keeps the pointers' alignment).
__device__ inline void issueCopy(char* const* dst, const char* const* src, int nPairs, size_t n) {
#if defined(CUCO_COLL_ISSUER_WARP)
  constexpr size_t kWarp = 32;
  const size_t warps = gridThreads() / kWarp, w = gridThread() / kWarp;
  const size_t per = ((n + warps - 1) / warps + 15) / 16 * 16;
  const size_t b = per * w < n ? per * w : n, e = b + per < n ? b + per : n;
  if (b >= e) return;
  char* to[CUCO_COLL_MAX_RANKS];
  const char* from[CUCO_COLL_MAX_RANKS];
  for (int d = 0; d < nPairs; d++) to[d] = dst[d] + b, from[d] = src[d] + b;
  copyBytes(to, from, nPairs, e - b, threadIdx.x % kWarp, kWarp);
#else
  copyBytes(dst, src, nPairs, n, gridThread(), gridThreads());
#endif
}

// One pair, by the grid (issueCopy).
__device__ inline void copyBytes(char* dst, const char* src, size_t n) { issueCopy(&dst, &src, 1, n); }

// One worker's piece of an all-gather that its caller cuts itself: bytes [lo, hi) of `src` are split evenly among
// `nWorkers` workers (a CTA each, or a warp each...), and worker `w` stores its part at the same offsets of every
// dst[d], d < nDst (nDst <= CUCO_COLL_MAX_RANKS), with its `workerThreads` threads, this one `t`. Each worker's
// part is contiguous, so it can signal that part alone once its threads are done.
__host__ __device__ inline void pushSlice(char* const* dst, int nDst, const char* src, size_t lo, size_t hi, size_t w,
                                          size_t nWorkers, size_t t, size_t workerThreads) {
  const size_t per = (hi - lo + nWorkers - 1) / nWorkers;
  const size_t b = lo + per * w, e = b + per < hi ? b + per : hi;
  if (b >= e) return;
  char* to[CUCO_COLL_MAX_RANKS];
  const char* from[CUCO_COLL_MAX_RANKS];
  for (int d = 0; d < nDst; d++) to[d] = dst[d] + b, from[d] = src + b;
  copyBytes(to, from, nDst, e - b, t, workerThreads);
}

struct Barrier {
  ncclLsaBarrierSession<ncclCoopCta> session;
  __device__ Barrier(const ncclDevComm& dc)
      : session(ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x) {}
  // acq_rel: what every rank did before is visible to every rank after.
  __device__ void sync() { session.sync(ncclCoopCta(), cuda::memory_order_acq_rel); }
};

constexpr int kWarpSize = 32;
// Barrier, wait and setup kernels run as one warp: their work is a few words, or one thread's spin.
constexpr int kSmallKernelThreads = kWarpSize;

// The calling CTA meets CTA blockIdx.x of every rank at LSA barrier blockIdx.x (the device communicator needs
// as many barriers as the kernel has CTAs). acq_rel: what each rank did before is visible to every rank after.
__device__ inline void lsaBarrier(const ncclDevComm& devComm) { Barrier(devComm).sync(); }

template <int = 0>
__global__ void barrierKernel(ncclDevComm devComm) { lsaBarrier(devComm); }

// Every rank meets on `st` (one CTA: LSA barrier 0). A kernel that must run while a GEMM holds the SMs goes on a
// stream the GEMM is not on, or on SMs kept from it.
template <int = 0>
inline cudaError_t barrier(const ncclDevComm& devComm, cudaStream_t st) {
  barrierKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm);
  return cudaGetLastError();
}

using ChunkCounter = unsigned long long;
// A counter array starts on its own 128-byte cache line, apart from the barriers' state.
constexpr size_t kCounterAlign = 128;

template <int = 0>
__global__ void zeroCountersKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int n) {
  ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLocalPointer(devComm, handle);
  for (int i = threadIdx.x; i < n; i += blockDim.x) c[i] = 0;
  __threadfence_system();
}

template <int = 0>
__global__ void windowPointersKernel(ncclWindow_t win, char** out, int n) {
  for (int p = threadIdx.x; p < n; p += blockDim.x) out[p] = (char*)ncclGetLsaPointer(win, 0, p);
}

// Add one to counter i on rank `peer`. Release at system scope: every store this thread observed before,
// the earlier kernels' on its stream included, is visible on the peer before the peer sees the counter move.
__device__ inline void bumpCounter(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int peer, int i) {
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
  ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLsaPointer(devComm, handle, peer);
  cuda::atomic_ref<ChunkCounter, cuda::thread_scope_system>(c[i]).fetch_add(1, cuda::memory_order_relaxed);
}

// Thread 0 spins until each of this rank's counters [i0, i1) reaches `target`; the CTA's threads meet behind it.
__device__ inline void awaitCounters(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int i0, int i1,
                                     unsigned long long target) {
  if (threadIdx.x == 0) {
    ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLocalPointer(devComm, handle);
    for (int i = i0; i < i1; i++) {
      cuda::atomic_ref<ChunkCounter, cuda::thread_scope_system> f(c[i]);
      // Acquire: the peers' stores that preceded their bumps are visible to the loads after this wait.
      while (f.load(cuda::memory_order_acquire) < target) {
      }
    }
  }
  __syncthreads();
}

__device__ inline void awaitCounter(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int i,
                                    unsigned long long target) {
  awaitCounters(devComm, handle, i, i + 1, target);
}

// A stream that must not go on before counters [i0, i1) reach `target` (a copy engine, a cuBLAS call) waits
// behind it.
template <int = 0>
__global__ void awaitCountersKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int i0, int i1,
                                    unsigned long long target) {
  awaitCounters(devComm, handle, i0, i1, target);
}

// Zero this rank's first `n` counters, then meet every rank (so no rank bumps a counter a peer has yet to zero),
// and wait for both: a strategy's setup, once.
template <int = 0>
inline cudaError_t resetCounters(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int n, cudaStream_t st) {
  zeroCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm, handle, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = barrier(devComm, st);
  return err != cudaSuccess ? err : cudaStreamSynchronize(st);
}

// A strategy's counters. Kept as a file-scope static: ncclDevCommCreate fills in `handle` after
// cuco_dev_requirements has returned, and the requirement it was asked through must live until then.
struct Counters {
  ncclDevResourceRequirements req;
  ncclDevResourceHandle_t handle;
  int n;

  // In cuco_dev_requirements: `count` counters in the device communicator's resource buffer.
  void require(ncclDevCommRequirements* reqs, int count) {
    n = count;
    memset(&req, 0, sizeof(req));
    req.bufferSize = count * sizeof(ChunkCounter);
    req.bufferAlign = kCounterAlign;
    req.outBufferHandle = &handle;
    reqs->resourceRequirementsList = &req;
  }

  // In cuco_setup: zeroed on every rank before any rank goes on.
  template <int = 0>
  cudaError_t reset(const ncclDevComm& devComm, cudaStream_t st) const { return resetCounters(devComm, handle, n, st); }

  // Make `st` wait until counters [i0, i1) reach `target`.
  template <int = 0>
  cudaError_t await(const ncclDevComm& devComm, cudaStream_t st, int i0, int i1, unsigned long long target) const {
    awaitCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm, handle, i0, i1, target);
    return cudaGetLastError();
  }
};


// Every rank's LSA pointer of `win` (offset 0), copied to the host: collective-free, but it synchronizes `st`.
template <int = 0>
inline cudaError_t windowPointers(ncclWindow_t win, int nRanks, char** host, cudaStream_t st) {
  char** dev = NULL;
  cudaError_t err = cudaMalloc(&dev, nRanks * sizeof(char*));
  if (err == cudaSuccess) {
    windowPointersKernel<<<1, kSmallKernelThreads, 0, st>>>(win, dev, nRanks);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(host, dev, nRanks * sizeof(char*), cudaMemcpyDeviceToHost, st);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  if (dev) {
    const cudaError_t freed = cudaFree(dev);
    if (err == cudaSuccess) err = freed;
  }
  return err;
}

// All-gather and all-to-all in one kernel: to every rank p, `blockBytes` from send + p * srcStride land at
// recvOffset + rank * blockBytes of p's recv window. srcStride 0: an all-gather (one source, loaded once per
// step and stored to every slot); srcStride blockBytes: an all-to-all (block p to rank p). Every block moves in
// the same pass, this rank's own too.
template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    scatterBlocksKernel(ncclDevComm dc, ncclWindow_t recvWin, size_t recvOffset, const char* send, size_t blockBytes,
                        size_t srcStride) {
  Barrier bar(dc);
  bar.sync();
  char* dst[CUCO_COLL_MAX_RANKS];
  const char* src[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) {
    dst[p] = (char*)ncclGetLsaPointer(recvWin, recvOffset + (size_t)dc.lsaRank * blockBytes, p);
    src[p] = send + (size_t)p * srcStride;
  }
  issueCopy(dst, src, dc.lsaSize, blockBytes);
  bar.sync();
}

// All-to-all with uneven blocks whose sizes live on the device, as in a mixture-of-experts dispatch: no
// host round trip to learn them. counts (a window of nRanks int64 per rank): counts[p] = elements this rank
// sends to rank p, its blocks packed in rank order in send. Every rank receives the blocks sent to it packed
// in rank order at recvOffset of its recv window; with zeroTail, the rest of recv up to recvCapacity
// elements is zeroed. Block offsets are prefix sums of counts read from every rank's window. Every rank's recv
// must hold recvCapacity elements.
template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allToAllvKernel(ncclDevComm dc, ncclWindow_t countsWin, size_t countsOffset, const char* send,
                    ncclWindow_t recvWin, size_t recvOffset, size_t elemBytes, size_t recvCapacity, int zeroTail) {
  __shared__ int64_t sendAt[CUCO_COLL_MAX_RANKS], recvAt[CUCO_COLL_MAX_RANKS], count[CUCO_COLL_MAX_RANKS];
  __shared__ int64_t received;
  Barrier bar(dc);
  bar.sync();  // every rank's counts are written, and its recv is free
  if (threadIdx.x == 0) {
    const int64_t* mine = (const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, dc.lsaRank);
    int64_t at = 0;
    received = 0;
    for (int p = 0; p < dc.lsaSize; p++) {
      sendAt[p] = at, count[p] = mine[p], at += mine[p];
      recvAt[p] = 0;  // where this rank's block lands on p: after the blocks of ranks before this one
      for (int s = 0; s < dc.lsaRank; s++) recvAt[p] += ((const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, s))[p];
      received += ((const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, p))[dc.lsaRank];
      // Counts that would write outside a peer's recv (every rank's holds recvCapacity elements) stop the kernel
      // with an error rather than corrupt the peer's memory.
      if (mine[p] < 0 || recvAt[p] + mine[p] > (int64_t)recvCapacity) __trap();
    }
  }
  __syncthreads();
  for (int i = 1; i <= dc.lsaSize; i++) {  // peers first, this rank's own block last
    const int peer = (dc.lsaRank + i) % dc.lsaSize;
    copyBytes((char*)ncclGetLsaPointer(recvWin, recvOffset + recvAt[peer] * elemBytes, peer),
              send + sendAt[peer] * elemBytes, count[peer] * elemBytes);
  }
  if (zeroTail && (size_t)received < recvCapacity) {
    char* tail = (char*)ncclGetLsaPointer(recvWin, recvOffset, dc.lsaRank) + received * elemBytes;
    const size_t n = (recvCapacity - received) * elemBytes;
    for (size_t b = gridThread(); b < n; b += gridThreads()) tail[b] = 0;
  }
  bar.sync();  // every block has landed, and no rank reads counts any more
}

// Point-to-point transfers issued together, as a host ncclGroupStart/ncclGroupEnd of sends and receives is:
// each send pushes its bytes into the matching receive's window on its peer. The i-th send of a rank matches
// the i-th receive of the group's program on the peer (the same program on every rank), so the sender knows
// where its data goes.
#define CUCO_COLL_MAX_SENDS 16
struct SendBatch {
  int n = 0;
  const char* send[CUCO_COLL_MAX_SENDS];
  ncclWindow_t recvWin[CUCO_COLL_MAX_SENDS];
  size_t recvOffset[CUCO_COLL_MAX_SENDS];
  size_t bytes[CUCO_COLL_MAX_SENDS];
  int peer[CUCO_COLL_MAX_SENDS];

  cudaError_t add(const void* src, size_t nBytes, int to, ncclWindow_t win, size_t offset) {
    if (n == CUCO_COLL_MAX_SENDS) return cudaErrorInvalidValue;
    send[n] = (const char*)src, bytes[n] = nBytes, peer[n] = to, recvWin[n] = win, recvOffset[n] = offset;
    n++;
    return cudaSuccess;
  }
};

template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS) sendKernel(ncclDevComm dc, SendBatch batch) {
  Barrier bar(dc);
  bar.sync();  // every receiver is done with its receive buffers
  for (int i = 0; i < batch.n; i++)
    copyBytes((char*)ncclGetLsaPointer(batch.recvWin[i], batch.recvOffset[i], batch.peer[i]), batch.send[i],
              batch.bytes[i]);
  bar.sync();  // every send has landed
}

// A 16-byte pack as elements and back, through memcpy rather than a pointer cast: the host build of these loops
// (tests/test_collectives_host.py) is C++, where reading a uint4 through a T* breaks strict aliasing and lets the
// optimiser reorder the reads. On the device both compile to register moves.
template <typename T>
__host__ __device__ inline void addPack(float* acc, const uint4& u) {
  T v[16 / sizeof(T)];
  memcpy(v, &u, sizeof(u));
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) acc[e] += toFloat(v[e]);
}

template <typename T>
__host__ __device__ inline uint4 packOf(const float* acc) {
  T v[16 / sizeof(T)];
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) v[e] = fromFloat<T>(acc[e]);
  uint4 u;
  memcpy(&u, v, sizeof(u));
  return u;
}

// Part i of `parts` of [0, count) elements, cut on boundaries of packs of kN elements so that every part
// starts aligned like element 0; the last part takes the tail.
__host__ __device__ inline void packSlice(size_t count, size_t kN, size_t i, size_t parts, size_t* lo, size_t* hi) {
  const size_t packs = count / kN;
  *lo = packs * i / parts * kN;
  *hi = i == parts - 1 ? count : packs * (i + 1) / parts * kN;
}

// 16-byte packs each thread of a reduction loads before it adds: CUCO_COLL_UNROLL from each of two ranks, the
// same bytes split among more ranks, so that registers stay within the launch bounds' budget at 8 ranks.
#define CUCO_COLL_REDUCE_PACKS (2 * CUCO_COLL_UNROLL)

// Packs [0, nPacks) of in[p] + lo, for nIn <= kMaxIn: every rank's loads are issued before the first add, so a
// rank's loads from its own memory wait beside the peers' instead of after them (the loop over p is unrolled;
// ranks past nIn are predicated off). The adds still run in rank order.
template <typename T, int kMaxIn, int kPacks>
__host__ __device__ inline void reducePacks(const T* const* in, int nIn, T* const* out, int nOut, size_t lo,
                                            size_t nPacks, size_t tid, size_t nThreads) {
  constexpr int kN = 16 / sizeof(T);
  constexpr int kU = kMaxIn >= kPacks ? 1 : kPacks / kMaxIn;
  for (size_t base = tid; base < nPacks; base += nThreads * kU) {
    uint4 v[kMaxIn][kU];
#pragma unroll
    for (int p = 0; p < kMaxIn; p++) {
      const uint4* src = reinterpret_cast<const uint4*>(in[p] + lo);
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (p < nIn && base + u * nThreads < nPacks) v[p][u] = src[base + u * nThreads];
    }
#pragma unroll
    for (int u = 0; u < kU; u++) {
      if (base + u * nThreads >= nPacks) break;
      float acc[kN] = {};
#pragma unroll
      for (int p = 0; p < kMaxIn; p++)
        if (p < nIn) addPack<T>(acc, v[p][u]);
      const uint4 r = packOf<T>(acc);
      for (int o = 0; o < nOut; o++) reinterpret_cast<uint4*>(out[o] + lo)[base + u * nThreads] = r;
    }
  }
}

// Every rank's copy of one operand, passed to a kernel by value (its parameters hold CUCO_COLL_MAX_RANKS pointers).
template <typename T>
struct RankPointers {
  const T* at[CUCO_COLL_MAX_RANKS];
  int n;
};

// Elements [lo, hi), by thread `tid` of `nThreads`: the sum over ranks p = 0..nIn-1 (in that order, in fp32)
// of in[p][i], stored to every out[o][i]. 16-byte packs when every pointer is 16-byte aligned at lo, element by
// element otherwise and for the tail; both paths add in the same order, so the result does not depend on
// alignment. kPacks: packs in flight per thread (reducePacks).
template <typename T, int kPacks = CUCO_COLL_REDUCE_PACKS>
__host__ __device__ inline void reduceRange(const T* const* in, int nIn, T* const* out, int nOut, size_t lo, size_t hi,
                                            size_t tid, size_t nThreads) {
  constexpr int kN = 16 / sizeof(T);
  uintptr_t addrs = 0;
  for (int p = 0; p < nIn; p++) addrs |= (uintptr_t)(in[p] + lo);
  for (int o = 0; o < nOut; o++) addrs |= (uintptr_t)(out[o] + lo);
  const size_t nPacks = (addrs & 15) ? 0 : (hi - lo) / kN;
  if (nIn <= 2) reducePacks<T, 2, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  else if (nIn <= 4) reducePacks<T, 4, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  else reducePacks<T, CUCO_COLL_MAX_RANKS, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  for (size_t i = lo + nPacks * kN + tid; i < hi; i += nThreads) {
    float acc = 0.0f;
    for (int p = 0; p < nIn; p++) acc += toFloat(in[p][i]);
    const T v = fromFloat<T>(acc);
    for (int o = 0; o < nOut; o++) out[o][i] = v;
  }
}

// The grid's part of a reduction of elements [lo, hi): every thread of the grid strides over them, or, under
// CUCO_COLL_ISSUER_WARP, each warp reduces a contiguous slice cut on 16-byte packs (the same additions in the same
// order either way: the result does not depend on the issuer).
template <typename T>
__device__ inline void issueReduce(const T* const* in, int nIn, T* const* out, int nOut, size_t lo, size_t hi) {
#if defined(CUCO_COLL_ISSUER_WARP)
  constexpr size_t kWarp = 32;
  size_t b, e;
  packSlice(hi - lo, 16 / sizeof(T), gridThread() / kWarp, gridThreads() / kWarp, &b, &e);
  if (b < e) reduceRange<T>(in, nIn, out, nOut, lo + b, lo + e, threadIdx.x % kWarp, kWarp);
#else
  reduceRange<T>(in, nIn, out, nOut, lo, hi, gridThread(), gridThreads());
#endif
}

// Reduce-scatter (sum) of elements [lo, hi): recv[i] = sum over ranks p (in order) of p's send[rank * count + i].
// `first` opens the collective with a barrier, `last` closes it with one: a reduce-scatter in pieces (sync chunk)
// is one kernel per piece, the first and the last of them meeting every rank.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    reduceScatterKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, T* recv, size_t count, size_t lo,
                        size_t hi, int first, int last) {
  if (first) lsaBarrier(dc);
  const T* in[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) in[p] = (const T*)ncclGetLsaPointer(sendWin, sendOffset, p) + (size_t)dc.lsaRank * count;
  issueReduce<T>(in, dc.lsaSize, &recv, 1, lo, hi);
  if (last) lsaBarrier(dc);  // peers may reuse their send buffers only once every rank has read them
}

// Reduce-scatter by stores (sync chunk, producer and consumer CTAs), the design point beside reduceScatterKernel's
// loads: the data crosses NVLink as stores, and the consumers' additions run behind the producers' stores (how the
// two compare: benchmarks/results/notes-collectives.md). A stage of the program's own (ReduceScatterStage) receives,
// in slot r, the block that rank r stores for this rank. CTA b < CUCO_COLL_CTAS is a producer: it stores chunk after
// chunk of its range of every peer's block (send + p * count) into slot `rank` of p's stage, then raises its flag
// there. CTA CUCO_COLL_CTAS + b is a consumer: it waits for flag b of every peer, chunk by chunk, and adds while the
// producers' next stores are in flight. Flags count up across calls (call * nChunks + chunk + 1), so they are never
// reset. A barrier per producer at the start keeps a rank from storing into a peer's stage that the peer's consumers
// may still be reading from the previous call. Producers have the lower block indices, so they are dispatched first;
// a consumer waits only on peers' producers, and the 2 * 64 CTAs fit a 132-SM H100 or H200 together (one per SM at
// these launch bounds). Same addition order as reduceScatterKernel (rank order, fp32).
struct ReduceScatterStage {
  void* buf;         // nRanks slots of slotBytes, then nRanks * CUCO_COLL_CTAS flags (uint64_t)
  ncclWindow_t win;  // symmetric: every rank allocates the same stage
  size_t count;      // elements in each rank's block
  size_t slotBytes;  // count elements rounded up to 256 bytes, so every slot starts aligned
  uint64_t calls;    // reduceScatterPush calls so far: where the flags start this time
};

__host__ __device__ inline size_t stageFlagsOffset(int nRanks, size_t slotBytes) { return (size_t)nRanks * slotBytes; }

// Where in the stage the flag that rank `src`'s producer CTA b raises lies.
__device__ inline size_t stageFlag(size_t flagsOffset, int src, int b) {
  return flagsOffset + ((size_t)src * CUCO_COLL_CTAS + b) * sizeof(uint64_t);
}

template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    reduceScatterPushKernel(ncclDevComm dc, const T* send, ReduceScatterStage stage, T* recv, int nChunks) {
  const int me = dc.lsaRank, n = dc.lsaSize;
  const bool producer = blockIdx.x < CUCO_COLL_CTAS;
  const int b = blockIdx.x % CUCO_COLL_CTAS;
  const size_t count = stage.count, flags = stageFlagsOffset(n, stage.slotBytes);
  const uint64_t first = stage.calls * (uint64_t)nChunks + 1;  // flag value once chunk 0 of this call landed
  constexpr size_t kN = 16 / sizeof(T);
  size_t lo, hi;  // this CTA's range of the block
  packSlice(count, kN, b, CUCO_COLL_CTAS, &lo, &hi);
  if (producer) {  // every peer is done reading its stage (barrier b: blockIdx.x is b for a producer)
    Barrier bar(dc);
    bar.sync();
  }
  for (int k = 0; k < nChunks; k++) {
    size_t c0, c1;  // chunk k of the range, pack-aligned like it
    packSlice(hi - lo, kN, k, nChunks, &c0, &c1);
    c0 += lo, c1 += lo;
    if (producer) {
      char* dst[CUCO_COLL_MAX_RANKS];
      const char* src[CUCO_COLL_MAX_RANKS];
      int m = 0;
      for (int p = 0; p < n; p++) {
        if (p == me) continue;
        dst[m] = (char*)ncclGetLsaPointer(stage.win, me * stage.slotBytes + c0 * sizeof(T), p);
        src[m++] = (const char*)(send + (size_t)p * count + c0);
      }
      copyBytes(dst, src, m, (c1 - c0) * sizeof(T), threadIdx.x, blockDim.x);
      __syncthreads();  // every thread's stores of chunk k precede the flag (release, below)
      if (threadIdx.x == 0)
        for (int p = 0; p < n; p++) {
          if (p == me) continue;
          uint64_t* flag = (uint64_t*)ncclGetLsaPointer(stage.win, stageFlag(flags, me, b), p);
          cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*flag).store(first + k, cuda::memory_order_release);
        }
    } else {
      // Built per chunk, not hoisted out of the loop: live across it, these pointers spill more registers.
      const char* mine = (const char*)ncclGetLsaPointer(stage.win, 0, me);
      if (threadIdx.x == 0)
        for (int q = 0; q < n; q++) {
          if (q == me) continue;
          // acquire: chunk k from rank q has landed in slot q before any thread of this CTA reads it
          cuda::atomic_ref<uint64_t, cuda::thread_scope_system> flag(*(uint64_t*)(mine + stageFlag(flags, q, b)));
          while (flag.load(cuda::memory_order_acquire) < first + k) {
          }
        }
      __syncthreads();
      const T* in[CUCO_COLL_MAX_RANKS];
      for (int q = 0; q < n; q++) in[q] = q == me ? send + (size_t)me * count : (const T*)(mine + q * stage.slotBytes);
      // Half the loads version's packs in flight: these inputs are local, so fewer loads cover their latency,
      // and this kernel also holds the producer's copy loop, beside which the full count spills registers.
      reduceRange<T, CUCO_COLL_REDUCE_PACKS / 2>(in, n, &recv, 1, c0, c1, threadIdx.x, blockDim.x);
    }
  }
}

// All-reduce (sum): rank r reduces its slice of every rank's send and stores the sum into every rank's recv.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allReduceKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin, size_t recvOffset,
                    size_t count) {
  Barrier bar(dc);
  bar.sync();
  size_t lo, hi;
  packSlice(count, 16 / sizeof(T), dc.lsaRank, dc.lsaSize, &lo, &hi);
  const T* in[CUCO_COLL_MAX_RANKS];
  T* out[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) {
    in[p] = (const T*)ncclGetLsaPointer(sendWin, sendOffset, p);
    out[p] = (T*)ncclGetLsaPointer(recvWin, recvOffset, p);
  }
  issueReduce<T>(in, dc.lsaSize, out, dc.lsaSize, lo, hi);
  bar.sync();
}

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
// that reads it, a GEMM's for the reduce-scatter of what it wrote): where the buffer of rank blocks starts, a block's
// bytes, the bytes of one of the GEMM's rows (a producer's), and the calls so far.
struct PieceSite {
  const void* buffer = nullptr;
  size_t bytes = 0;
  int64_t rowBytes = 0;
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

// ---- Sync chunk (CUCO_COLL_CHUNK_SYNC): a collective and the GEMM beside it, piece by piece ----
// An all-gather whose consumer reads the gathered rows: allGatherChunks<Site> cuts this rank's block into
// CUCO_CHUNKS pieces on 16-byte boundaries; once every thread of a CTA has stored its part of piece j on every rank,
// the CTA bumps flag (Site, this rank, j) there, and the consumer (cuco::gemmByGatheredRows, cuco_gemm_rows.cuh)
// waits for the flags of the pieces its next rows lie in (complete at call * CUCO_COLL_CTAS).
// A reduce-scatter whose input a GEMM produces: the GEMM (cuco::gemmSignalRows) writes the peers' blocks first and
// its own last, each in CUCO_CHUNKS pieces of rows, and after piece j of block q bumps flag (Site, this rank, j) on
// rank q (complete at call); reduceScatterChunks<Site>, forked before the GEMM, sums each piece of its block (a
// kernel per piece, behind a one-thread wait) once every rank has flagged it.
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

// Flags are zeroed before the first call on a device communicator, and the host waits: every rank's first kernel of
// any site passes a barrier after its zeroing, so no peer bumps a flag that is still to be zeroed.
template <int = 0>
inline cudaError_t chunkFlagsZeroed(const cuco_ctx_t* ctx, cudaStream_t st) {
  HostState& s = hostState();
  if (s.flagsZeroed) return cudaSuccess;
  const Counters& flags = chunkFlags();
  zeroCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(*ctx->devComm, flags.handle, flags.n);
  cudaError_t err = cudaGetLastError();
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

// After piece j of block q of a GEMM that feeds a reduce-scatter of site Site: rank q may sum it.
template <int Site>
inline cudaError_t signalPiece(const cuco_ctx_t* ctx, cudaStream_t st, int q, int j) {
  signalPieceKernel<<<1, kSmallKernelThreads, 0, st>>>(*ctx->devComm, chunkFlags().handle, q,
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

}  // namespace cuco

#endif  // CUCO_COLLECTIVES_CUH_
