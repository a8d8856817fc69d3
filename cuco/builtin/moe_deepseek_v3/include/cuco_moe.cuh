/*************************************************************************
 * cuco_moe.cuh: the pieces of an MoE layer that do not communicate, shared by its seed and its strategies.
 *
 *   routeTopK      top-k experts per token by logit (one warp per token), weights softmax-normalised over them
 *   countChunks, scanChunks, placePairs
 *                  a stable counting sort of the token-expert pairs by expert (bitwise the same every run)
 *   gatherRows     rows gathered by an index (the tokens' rows in sorted order), with the inverse permutation
 *   moveSegments   runs of rows moved by a (from, to, count) table, one block per run
 *   swiglu         h = silu(g) * u over rows of [g | u]
 *   combineRows    y[t] = sum_j weight[t, j] * row(t, j) in fp32, j in order
 *   Routing, route  the first four, launched in order on one stream, over buffers sized for T tokens
 *   Layout, layout  expert parallelism's moves as runs of rows, from every rank's counts (host code): where each
 *                   rank's sorted rows land in the experts' owners' expert-major order, and where the experts'
 *                   outputs go back in the sources' sorted order
 *************************************************************************/
#ifndef CUCO_MOE_CUH_
#define CUCO_MOE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <vector>

namespace cuco {
namespace moe {

constexpr int kMaxTopK = 16;     // DeepSeek-V3 picks 8
constexpr int kThreads = 256;
constexpr int kMaxGroups = 16;  // groups of local experts a layout may have
constexpr int kSortChunk = 1024;  // pairs per block of the counting sort (one thread each)
constexpr int kMaxExperts = 1024;  // the sort's scan runs one thread per expert in one block; DeepSeek-V3 has 256

// Top-k of one token's logits (one warp per token): largest first, ties to the lower expert index.
__global__ void routeTopK(const float* logits, int32_t* expert, float* weight, int T, int E, int K) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= T) return;
  const float* row = logits + (int64_t)warp * E;
  int picked[kMaxTopK];
  float value[kMaxTopK];
  for (int j = 0; j < K; j++) {
    float best = -INFINITY;
    int bestE = E;
    for (int e = lane; e < E; e += 32) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= picked[i] == e;
      const float v = row[e];
      if (!taken && (v > best || (v == best && e < bestE))) best = v, bestE = e;
    }
    for (int off = 16; off > 0; off /= 2) {
      const float v = __shfl_xor_sync(0xffffffffu, best, off);
      const int i = __shfl_xor_sync(0xffffffffu, bestE, off);
      if (v > best || (v == best && i < bestE)) best = v, bestE = i;
    }
    picked[j] = bestE;
    value[j] = best;
  }
  if (lane == 0) {
    float sum = 0.f;
    for (int j = 0; j < K; j++) sum += expf(value[j] - value[0]);
    for (int j = 0; j < K; j++) {
      expert[(int64_t)warp * K + j] = picked[j];
      weight[(int64_t)warp * K + j] = expf(value[j] - value[0]) / sum;
    }
  }
}

// The stable counting sort of the pairs by expert, in three passes over chunks of kSortChunk pairs:
// chunkCounts[c][e] = pairs of chunk c with expert e (integer atomics: the counts do not depend on their order).
__global__ void countChunks(const int32_t* expert, int n, int E, int32_t* chunkCounts) {
  __shared__ int32_t count[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int i = blockIdx.x * kSortChunk + threadIdx.x;
  if (i < n) atomicAdd(&count[expert[i]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunkCounts[(int64_t)blockIdx.x * E + e] = count[e];
}

// offsets[c][e]: where chunk c's pairs of expert e start in the sorted order (expert-major, then chunk order);
// totals[e]: the pairs of expert e. One block, one thread per expert.
__global__ void scanChunks(const int32_t* chunkCounts, int chunks, int E, int32_t* offsets, int32_t* totals) {
  __shared__ int32_t start[kMaxExperts];
  const int e = threadIdx.x;
  int32_t total = 0;
  if (e < E)
    for (int c = 0; c < chunks; c++) total += chunkCounts[(int64_t)c * E + e];
  if (e < E) start[e] = total;
  __syncthreads();
  if (e == 0) {  // exclusive scan over at most kMaxExperts totals
    int32_t run = 0;
    for (int x = 0; x < E; x++) {
      const int32_t t = start[x];
      start[x] = run;
      run += t;
    }
  }
  __syncthreads();
  if (e < E) {
    totals[e] = total;
    int32_t at = start[e];
    for (int c = 0; c < chunks; c++) {
      offsets[(int64_t)c * E + e] = at;
      at += chunkCounts[(int64_t)c * E + e];
    }
  }
}

// order[offsets[c][e] + (earlier pairs of chunk c with expert e)] = i: stable, so every run sorts alike.
__global__ void placePairs(const int32_t* expert, int n, int E, const int32_t* offsets, int32_t* order) {
  __shared__ int32_t mine[kSortChunk];
  const int i = blockIdx.x * kSortChunk + threadIdx.x;
  mine[threadIdx.x] = i < n ? expert[i] : -1;
  __syncthreads();
  if (i >= n) return;
  int32_t rank = 0;
  for (int j = 0; j < (int)threadIdx.x; j++) rank += mine[j] == mine[threadIdx.x];
  order[offsets[(int64_t)blockIdx.x * E + mine[threadIdx.x]] + rank] = i;
}

// dst[i] = src[index[i] / div] for rows of rowVecs 16-byte vectors; inverse[index[i]] = i where asked.
__global__ void gatherRows(const uint4* src, uint4* dst, const int32_t* index, int div, int n, int64_t rowVecs,
                           int32_t* inverse) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * rowVecs; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / rowVecs, v = i % rowVecs;
    dst[i] = src[(int64_t)(index[r] / div) * rowVecs + v];
    if (inverse && v == 0) inverse[index[r]] = (int32_t)r;
  }
}

// Segment s: count rows from src + from[s] to dst + to[s] (one block per segment).
__global__ void moveSegments(const uint4* src, uint4* dst, const int32_t* table, int64_t rowVecs) {
  const int32_t from = table[3 * blockIdx.x], to = table[3 * blockIdx.x + 1], count = table[3 * blockIdx.x + 2];
  for (int64_t i = threadIdx.x; i < count * rowVecs; i += blockDim.x) dst[to * rowVecs + i] = src[from * rowVecs + i];
}

// h[r, c] = silu(g) * u for h13 = [g | u] rows of 2 FF.
__global__ void swiglu(const __nv_bfloat16* h13, __nv_bfloat16* h, int64_t rows, int64_t ff) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * ff; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / ff, c = i % ff;
    const float g = __bfloat162float(h13[r * 2 * ff + c]), u = __bfloat162float(h13[r * 2 * ff + ff + c]);
    h[i] = __float2bfloat16(g / (1.f + expf(-g)) * u);
  }
}

