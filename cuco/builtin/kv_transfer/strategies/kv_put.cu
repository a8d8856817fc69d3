/*************************************************************************
 * KV-cache transfer by stores from the prefill rank straight into the decode rank's pages (LSA).
 *
 * The prefill rank (0) computes each layer's K and V with cuBLAS into its contiguous staging; a put kernel reads
 * the decode rank's block table through its window and stores every token's K and V row into the page and slot
 * it names, in the decode rank's pool: no staging on the decode side, no scatter pass, no host. Each unit of
 * every put kernel bumps the decode rank's counter once its stores are issued; the decode rank's stream waits
 * until the counter has reached this run's count (nothing on the decode side can start earlier).
 * The design point (cuco_design_point.cuh; workload.toml accepts backend lsa, sync global: one counter, one wait):
 *   placement  deferred: every layer's GEMMs, then the puts, on one stream;
 *              stream_overlap: the puts of a group on side stream 0 while the next group is multiplied, cuBLAS
 *              held to fewer SMs (cublasSetSmCountTarget) so that the puts have SMs to run on
 *   issuer     cta or warp: the put kernel's unit that owns a contiguous slice of rows
 *   chunks     layers per put kernel (1 = one per layer; more = fewer, larger puts)
 *
 * A barrier opens each run on the put stream: the prefill rank stores into no pool before the decode rank has
 * finished its previous run and the runner has poisoned its pool for this one. Counters only grow (zeroed once,
 * in setup): it reaches epoch * groups * units once this run's puts have all landed.
 * Requires: KV*D a multiple of 8 (rows of 16-byte vectors); (workload.toml) pool and block_table symmetric, all
 * ranks in one LSA team, one side stream.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_strategy.cuh"

using namespace cuco::point;
constexpr bool kOverlap = kPlacement == Placement::StreamOverlap;
constexpr int kLayersPerPut = kChunks;

// ---- Constants ---------------------------------------------------------------------------------------

// The put kernel's shape. Deferred, the puts have the GPU to themselves: the collective library's grid, which
// reaches about 87% of the peer link (benchmarks/results/collectives.md). Overlapped, they share it with cuBLAS as
// a bulk put (cuco::kBulkPutCtas on the cuco::kBulkPutSms cuBLAS leaves).
constexpr int kPutThreads = CUCO_COLL_THREADS;
constexpr int kPutCtas = kOverlap ? cuco::kBulkPutCtas : CUCO_COLL_CTAS;
constexpr int kUnitsPerPut = cuco::IssuerUnit<kIssuer>::perKernel(kPutCtas, kPutThreads);
constexpr int kMaxGroups = 128;  // put kernels of a run (events): 128 layers at one layer per put
constexpr int kVec = 8;          // bf16 values per 16-byte vector
constexpr int kWarp = cuco::kWarpSize;
constexpr int kUnroll = 4;       // 16-byte loads in flight per lane: one 2 KB row (KV*D = 1024) per warp per pass
using Elem = __nv_bfloat16;

// The arrival counter: how many units of the prefill rank's put kernels have landed here, over all runs.
static cuco::Counters counters;

struct State : cuco::Common<kMaxGroups> {};  // chunkReady[g]: put group g's layers multiplied

struct Shape {
  int64_t S, L, HID, cols, page, pool, groups;
};

static Shape shapeOf(const cuco_ctx_t* ctx) {
  Shape sh;
  sh.S = cuco_param(ctx, "S"), sh.L = cuco_param(ctx, "L"), sh.HID = cuco_param(ctx, "HID");
  sh.cols = cuco_param(ctx, "KV") * cuco_param(ctx, "D"), sh.page = cuco_param(ctx, "PAGE");
  sh.pool = cuco_param(ctx, "POOL");
  sh.groups = (sh.L + kLayersPerPut - 1) / kLayersPerPut;
  return sh;
}

// ---- The put kernel ----------------------------------------------------------------------------------

// Layers [l0, l1): every token's K and V row of staging into the decode rank's pool at the page its block table
// names. The rows (layer, half, token) are cut into one contiguous slice per unit; the unit's warps take the
// slice's rows in turn (the page lookup once per row), a warp's lanes the row's 16-byte vectors, kUnroll loads
// in flight before their stores. Then each unit bumps the decode rank's counter.
template <Issuer I>
__global__ void __launch_bounds__(kPutThreads) putKernel(ncclDevComm devComm, ncclDevResourceHandle_t counterHandle,
                                                         ncclWindow_t poolWin, ncclWindow_t tableWin, int decode,
                                                         const uint4* stage, int l0, int l1, int64_t S, int64_t page,
                                                         int64_t pool, int rowVecs) {
  using Unit = cuco::IssuerUnit<I>;
  const cuco::Worker me = Unit::self();
  const int warp = me.lane / kWarp, warps = (me.lanes + kWarp - 1) / kWarp, lane = me.lane % kWarp;
  const int32_t* table = (const int32_t*)ncclGetLsaPointer(tableWin, 0, decode);
  uint4* dst = (uint4*)ncclGetLsaPointer(poolWin, 0, decode);
  const int64_t rows = (int64_t)(l1 - l0) * 2 * S, per = (rows + me.count - 1) / me.count;
  const int64_t lo = per * me.index, hi = lo + per < rows ? lo + per : rows;
  const uint4* src = stage + (int64_t)l0 * 2 * S * rowVecs;
  for (int64_t row = lo + warp; row < hi; row += warps) {  // row = (layer - l0, half, token)
    const int64_t t = row % S, half = (row / S) % 2, layer = l0 + row / (2 * S);
    const int64_t slot = (layer * pool + __ldg(&table[t / page])) * 2 * page + half * page + t % page;
    const uint4* from = src + row * rowVecs;
    uint4* to = dst + slot * rowVecs;
    for (int c = lane; c < rowVecs; c += kWarp * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (c + u * kWarp < rowVecs) v[u] = __ldg(&from[c + u * kWarp]);
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (c + u * kWarp < rowVecs) to[c + u * kWarp] = v[u];
    }
  }
  Unit::sync();  // every thread of the unit has issued its stores before lane 0 releases them
  if (me.lane == 0) cuco::bumpCounter(devComm, counterHandle, decode, 0);
}

// ---- The prefill rank's work -------------------------------------------------------------------------

static int gemms(cuco_ctx_t* ctx, State* s, const Shape& sh, int l0, int l1) {
  const Elem* x = (const Elem*)cuco_buffer(ctx, "x")->ptr;
  const Elem* wk = (const Elem*)cuco_buffer(ctx, "wk")->ptr;
  const Elem* wv = (const Elem*)cuco_buffer(ctx, "wv")->ptr;
  Elem* stage = (Elem*)cuco_buffer(ctx, "kv_stage")->ptr;
  for (int64_t l = l0; l < l1; l++) {
    Elem* kv = stage + l * 2 * sh.S * sh.cols;
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wk + l * sh.HID * sh.cols, kv, sh.S, sh.HID, sh.cols));
    CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wv + l * sh.HID * sh.cols, kv + sh.S * sh.cols, sh.S, sh.HID, sh.cols));
  }
  return 0;
}

static int put(cuco_ctx_t* ctx, const Shape& sh, cudaStream_t st, int g) {
  const int l0 = g * kLayersPerPut, l1 = (int)(l0 + kLayersPerPut < sh.L ? l0 + kLayersPerPut : sh.L);
  putKernel<kIssuer><<<kPutCtas, kPutThreads, 0, st>>>(
      *ctx->devComm, counters.handle, cuco_buffer(ctx, "pool")->window, cuco_buffer(ctx, "block_table")->window,
      ctx->nRanks - 1, (const uint4*)cuco_buffer(ctx, "kv_stage")->ptr, l0, l1, sh.S, sh.page, sh.pool,
      (int)(sh.cols / kVec));
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

static int prefill(cuco_ctx_t* ctx, State* s, const Shape& sh) {
  if (!kOverlap) {
    CUCO_TRY(gemms(ctx, s, sh, 0, (int)sh.L));
    for (int g = 0; g < sh.groups; g++) CUCO_TRY(put(ctx, sh, ctx->stream, g));
    return 0;
  }
  cudaStream_t side = ctx->sideStreams[0];
  for (int g = 0; g < sh.groups; g++) {
    const int l0 = g * kLayersPerPut;
    CUCO_TRY(gemms(ctx, s, sh, l0, (int)(l0 + kLayersPerPut < sh.L ? l0 + kLayersPerPut : sh.L)));
    CUCO_CUDA(ctx, cuco::streamAfter(side, ctx->stream, s->chunkReady[g]));
    CUCO_TRY(put(ctx, sh, side, g));
  }
  return 0;
}

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = 1;
  counters.require(reqs, 1);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  const Shape sh = shapeOf(ctx);
  if (sh.groups > kMaxGroups) CUCO_FAIL(ctx, "at most %d put groups, got %ld", kMaxGroups, (long)sh.groups);
  if (sh.cols % kVec) CUCO_FAIL(ctx, "KV*D must be a multiple of %d", kVec);
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, kOverlap ? cuco::kBulkPutSms : 0));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const Shape sh = shapeOf(ctx);
  s->epoch++;
  if (kOverlap) CUCO_CUDA(ctx, cuco::streamAfter(ctx->sideStreams[0], ctx->stream, s->fork));
  // Every rank meets at the run's barrier; the prefill rank's on its put stream, ahead of the first put.
  CUCO_CUDA(ctx, cuco::barrier(*ctx->devComm, kOverlap && ctx->rank == 0 ? ctx->sideStreams[0] : ctx->stream));
  if (ctx->rank == 0) CUCO_TRY(prefill(ctx, s, sh));
  if (ctx->rank == ctx->nRanks - 1) {
    const unsigned long long target = s->epoch * sh.groups * (unsigned long long)kUnitsPerPut;
    CUCO_CUDA(ctx, counters.await(*ctx->devComm, ctx->stream, 0, 1, target));
  }
  if (kOverlap) CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, ctx->sideStreams[0], s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
