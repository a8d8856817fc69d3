/*************************************************************************
 * cuco_strategy.cuh: the pieces strategy kernels share (workloads/<name>/strategies/*.cu), so that a strategy
 * holds only its own schedule. It brings the design point (cuco_design_point.cuh) with it.
 *
 *   IssuerUnit            the unit that owns a contiguous slice of a transfer or a reduction (a CTA or a warp)
 *   chunkRows             the rows of chunk j: the same split on every rank
 * and, from cuco_collectives.cuh, the counters peers bump and streams wait on, an LSA barrier across all ranks and
 * the LSA pointers of a window; from cuco_program.cuh, what any program may use: a State's common part with its
 * setup and teardown, streams forked and joined.
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
// A bulk put beside a GEMM (a KV cache's layers, an MoE dispatch's rows: hundreds of MB at the link's rate) gets
// more: cuBLAS keeps all SMs but kBulkPutSms, and the put runs two CTAs of CUCO_COLL_THREADS on each of them (an SM
// holds 2048 threads).
constexpr int kBulkPutSms = 16;
constexpr int kBulkPutCtas = 2 * kBulkPutSms;

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

namespace point {
using cuco::chunkRows;  // the point's split of a block into chunks
}  // namespace point

}  // namespace cuco

#endif  // CUCO_STRATEGY_CUH_