// y[t] = sum_j weight[t, j] * rows[slot[t K + j]], in fp32, j in order.
__global__ void combineRows(const __nv_bfloat16* rows, const int32_t* slot, const float* weight, __nv_bfloat16* y,
                            int T, int K, int64_t hid) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T * hid; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / hid, c = i % hid;
    float acc = 0.f;
    for (int j = 0; j < K; j++) acc += weight[t * K + j] * __bfloat162float(rows[(int64_t)slot[t * K + j] * hid + c]);
    y[i] = __float2bfloat16(acc);
  }
}

inline int blocksFor(int64_t n) { return (int)((n + kThreads - 1) / kThreads < 65535 ? (n + kThreads - 1) / kThreads : 65535); }

// A rank's routing, sorted: expert and weight per pair (token t's j-th choice is pair t K + j), order[r] = the pair at
// sorted position r, slot = its inverse, and the rank's pairs per expert.
struct Routing {
  int32_t *expert, *chunkCounts, *chunkOffsets, *order, *slot;
  float* weight;
};

inline cudaError_t allocRouting(Routing* r, int64_t T, int64_t E, int64_t K) {
  const int64_t pairs = T * K, chunks = (pairs + kSortChunk - 1) / kSortChunk;
  cudaError_t err = cudaSuccess;
  for (int32_t** p : {&r->expert, &r->order, &r->slot})
    if (err == cudaSuccess) err = cudaMalloc(p, pairs * sizeof(int32_t));
  for (int32_t** p : {&r->chunkCounts, &r->chunkOffsets})
    if (err == cudaSuccess) err = cudaMalloc(p, chunks * E * sizeof(int32_t));
  return err == cudaSuccess ? cudaMalloc(&r->weight, pairs * sizeof(float)) : err;
}

inline cudaError_t freeRouting(Routing* r) {
  cudaError_t err = cudaSuccess;
  for (void* p : {(void*)r->expert, (void*)r->order, (void*)r->slot, (void*)r->chunkCounts, (void*)r->chunkOffsets,
                  (void*)r->weight})
    if (cudaError_t e = cudaFree(p); err == cudaSuccess) err = e;
  return err;
}

// Route T tokens over E experts, sort the pairs by expert, gather the tokens' rows (hid bf16) in sorted order into
// `sorted`, and the pairs per expert into `totals` (E int32). E <= kMaxExperts, K <= kMaxTopK, hid % 8 == 0.
inline cudaError_t route(const Routing& r, const float* logits, const __nv_bfloat16* x, __nv_bfloat16* sorted,
                         int32_t* totals, int64_t T, int64_t E, int64_t K, int64_t hid, cudaStream_t st) {
  const int64_t pairs = T * K, rowVecs = hid / 8;
  const int chunks = (int)((pairs + kSortChunk - 1) / kSortChunk);
  routeTopK<<<blocksFor(T * 32), kThreads, 0, st>>>(logits, r.expert, r.weight, (int)T, (int)E, (int)K);
  countChunks<<<chunks, kSortChunk, 0, st>>>(r.expert, (int)pairs, (int)E, r.chunkCounts);
  scanChunks<<<1, kMaxExperts, 0, st>>>(r.chunkCounts, chunks, (int)E, r.chunkOffsets, totals);
  placePairs<<<chunks, kSortChunk, 0, st>>>(r.expert, (int)pairs, (int)E, r.chunkOffsets, r.order);
  gatherRows<<<blocksFor(pairs * rowVecs), kThreads, 0, st>>>((const uint4*)x, (uint4*)sorted, r.order, (int)K,
                                                              (int)pairs, rowVecs, r.slot);
  return cudaGetLastError();
}

