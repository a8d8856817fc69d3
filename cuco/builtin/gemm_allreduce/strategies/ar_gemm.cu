/*************************************************************************
 * GEMM + AllReduce (decode) strategy kernel: cuBLAS, then a one-shot all-reduce behind a single barrier.
 *
 * Every rank writes its partial product into slot epoch % 2 of its `partial` window and, once every rank has
 * done so, adds all of them (rank order, fp32) into its own c: each rank computes the whole sum, so no second
 * exchange and no second barrier are needed. The two slots make the one barrier enough: a rank that passed run
 * e-1's barrier knows every peer has finished reading run e-2's slot, the one run e overwrites.
 * The design point (cuco_design_point.cuh; the values workload.toml accepts):
 *   backend    lsa  one kernel: barrier, then loads of every rank's slot through NCCL windows
 *              ce   a barrier kernel, cudaMemcpyAsync of the peers' slots into staging, then a local addition
 *   placement  deferred; sync global (the barrier)
 *   issuer     cta or warp: the unit of the addition that owns a contiguous slice
 *   chunks     pieces the product is added in, each its own launch (lsa: the first holds the barrier)
 *
 * Requires: partial with two slots of M x N; (workload.toml) partial symmetric, all ranks in one LSA team.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

using namespace cuco::point;
constexpr bool kLsa = kBackend == Backend::Lsa;

// ---- Constants ---------------------------------------------------------------------------------------

// The addition's CTAs, each with its own LSA barrier (so this is also lsaBarrierCount): the device collectives'
// count (CUCO_COLL_CTAS), which moved data fastest over NVLink.
constexpr int kCtas = CUCO_COLL_CTAS;
constexpr int kThreads = CUCO_COLL_THREADS;
constexpr int kSlots = 2;                       // partial's slots (workload.toml), used by alternate runs
using Elem = __nv_bfloat16;                     // a, b, c, partial and staging hold bf16 (workload.toml)
constexpr size_t kPackElems = 16 / sizeof(Elem);

// epoch: this run writes slot epoch % kSlots.
struct State : cuco::Common<> {
  char* peerPartial[cuco::kMaxRanks];  // every rank's partial, mapped into this rank's address space
};

using Inputs = cuco::RankPointers<Elem>;

// Elements [lo, hi) of out = the sum over p of in.at[p], each unit its pack-aligned share. barrier: CTA b first
// meets CTA b of every rank (acq_rel: every rank's partial is complete before it is loaded).
template <Issuer I>
__global__ void __launch_bounds__(kThreads) addKernel(ncclDevComm devComm, Inputs in, Elem* out, size_t lo,
                                                      size_t hi, int barrier) {
  if (barrier) cuco::lsaBarrier(devComm);
  const cuco::Worker me = cuco::IssuerUnit<I>::self();
  size_t a, b;
  cuco::packSlice(hi - lo, kPackElems, me.index, me.count, &a, &b);
  cuco::reduceRange<Elem>(in.at, in.n, &out, 1, lo + a, lo + b, me.lane, me.lanes);
}

// Elements [lo, hi) of the sum: LSA loads every rank's slot (the first chunk behind the barrier); CE copies the peers' slots into
// staging (slot p: rank p's) behind the barrier kernel run() launched, and adds local memory.
static int addChunk(cuco_ctx_t* ctx, State* s, size_t slotOffset, size_t count, size_t lo, size_t hi, bool first) {
  Inputs in;
  in.n = ctx->nRanks;
  Elem* staging = kLsa ? NULL : (Elem*)cuco_buffer(ctx, "staging")->ptr;
  for (int p = 0; p < ctx->nRanks; p++) {
    const Elem* slot = (const Elem*)(s->peerPartial[p] + slotOffset);
    if (kLsa || p == ctx->rank) {
      in.at[p] = slot;
      continue;
    }
    in.at[p] = staging + p * count;
    CUCO_CUDA(ctx, cudaMemcpyAsync(staging + p * count + lo, slot + lo, (hi - lo) * sizeof(Elem),
                                   cudaMemcpyDeviceToDevice, ctx->stream));
  }
  addKernel<kIssuer><<<kCtas, kThreads, 0, ctx->stream>>>(*ctx->devComm, in, (Elem*)cuco_buffer(ctx, "c")->ptr, lo,
                                                          hi, kLsa && first);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = kCtas;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, 0));
  CUCO_CUDA(ctx, cuco::windowPointers(cuco_buffer(ctx, "partial")->window, ctx->nRanks, s->peerPartial, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const size_t count = (size_t)M * N;
  const size_t slotOffset = (s->epoch++ % kSlots) * count * sizeof(Elem);
  char* partial = (char*)cuco_buffer(ctx, "partial")->ptr;
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr,
                                  partial + slotOffset, M, K / ctx->nRanks, N));
  if (!kLsa) CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, ctx->stream));
  for (int j = 0, done = 0; j < kChunks; j++) {
    size_t lo, hi;
    cuco::packSlice(count, kPackElems, j, kChunks, &lo, &hi);
    if (hi > lo) CUCO_TRY(addChunk(ctx, s, slotOffset, count, lo, hi, done++ == 0));
  }
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
