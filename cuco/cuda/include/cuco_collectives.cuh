/*************************************************************************
 * cuco_collectives.cuh: cuco's device-side collectives over NCCL 2.28 LSA windows.
 *
 * The conservative design point of the fast path: one kernel per collective (placement deferred),
 * CUCO_COLL_CTAS CTAs each owning one LSA barrier (sync global, issuer cta), the whole buffer at once.
 * Every kernel starts with a barrier (no rank writes into, or reads from, a peer buffer that peer may
 * still be using) and ends with one (every store has landed before anything after the kernel runs).
 * Reductions add in fixed rank order in fp32, so results are bitwise deterministic.
 *
 * Requires: the device communicator has CUCO_COLL_CTAS LSA barriers (cuco_coll_requirements); the
 * windows are symmetric buffers of the workload; all ranks in one LSA team.
 *************************************************************************/
#ifndef CUCO_COLLECTIVES_CUH_
#define CUCO_COLLECTIVES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuco.h"

// One LSA barrier per CTA, so this is also the lsaBarrierCount the device communicator needs.
#define CUCO_COLL_CTAS 32
#define CUCO_COLL_THREADS 512

namespace cuco {

inline void coll_requirements(ncclDevCommRequirements* reqs) { reqs->lsaBarrierCount = CUCO_COLL_CTAS; }

__device__ inline float toFloat(float v) { return v; }
__device__ inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float toFloat(__half v) { return __half2float(v); }
template <typename T> __device__ inline T fromFloat(float v);
template <> __device__ inline float fromFloat<float>(float v) { return v; }
template <> __device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ inline __half fromFloat<__half>(float v) { return __float2half(v); }

// Bytes [0, n) from src to dst by all threads of the grid: 16-byte accesses where both are aligned.
__device__ inline void copyBytes(char* dst, const char* src, size_t n) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nThreads = (size_t)gridDim.x * blockDim.x;
  const bool aligned = (((uintptr_t)dst | (uintptr_t)src) & 15) == 0;
  const size_t nVec = aligned ? n / 16 : 0;
  for (size_t i = tid; i < nVec; i += nThreads) ((uint4*)dst)[i] = ((const uint4*)src)[i];
  for (size_t i = nVec * 16 + tid; i < n; i += nThreads) dst[i] = src[i];
}

struct Barrier {
  ncclLsaBarrierSession<ncclCoopCta> session;
  __device__ Barrier(const ncclDevComm& dc)
      : session(ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x) {}
  // acq_rel: what every rank did before is visible to every rank after.
  __device__ void sync() { session.sync(ncclCoopCta(), cuda::memory_order_acq_rel); }
};

// All-gather: this rank's `bytes` of send land at recvOffset + rank * bytes of every rank's recv window.
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allGatherKernel(ncclDevComm dc, ncclWindow_t recvWin, size_t recvOffset, const char* send, size_t bytes) {
  Barrier bar(dc);
  bar.sync();
  for (int peer = 0; peer < dc.lsaSize; peer++)
    copyBytes((char*)ncclGetLsaPointer(recvWin, recvOffset + (size_t)dc.lsaRank * bytes, peer), send, bytes);
  bar.sync();
}

// Reduce-scatter (sum): recv[i] = sum over ranks p (in order) of p's send[rank * count + i].
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    reduceScatterKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, T* recv, size_t count) {
  Barrier bar(dc);
  bar.sync();
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nThreads = (size_t)gridDim.x * blockDim.x;
  for (size_t i = tid; i < count; i += nThreads) {
    float acc = 0.0f;
    for (int p = 0; p < dc.lsaSize; p++)
      acc += toFloat(((const T*)ncclGetLsaPointer(sendWin, sendOffset, p))[(size_t)dc.lsaRank * count + i]);
    recv[i] = fromFloat<T>(acc);
  }
  bar.sync();  // peers may reuse their send buffers only once every rank has read them
}

// All-reduce (sum): rank r reduces its slice of every rank's send and stores the sum into every rank's recv.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allReduceKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin, size_t recvOffset,
                    size_t count) {
  Barrier bar(dc);
  bar.sync();
  const size_t lo = count * dc.lsaRank / dc.lsaSize, hi = count * (dc.lsaRank + 1) / dc.lsaSize;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nThreads = (size_t)gridDim.x * blockDim.x;
  for (size_t i = lo + tid; i < hi; i += nThreads) {
    float acc = 0.0f;
    for (int p = 0; p < dc.lsaSize; p++) acc += toFloat(((const T*)ncclGetLsaPointer(sendWin, sendOffset, p))[i]);
    const T v = fromFloat<T>(acc);
    for (int p = 0; p < dc.lsaSize; p++) ((T*)ncclGetLsaPointer(recvWin, recvOffset, p))[i] = v;
  }
  bar.sync();
}

inline cudaError_t allGather(const cuco_ctx_t* ctx, ncclWindow_t recvWin, size_t recvOffset, const void* send,
                             size_t bytes, cudaStream_t stream) {
  allGatherKernel<<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(ctx->devComm, recvWin, recvOffset,
                                                                   (const char*)send, bytes);
  return cudaGetLastError();
}

template <typename T>
inline cudaError_t reduceScatter(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset, void* recv,
                                 size_t count, cudaStream_t stream) {
  reduceScatterKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(ctx->devComm, sendWin, sendOffset,
                                                                          (T*)recv, count);
  return cudaGetLastError();
}

template <typename T>
inline cudaError_t allReduce(const cuco_ctx_t* ctx, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin,
                             size_t recvOffset, size_t count, cudaStream_t stream) {
  allReduceKernel<T><<<CUCO_COLL_CTAS, CUCO_COLL_THREADS, 0, stream>>>(ctx->devComm, sendWin, sendOffset, recvWin,
                                                                      recvOffset, count);
  return cudaGetLastError();
}

}  // namespace cuco

#endif  // CUCO_COLLECTIVES_CUH_