// ---- The moves of expert parallelism, laid out on the host ----------------------------------------------

// Rows [src, src + n) of the sending buffer go to rank dst's window at row dstRow; then dst's counter is bumped.
struct Run {
  int32_t src, dst, dstRow, n, counter;
};

// How the experts are split: E experts, `local` per rank over `world` ranks, in `groups` groups of consecutive
// local experts; the dispatch signals one counter per group (perGroup) or counter 0, the combine combineCounter.
struct Split {
  int64_t E, local;
  int world, groups;
  bool perGroup;
  int combineCounter;
};

// One rank's runs: the dispatch's [0, nDispatch) (this rank's sorted rows, the receivers' group 0 first), then the
// combine's, group g's from combineAt[g] (its experts' outputs back to the sources); where each local expert's rows
// start in this rank's expert-major order (expertAt, local + 1 entries); and the runs each of this rank's counters
// receives (dispatchIn per counter, combineIn).
struct Layout {
  int nDispatch, nRuns;
  int combineAt[kMaxGroups + 1];
  int64_t expertAt[kMaxExperts + 1];
  unsigned long long dispatchIn[kMaxGroups], combineIn;
};

// Group g holds local experts [groupStart(g), groupStart(g + 1)).
inline int64_t groupStart(const Split& sp, int g) { return g * sp.local / sp.groups; }

inline int groupOf(const Split& sp, int64_t e) {
  int g = sp.groups - 1;
  while (groupStart(sp, g) > e) g--;
  return g;
}

// `runs` holds at least 2 * world * local entries (one per rank and local expert, each way).
inline void layout(const Split& sp, int me, const int32_t* c, Run* runs, Layout* L) {
  const int64_t E = sp.E, local = sp.local;
  auto count = [&](int q, int p, int64_t e) { return (int64_t)c[(int64_t)q * E + p * local + e]; };
  // sorted[q][x]: row of rank q's sorted order where its pairs for global expert x start; owned[p][e]: row of rank
  // p's expert-major order where its local expert e starts. Prefix sums, once per layout.
  std::vector<int64_t> sorted(sp.world * (E + 1), 0), owned(sp.world * (local + 1), 0);
  for (int q = 0; q < sp.world; q++)
    for (int64_t x = 0; x < E; x++) sorted[q * (E + 1) + x + 1] = sorted[q * (E + 1) + x] + c[(int64_t)q * E + x];
  for (int p = 0; p < sp.world; p++)
    for (int64_t e = 0; e < local; e++) {
      int64_t n = 0;
      for (int q = 0; q < sp.world; q++) n += count(q, p, e);
      owned[p * (local + 1) + e + 1] = owned[p * (local + 1) + e] + n;
    }
  // Where source q's first pair for rank p's local expert e lands: after the pairs of earlier sources for e.
  auto landing = [&](int p, int q, int64_t e) {
    int64_t at = owned[p * (local + 1) + e];
    for (int s = 0; s < q; s++) at += count(s, p, e);
    return at;
  };
  int n = 0;
  for (int g = 0; g < sp.groups; g++)
    for (int p = 0; p < sp.world; p++)
      for (int64_t e = groupStart(sp, g); e < groupStart(sp, g + 1); e++)
        if (const int32_t rows = (int32_t)count(me, p, e))
          runs[n++] = {(int32_t)sorted[me * (E + 1) + p * local + e], p, (int32_t)landing(p, me, e), rows,
                       sp.perGroup ? g : 0};
  L->nDispatch = n;
  for (int g = 0; g < sp.groups; g++) {
    L->combineAt[g] = n;
    for (int q = 0; q < sp.world; q++)
      for (int64_t e = groupStart(sp, g); e < groupStart(sp, g + 1); e++)
        if (const int32_t rows = (int32_t)count(q, me, e))
          runs[n++] = {(int32_t)landing(me, q, e), q, (int32_t)sorted[q * (E + 1) + me * local + e], rows,
                       sp.combineCounter};
  }
  L->combineAt[sp.groups] = L->nRuns = n;
  for (int64_t e = 0; e <= local; e++) L->expertAt[e] = owned[me * (local + 1) + e];
  for (int g = 0; g < kMaxGroups; g++) L->dispatchIn[g] = 0;
  L->combineIn = 0;
  for (int q = 0; q < sp.world; q++)
    for (int64_t e = 0; e < local; e++) {
      if (count(q, me, e)) L->dispatchIn[sp.perGroup ? groupOf(sp, e) : 0]++;  // into me
      if (count(me, q, e)) L->combineIn++;  // my pairs, back from rank q's expert e
    }
}

}  // namespace moe
}  // namespace cuco

#endif  // CUCO_MOE_CUH_
