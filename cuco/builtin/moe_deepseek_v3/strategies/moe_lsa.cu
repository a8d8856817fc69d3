/*************************************************************************
 * MoE layer with expert parallelism whose dispatch and combine are stores from the GPU (LSA), overlapped with the
 * experts.
 *
 * Each rank routes and sorts its pairs (cuco_moe.cuh); one kernel meets every rank, stores this rank's per-expert
 * counts into every rank's `counts` window and meets again: every rank holds every rank's counts, no collective.
 * The host copies them back (the one host wait: cuBLAS takes its sizes from the host) and lays out the moves as
 * runs of rows:
 *   dispatch  each run of this rank's sorted rows for one expert, stored straight into the owner's `dispatch`
 *             window at that expert's place in the owner's expert-major order (no regrouping pass);
 *   combine   each run of an expert's outputs, stored straight into the source rank's `combine` window at its
 *             pairs' sorted places.
 * The unit that moves a run bumps a counter of the receiving rank once its stores are issued; the receiving stream
 * waits on the counter before it reads. Counters only grow (zeroed once, in setup): each rank keeps the running
 * totals it waits for.
 * The design point (cuco_design_point.cuh; workload.toml accepts backend lsa):
 *   placement  deferred: dispatch, wait, every expert, combine, wait, on one stream |
 *              stream_overlap: the dispatch on side stream 0; the experts in `chunks` groups, each started once
 *              its rows have arrived; each group's combine on side stream 1 while the next group computes, cuBLAS
 *              held to all SMs but cuco::kBulkPutSms (cublasSetSmCountTarget) so that the stores have SMs to run on
 *   sync       global: one dispatch counter (the experts wait for the whole dispatch) | chunk: one per group
 *   issuer     cta or warp: the unit that moves one run and signals it
 *   chunks     groups of consecutive local experts
 * Requires: HID and FF multiples of 8; (workload.toml) dispatch, combine and counts symmetric, all ranks in one LSA
 * team, two side streams.
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_moe.cuh"
#include "cuco_strategy.cuh"

using namespace cuco::point;
constexpr bool kOverlap = kPlacement == Placement::StreamOverlap;
constexpr bool kPerGroup = kSync == Sync::Chunk;
constexpr int kGroups = kChunks;

// ---- Constants ---------------------------------------------------------------------------------------

constexpr int kVec = 8;  // bf16 values per 16-byte vector
// The put kernel's shape: a bulk put beside the experts' GEMMs (cuco::kBulkPutCtas), as the KV transfer's.
constexpr int kPutCtas = cuco::kBulkPutCtas;
constexpr int kPutThreads = CUCO_COLL_THREADS;
// Counters: [0, kMaxChunks) the dispatch's (one per group, or counter 0 alone under sync global), then the combine's.
constexpr int kCombineCounter = cuco::kMaxChunks;
static_assert(cuco::kMaxChunks <= cuco::moe::kMaxGroups, "a group per chunk");
constexpr int kCounters = kCombineCounter + 1;
using Elem = __nv_bfloat16;

using cuco::moe::Layout;
using cuco::moe::Run;

static cuco::Counters counters;

// Events: fork starts the dispatch stream, join brings it back; chunkReady[g]: group g's experts are done.
struct State : cuco::Common<> {
  cuco::moe::Routing routing;
  Elem *sendRows, *h13, *h, *out;
  int32_t* hostCounts;  // pinned, [world][E]
  Run *hostRuns, *runs;  // pinned and device: the dispatch's runs, then the combine's
  cudaEvent_t combined;  // the combine stream brought back
  unsigned long long dispatchSeen[cuco::kMaxChunks], combineSeen;  // running totals of runs into this rank

  int create(cuco_ctx_t* ctx, int reservedSms) {
    CUCO_TRY(Common::create(ctx, reservedSms));
    CUCO_CUDA(ctx, cuco::createEvents(&combined, 1));
    return 0;
  }
  int destroy(cuco_ctx_t* ctx) {
    CUCO_CUDA(ctx, cuco::moe::freeRouting(&routing));
    for (void* p : {(void*)sendRows, (void*)h13, (void*)h, (void*)out, (void*)runs}) CUCO_CUDA(ctx, cudaFree(p));
    CUCO_CUDA(ctx, cudaFreeHost(hostCounts));
    CUCO_CUDA(ctx, cudaFreeHost(hostRuns));
    CUCO_CUDA(ctx, cuco::destroyEvents(&combined, 1));
    return Common::destroy(ctx);
  }
};

struct Shape {
  int64_t T, HID, K, FF;
  cuco::moe::Split split;  // the experts over the ranks, in `chunks` groups (one per local expert if fewer)
};

static Shape shapeOf(const cuco_ctx_t* ctx) {
  Shape sh;
  sh.T = cuco_param(ctx, "T"), sh.HID = cuco_param(ctx, "HID"), sh.K = cuco_param(ctx, "TOPK");
  sh.FF = cuco_param(ctx, "FF");
  cuco::moe::Split& sp = sh.split;
  sp.E = cuco_param(ctx, "E"), sp.local = sp.E / ctx->nRanks, sp.world = ctx->nRanks;
  sp.groups = (int)(kGroups < sp.local ? kGroups : sp.local);
  sp.perGroup = kPerGroup, sp.combineCounter = kCombineCounter;
  return sh;
}

// ---- Kernels -----------------------------------------------------------------------------------------

// Every rank meets (its previous run is over, its windows restaged), stores its counts row into every rank's
// `counts` window, and meets again: then every rank's counts are in every window.
__global__ void shareCountsKernel(ncclDevComm devComm, ncclWindow_t countsWin, int E) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier, 0};
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  const int me = devComm.lsaRank;
  const int32_t* mine = (const int32_t*)ncclGetLsaPointer(countsWin, 0, me) + (int64_t)me * E;
  for (int p = 0; p < devComm.lsaSize; p++) {
    if (p == me) continue;
    int32_t* theirs = (int32_t*)ncclGetLsaPointer(countsWin, 0, p) + (int64_t)me * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) theirs[e] = mine[e];
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

// Runs [r0, r1) of the table, one unit per run in turn: its rows stored into the receiver's window, then the
// receiver's counter bumped.
template <Issuer I>
__global__ void __launch_bounds__(kPutThreads) putRunsKernel(ncclDevComm devComm, ncclDevResourceHandle_t handle,
                                                             ncclWindow_t win, const uint4* src, const Run* runs,
                                                             int r0, int r1, int rowVecs) {
  using Unit = cuco::IssuerUnit<I>;
  const cuco::Worker me = Unit::self();
  for (int r = r0 + me.index; r < r1; r += me.count) {
    const Run run = runs[r];
    uint4* dst = (uint4*)ncclGetLsaPointer(win, 0, run.dst) + (int64_t)run.dstRow * rowVecs;
    const uint4* from = src + (int64_t)run.src * rowVecs;
    for (int64_t i = me.lane; i < (int64_t)run.n * rowVecs; i += me.lanes) dst[i] = from[i];
    Unit::sync();  // every thread of the unit has issued its stores before lane 0 releases them
    if (me.lane == 0) cuco::bumpCounter(devComm, handle, run.dst, run.counter);
  }
}

// ---- The experts -------------------------------------------------------------------------------------

// Local experts [e0, e1): SwiGLU FFNs on their rows of the expert-major `dispatch`, into `out`.
static int experts(cuco_ctx_t* ctx, State* s, const Shape& sh, const Layout& L, int64_t e0, int64_t e1) {
  const Elem* grouped = (const Elem*)cuco_buffer(ctx, "dispatch")->ptr;
  const Elem* w13 = (const Elem*)cuco_buffer(ctx, "w13")->ptr;
  const Elem* w2 = (const Elem*)cuco_buffer(ctx, "w2")->ptr;
  for (int64_t e = e0; e < e1; e++) {
    const int64_t at = L.expertAt[e], n = L.expertAt[e + 1] - at;
    if (n) CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, grouped + at * sh.HID, w13 + e * sh.HID * 2 * sh.FF,
                                           s->h13 + at * 2 * sh.FF, n, sh.HID, 2 * sh.FF));
  }
  const int64_t r0 = L.expertAt[e0], rows = L.expertAt[e1] - r0;
  if (rows) {
    cuco::moe::swiglu<<<cuco::moe::blocksFor(rows * sh.FF), cuco::moe::kThreads, 0, ctx->stream>>>(
        s->h13 + r0 * 2 * sh.FF, s->h + r0 * sh.FF, rows, sh.FF);
    CUCO_CUDA(ctx, cudaGetLastError());
  }
  for (int64_t e = e0; e < e1; e++) {
    const int64_t at = L.expertAt[e], n = L.expertAt[e + 1] - at;
    if (n) CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, s->h + at * sh.FF, w2 + e * sh.FF * sh.HID, s->out + at * sh.HID,
                                           n, sh.FF, sh.HID));
  }
  return 0;
}

static int put(cuco_ctx_t* ctx, State* s, const Shape& sh, cudaStream_t st, const char* win, const Elem* src, int r0,
               int r1) {
  if (r1 <= r0) return 0;
  putRunsKernel<kIssuer><<<kPutCtas, kPutThreads, 0, st>>>(*ctx->devComm, counters.handle, cuco_buffer(ctx, win)->window,
                                                          (const uint4*)src, s->runs, r0, r1, (int)(sh.HID / kVec));
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

static int await(cuco_ctx_t* ctx, int counter, unsigned long long target) {
  CUCO_CUDA(ctx, counters.await(*ctx->devComm, ctx->stream, counter, counter + 1, target));
  return 0;
}

// ---- Entry points ----------------------------------------------------------------------------------

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = 1;
  counters.require(reqs, kCounters);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  const Shape sh = shapeOf(ctx);
  const int world = ctx->nRanks;
  if (sh.K > cuco::moe::kMaxTopK) CUCO_FAIL(ctx, "TOPK at most %d, got %ld", cuco::moe::kMaxTopK, (long)sh.K);
  if (sh.split.E > cuco::moe::kMaxExperts) CUCO_FAIL(ctx, "at most %d experts, got %ld", cuco::moe::kMaxExperts, (long)sh.split.E);
  if (sh.HID % kVec || sh.FF % kVec) CUCO_FAIL(ctx, "HID and FF must be multiples of %d", kVec);
  State* s;
  CUCO_TRY(cuco::newState(ctx, &s, kOverlap ? cuco::kBulkPutSms : 0));
  const int64_t pairs = sh.T * sh.K, rows = world * pairs;  // this rank's pairs; the most its experts can get
  CUCO_CUDA(ctx, cuco::moe::allocRouting(&s->routing, sh.T, sh.split.E, sh.K));
  CUCO_CUDA(ctx, cudaMalloc(&s->sendRows, pairs * sh.HID * sizeof(Elem)));
  CUCO_CUDA(ctx, cudaMalloc(&s->h13, rows * 2 * sh.FF * sizeof(Elem)));
  CUCO_CUDA(ctx, cudaMalloc(&s->h, rows * sh.FF * sizeof(Elem)));
  CUCO_CUDA(ctx, cudaMalloc(&s->out, rows * sh.HID * sizeof(Elem)));
  const int64_t maxRuns = 2 * world * sh.split.local;  // one per (rank, local expert) each way
  CUCO_CUDA(ctx, cudaMallocHost(&s->hostCounts, world * sh.split.E * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMallocHost(&s->hostRuns, maxRuns * sizeof(Run)));
  CUCO_CUDA(ctx, cudaMalloc(&s->runs, maxRuns * sizeof(Run)));
  CUCO_CUDA(ctx, counters.reset(*ctx->devComm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const Shape sh = shapeOf(ctx);
  const int world = ctx->nRanks, me = ctx->rank;
  cudaStream_t st = ctx->stream;
  int32_t* counts = (int32_t*)cuco_buffer(ctx, "counts")->ptr;

  // 1. Route and sort; every rank's counts into every window; the counts to the host.
  CUCO_CUDA(ctx, cuco::moe::route(s->routing, (const float*)cuco_buffer(ctx, "logits")->ptr,
                                  (const Elem*)cuco_buffer(ctx, "x")->ptr, s->sendRows, counts + (int64_t)me * sh.split.E,
                                  sh.T, sh.split.E, sh.K, sh.HID, st));
  shareCountsKernel<<<1, cuco::kSmallKernelThreads, 0, st>>>(*ctx->devComm, cuco_buffer(ctx, "counts")->window,
                                                             (int)sh.split.E);
  CUCO_CUDA(ctx, cudaGetLastError());
  CUCO_CUDA(ctx, cudaMemcpyAsync(s->hostCounts, counts, world * sh.split.E * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  CUCO_CUDA(ctx, cudaStreamSynchronize(st));

  // 2. The runs, and what this rank waits for.
  Layout L;
  cuco::moe::layout(sh.split, me, s->hostCounts, s->hostRuns, &L);
  for (int g = 0; g < sh.split.groups; g++) s->dispatchSeen[g] += L.dispatchIn[g];
  s->combineSeen += L.combineIn;
  if (L.nRuns) CUCO_CUDA(ctx, cudaMemcpyAsync(s->runs, s->hostRuns, L.nRuns * sizeof(Run), cudaMemcpyHostToDevice, st));

  // 3. Dispatch; each group of experts once its rows are in; its outputs back to their ranks.
  cudaStream_t dispatchStream = kOverlap ? ctx->sideStreams[0] : st, combineStream = kOverlap ? ctx->sideStreams[1] : st;
  if (kOverlap) CUCO_CUDA(ctx, cuco::streamAfter(dispatchStream, st, s->fork));
  CUCO_TRY(put(ctx, s, sh, dispatchStream, "dispatch", s->sendRows, 0, L.nDispatch));
  for (int g = 0; g < sh.split.groups; g++) {
    if (kPerGroup || g == 0) CUCO_TRY(await(ctx, g, s->dispatchSeen[g]));
    CUCO_TRY(experts(ctx, s, sh, L, cuco::moe::groupStart(sh.split, g), cuco::moe::groupStart(sh.split, g + 1)));
    if (kOverlap) {
      CUCO_CUDA(ctx, cuco::streamAfter(combineStream, st, s->chunkReady[g]));
      CUCO_TRY(put(ctx, s, sh, combineStream, "combine", s->out, L.combineAt[g], L.combineAt[g + 1]));
    }
  }
  if (!kOverlap) CUCO_TRY(put(ctx, s, sh, st, "combine", s->out, L.combineAt[0], L.combineAt[sh.split.groups]));

  // 4. Every output of this rank's pairs is in; the weighted sum per token.
  CUCO_TRY(await(ctx, kCombineCounter, s->combineSeen));
  cuco::moe::combineRows<<<cuco::moe::blocksFor(sh.T * sh.HID), cuco::moe::kThreads, 0, st>>>(
      (const Elem*)cuco_buffer(ctx, "combine")->ptr, s->routing.slot, s->routing.weight,
      (Elem*)cuco_buffer(ctx, "y")->ptr, (int)sh.T, (int)sh.K, sh.HID);
  CUCO_CUDA(ctx, cudaGetLastError());
  if (kOverlap) {
    CUCO_CUDA(ctx, cuco::streamAfter(st, dispatchStream, s->join));
    CUCO_CUDA(ctx, cuco::streamAfter(st, combineStream, s->combined));
  }
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
