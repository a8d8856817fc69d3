/*************************************************************************
 * cuco_coll_sync.cuh: LSA barriers and the counters ranks signal each other through (bump, await, reset, a
 * strategy's counter array).
 *
 * A part of cuco_collectives.cuh, which includes it after its knobs and the parts before it; never included
 * on its own.
 *************************************************************************/
#ifndef CUCO_COLL_SYNC_CUH_
#define CUCO_COLL_SYNC_CUH_

#ifndef CUCO_COLLECTIVES_CUH_
#error "include cuco_collectives.cuh, not its parts"
#endif

namespace cuco {

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


}  // namespace cuco

#endif  // CUCO_COLL_SYNC_CUH_
