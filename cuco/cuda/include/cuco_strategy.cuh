/*************************************************************************
 * cuco_strategy.cuh: the pieces strategy kernels share (workloads/<name>/strategies/*.cu), so that a strategy
 * holds only its own schedule. It brings the design point (cuco_design_point.cuh) with it.
 *
 *   IssuerUnit            the unit that owns a contiguous slice of a transfer or a reduction (a CTA or a warp)
 *   chunkRows             the rows of chunk j: the same split on every rank
 *   Counters              counters in the device communicator's resource buffer, bumped by peers and waited on
 *                         with acquire loads; counters only grow, so they are zeroed once, in setup
 *   small kernels         an LSA barrier across all ranks, the LSA pointers of a window
 * and, from cuco_program.cuh, what any program may use: a State's common part with its setup and teardown,
 * streams forked and joined.
 *
 * What a strategy needs of the run (an LSA team, side streams, symmetric buffers) is declared in its
 * workload.toml and checked by the runner before cuco_setup (cuco_needs, cuco.h), not here.
 * Requires: the device communicator has at least one LSA barrier; all ranks in one LSA team.
 *************************************************************************/
#ifndef CUCO_STRATEGY_CUH_
#define CUCO_STRATEGY_CUH_

#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_design_point.cuh"
#include "cuco_program.cuh"

#if !defined(CUCO_BACKEND) || !defined(CUCO_PLACEMENT) || !defined(CUCO_SYNC) || !defined(CUCO_ISSUER) || \
    !defined(CUCO_CHUNKS)
#error "a strategy kernel is compiled at a design point: cuco/evolve/strategy.py defines CUCO_BACKEND ... CUCO_CHUNKS"
#endif

namespace cuco {

// A kernel that runs beside a GEMM (a reduction, an addition, a put) gets kBesideCtas CTAs of CUCO_COLL_THREADS,
// on SMs cuBLAS leaves free (cuco_gemm_leave_sms). 8 CTAs of 512 threads, each with CUCO_COLL_REDUCE_PACKS
// 16-byte loads in flight per rank, keep 512 KiB in flight: at the ~1 us latency of a load over NVLink that covers
// the link's rate (notes-collectives.md), and stores need no round trip at all. 8 SMs are 6% of an H100's or H200's.
constexpr int kBesideCtas = 8;
// The SMs kept from cuBLAS for them: theirs, and one for the small kernels (signal, wait) beside the GEMM.
constexpr int kBesideReservedSms = kBesideCtas + 1;
constexpr int kWarpSize = 32;
// Barrier, wait and setup kernels run as one warp: their work is a few words, or one thread's spin.
constexpr int kSmallKernelThreads = kWarpSize;

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

// Rows [r0, r1) of chunk j of a block of `rows` rows cut into kChunks nearly equal ranges; a range may be empty
// (rows < kChunks), alike on every rank, since the split depends on the shape only.
__host__ __device__ inline void chunkRows(int64_t rows, int j, int64_t* r0, int64_t* r1) {
  *r0 = rows * j / kChunks;
  *r1 = rows * (j + 1) / kChunks;
}

// The calling CTA meets CTA blockIdx.x of every rank at LSA barrier blockIdx.x (the device communicator needs
// as many barriers as the kernel has CTAs). acq_rel: what each rank did before is visible to every rank after.
__device__ inline void lsaBarrier(const ncclDevComm& devComm) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

__global__ void barrierKernel(ncclDevComm devComm) { lsaBarrier(devComm); }

// Every rank meets on `st` (one CTA: LSA barrier 0). A kernel that must run while a GEMM holds the SMs goes on a
// stream the GEMM is not on, or on SMs kept from it.
inline cudaError_t barrier(const ncclDevComm& devComm, cudaStream_t st) {
  barrierKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm);
  return cudaGetLastError();
}

using ChunkCounter = unsigned long long;
// A counter array starts on its own 128-byte cache line, apart from the barriers' state.
constexpr size_t kCounterAlign = 128;

__global__ void zeroCountersKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int n) {
  ChunkCounter* c = (ChunkCounter*)ncclGetResourceBufferLocalPointer(devComm, handle);
  for (int i = threadIdx.x; i < n; i += blockDim.x) c[i] = 0;
  __threadfence_system();
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
__global__ void awaitCountersKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle, int i0, int i1,
                                    unsigned long long target) {
  awaitCounters(devComm, handle, i0, i1, target);
}

// Zero this rank's first `n` counters, then meet every rank (so no rank bumps a counter a peer has yet to zero),
// and wait for both: a strategy's setup, once.
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
  cudaError_t reset(const ncclDevComm& devComm, cudaStream_t st) const { return resetCounters(devComm, handle, n, st); }

  // Make `st` wait until counters [i0, i1) reach `target`.
  cudaError_t await(const ncclDevComm& devComm, cudaStream_t st, int i0, int i1, unsigned long long target) const {
    awaitCountersKernel<<<1, kSmallKernelThreads, 0, st>>>(devComm, handle, i0, i1, target);
    return cudaGetLastError();
  }
};


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


namespace point {
using cuco::chunkRows;  // the point's split of a block into chunks
}  // namespace point

}  // namespace cuco

#endif  // CUCO_STRATEGY_CUH_
