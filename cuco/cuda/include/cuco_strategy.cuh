/*************************************************************************
 * cuco_strategy.cuh: the pieces strategy kernels share (workloads/<name>/strategies/*.cu).
 *
 *   Issuer / IssuerUnit   the unit that owns a contiguous slice of a transfer or a reduction (a CTA or a warp)
 *   ChunkCounter          a counter per chunk in the device communicator's resource buffer, bumped by peers
 *                         and waited on with acquire loads; counters only grow, so they are zeroed once
 *   small kernels         an LSA barrier across all ranks, the LSA pointers of a window, zeroing counters
 *                         (resetCounters: zeroed on every rank before any rank goes on)
 *
 * Requires: the device communicator has at least one LSA barrier; all ranks in one LSA team.
 *************************************************************************/
#ifndef CUCO_STRATEGY_CUH_
#define CUCO_STRATEGY_CUH_

#include "cuco.h"

namespace cuco {

constexpr int kWarpSize = 32;
// Barrier, wait and setup kernels run as one warp: their work is a few words, or one thread's spin.
constexpr int kSmallKernelThreads = kWarpSize;

enum class Issuer { Cta, Warp };

// A unit of a kernel: `index` of `count` units, each of `lanes` threads; this thread is `lane`.
struct Worker {
  int index, count, lane, lanes;
};

template <Issuer>
struct IssuerUnit;

template <>
struct IssuerUnit<Issuer::Cta> {
  static constexpr int perKernel(int ctas, int /*threads*/) { return ctas; }
  __device__ static Worker self() { return {(int)blockIdx.x, (int)gridDim.x, (int)threadIdx.x, (int)blockDim.x}; }
  __device__ static void sync() { __syncthreads(); }
};

template <>
struct IssuerUnit<Issuer::Warp> {
  static constexpr int perKernel(int ctas, int threads) { return ctas * threads / kWarpSize; }
  __device__ static Worker self() {
    return {(int)((blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize), (int)(gridDim.x * blockDim.x / kWarpSize),
            (int)(threadIdx.x % kWarpSize), kWarpSize};
  }
  __device__ static void sync() { __syncwarp(); }
};

using ChunkCounter = unsigned long long;
// A counter array starts on its own 128-byte cache line, apart from the barriers' state.
constexpr size_t kCounterAlign = 128;

// Resource-buffer requirements for `n` counters: filled in by ncclDevCommCreate, so `req` and `handle` must
// outlive the cuco_dev_requirements call (file-scope statics in a strategy).
inline void counterRequirements(ncclDevCommRequirements* reqs, ncclDevResourceRequirements* req,
                                ncclDevResourceHandle_t* handle, int n) {
  memset(req, 0, sizeof(*req));
  req->bufferSize = n * sizeof(ChunkCounter);
  req->bufferAlign = kCounterAlign;
  req->outBufferHandle = handle;
  reqs->resourceRequirementsList = req;
}

__global__ void zeroCountersKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int n) {
  ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLocalPointer(devComm, handle);
  for (int i = threadIdx.x; i < n; i += blockDim.x) c[i] = 0;
  __threadfence_system();
}

__global__ void barrierKernel(ncclDevComm devComm) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, blockIdx.x};
  // acq_rel: what each rank did before is visible to every rank after.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

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

// Thread 0 spins until this rank's counter i reaches `target`; the CTA's threads meet behind it.
__device__ inline void awaitCounter(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int i,
                                    unsigned long long target) {
  if (threadIdx.x == 0) {
    ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLocalPointer(devComm, handle);
    cuda::atomic_ref<ChunkCounter, cuda::thread_scope_system> f(c[i]);
    // Acquire: the peers' stores that preceded their bumps are visible to the loads after this wait.
    while (f.load(cuda::memory_order_acquire) < target) {
    }
  }
  __syncthreads();
}

// A stream that must not go on before counter i reaches `target` (a copy engine, a cuBLAS call) waits behind it.
__global__ void awaitCounterKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int i,
                                   unsigned long long target) {
  awaitCounter(devComm, handle, i, target);
}

// Zero this rank's first `n` counters, then meet every rank (so no rank bumps a counter a peer has yet to zero),
// and wait for both: a strategy's setup, once.
inline cudaError_t resetCounters(const ncclDevComm& devComm, ncclDevResourceHandle_t handle, int n, cudaStream_t st) {
  zeroCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm, handle, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  barrierKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm);
  err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaStreamSynchronize(st);
}

// Every rank's LSA pointer of `win` (offset 0), copied to the host: collective-free, but it synchronizes `st`.
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

}  // namespace cuco

#endif  // CUCO_STRATEGY_CUH_
