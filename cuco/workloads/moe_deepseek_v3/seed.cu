/*************************************************************************
 * MoE layer with expert parallelism, host-driven, as users write it today (the starting point of co-design).
 *
 * 1. route: top-k experts per token by logit (one warp per token), weights softmax-normalised over them;
 * 2. a stable counting sort of the token-expert pairs by expert, so the pairs for each rank, and within it for
 *    each expert, are contiguous; the tokens' rows gathered in that order;
 * 3. every rank's per-expert counts all-gathered, copied to the host, and waited for;
 * 4. dispatch: ncclSend/ncclRecv of each rank's rows (the all-to-allv), into `dispatch`, source-major;
 * 5. the received rows regrouped expert-major; per local expert, cuBLAS [n, HID] x [HID, 2 FF], SwiGLU,
 *    cuBLAS [n, FF] x [FF, HID]; the outputs put back in the order they came (source-major, in a buffer of the
 *    seed's own);
 * 6. combine: the reverse all-to-allv into `combine`, then y[t] = sum_j weight[t, j] * row(t, j), in fp32 and in
 *    the order j = 0..k-1 (bitwise the same every run).
 * All on ctx->stream; the host waits once, for the counts.
 *
 * Buffers (workload.toml): x [T, HID], logits [T, E] (f32), w13 [E/world, HID, 2 FF], w2 [E/world, FF, HID],
 * y [T, HID], dispatch [world T TOPK, HID], combine [T TOPK, HID], counts [world, E] (i32); bf16 unless said.
 * Evolve blocks: the state and the entry points' bodies; includes and signatures are frozen.
 *************************************************************************/

#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"

// EVOLVE-BLOCK-START
constexpr int kMaxRanks = 8;
constexpr int kMaxTopK = 16;    // DeepSeek-V3 picks 8
constexpr int kThreads = 256;
constexpr int kVec = 8;         // bf16 values per 16-byte vector; HID and FF are multiples of 8 at every shape
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

static int blocksFor(int64_t n) { return (int)((n + kThreads - 1) / kThreads < 65535 ? (n + kThreads - 1) / kThreads : 65535); }

struct State {
  cublasHandle_t blas;
  int32_t *expert, *chunkCounts, *chunkOffsets, *order, *slot, *segments;
  float* weight;
  __nv_bfloat16 *sendRows, *grouped, *h13, *h, *out, *back;
  int32_t *hostCounts, *hostSegments;  // pinned
};
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  const int64_t T = cuco_param(ctx, "T"), HID = cuco_param(ctx, "HID"), E = cuco_param(ctx, "E");
  const int64_t K = cuco_param(ctx, "TOPK"), FF = cuco_param(ctx, "FF"), world = ctx->nRanks;
  if (world > kMaxRanks) CUCO_FAIL(ctx, "at most %d ranks, got %ld", kMaxRanks, (long)world);
  if (K > kMaxTopK) CUCO_FAIL(ctx, "TOPK at most %d, got %ld", kMaxTopK, (long)K);
  if (E > kMaxExperts) CUCO_FAIL(ctx, "at most %d experts, got %ld", kMaxExperts, (long)E);
  if (HID % kVec || FF % kVec) CUCO_FAIL(ctx, "HID and FF must be multiples of %d", kVec);
  State* s = new State();
  ctx->state = s;
  const int64_t pairs = T * K, rows = world * T * K;  // this rank's pairs; the most rows its experts can get
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  CUCO_CUDA(ctx, cudaMalloc(&s->expert, pairs * sizeof(int32_t)));
  const int64_t chunks = (pairs + kSortChunk - 1) / kSortChunk;
  CUCO_CUDA(ctx, cudaMalloc(&s->chunkCounts, chunks * E * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMalloc(&s->chunkOffsets, chunks * E * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMalloc(&s->order, pairs * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMalloc(&s->slot, pairs * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMalloc(&s->segments, 2 * 3 * world * E * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMalloc(&s->weight, pairs * sizeof(float)));
  CUCO_CUDA(ctx, cudaMalloc(&s->sendRows, pairs * HID * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMalloc(&s->grouped, rows * HID * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMalloc(&s->h13, rows * 2 * FF * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMalloc(&s->h, rows * FF * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMalloc(&s->out, rows * HID * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMalloc(&s->back, rows * HID * sizeof(__nv_bfloat16)));
  CUCO_CUDA(ctx, cudaMallocHost(&s->hostCounts, world * E * sizeof(int32_t)));
  CUCO_CUDA(ctx, cudaMallocHost(&s->hostSegments, 2 * 3 * world * E * sizeof(int32_t)));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  const int64_t T = cuco_param(ctx, "T"), HID = cuco_param(ctx, "HID"), E = cuco_param(ctx, "E");
  const int64_t K = cuco_param(ctx, "TOPK"), FF = cuco_param(ctx, "FF");
  const int world = ctx->nRanks, me = ctx->rank;
  const int64_t local = E / world, pairs = T * K, rowVecs = HID / kVec;
  cudaStream_t st = ctx->stream;
  __nv_bfloat16* x = (__nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
  __nv_bfloat16* y = (__nv_bfloat16*)cuco_buffer(ctx, "y")->ptr;
  __nv_bfloat16* w13 = (__nv_bfloat16*)cuco_buffer(ctx, "w13")->ptr;
  __nv_bfloat16* w2 = (__nv_bfloat16*)cuco_buffer(ctx, "w2")->ptr;
  __nv_bfloat16* dispatch = (__nv_bfloat16*)cuco_buffer(ctx, "dispatch")->ptr;
  __nv_bfloat16* combine = (__nv_bfloat16*)cuco_buffer(ctx, "combine")->ptr;
  int32_t* counts = (int32_t*)cuco_buffer(ctx, "counts")->ptr;  // [world][E]: row `me` is this rank's
  int32_t* mine = counts + (int64_t)me * E;

  // 1-2. Route, sort the pairs by expert, gather the rows to send in that order.
  routeTopK<<<blocksFor(T * 32), kThreads, 0, st>>>((const float*)cuco_buffer(ctx, "logits")->ptr, s->expert,
                                                    s->weight, (int)T, (int)E, (int)K);
  CUCO_CUDA(ctx, cudaGetLastError());
  const int chunks = (int)((pairs + kSortChunk - 1) / kSortChunk);
  countChunks<<<chunks, kSortChunk, 0, st>>>(s->expert, (int)pairs, (int)E, s->chunkCounts);
  CUCO_CUDA(ctx, cudaGetLastError());
  scanChunks<<<1, kMaxExperts, 0, st>>>(s->chunkCounts, chunks, (int)E, s->chunkOffsets, mine);
  CUCO_CUDA(ctx, cudaGetLastError());
  placePairs<<<chunks, kSortChunk, 0, st>>>(s->expert, (int)pairs, (int)E, s->chunkOffsets, s->order);
  CUCO_CUDA(ctx, cudaGetLastError());
  gatherRows<<<blocksFor(pairs * rowVecs), kThreads, 0, st>>>((const uint4*)x, (uint4*)s->sendRows, s->order, (int)K,
                                                              (int)pairs, rowVecs, s->slot);
  CUCO_CUDA(ctx, cudaGetLastError());

  // 3. Every rank's counts to the host.
  CUCO_NCCL(ctx, ncclAllGather(mine, counts, E, ncclInt32, ctx->comm, st));
  CUCO_CUDA(ctx, cudaMemcpyAsync(s->hostCounts, counts, world * E * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  CUCO_CUDA(ctx, cudaStreamSynchronize(st));
  const int32_t* c = s->hostCounts;  // c[src * E + e]
  int64_t sendN[kMaxRanks], recvN[kMaxRanks];
  for (int p = 0; p < world; p++) {
    sendN[p] = recvN[p] = 0;
    for (int64_t e = 0; e < local; e++) sendN[p] += c[(int64_t)me * E + p * local + e], recvN[p] += c[(int64_t)p * E + me * local + e];
  }

  // 4. Dispatch: the all-to-allv, source-major into `dispatch`.
  CUCO_NCCL(ctx, ncclGroupStart());
  for (int p = 0, sendAt = 0, recvAt = 0; p < world; p++) {
    CUCO_NCCL(ctx, ncclSend(s->sendRows + sendAt * HID, sendN[p] * HID, ncclBfloat16, p, ctx->comm, st));
    CUCO_NCCL(ctx, ncclRecv(dispatch + recvAt * HID, recvN[p] * HID, ncclBfloat16, p, ctx->comm, st));
    sendAt += (int)sendN[p];
    recvAt += (int)recvN[p];
  }
  CUCO_NCCL(ctx, ncclGroupEnd());

  // 5. Regroup expert-major (segments (src, e): from the source-major offset to the expert-major one), the
  // experts, and back. The same table, from and to swapped, undoes the regrouping.
  int32_t* fwd = s->hostSegments;
  int32_t* bwd = s->hostSegments + 3 * world * local;
  int64_t expertAt[1024 + 1];  // first expert-major row of each local expert
  if (local > 1024) CUCO_FAIL(ctx, "at most 1024 experts per rank, got %ld", (long)local);
  expertAt[0] = 0;
  for (int64_t e = 0; e < local; e++) {
    int64_t n = 0;
    for (int p = 0; p < world; p++) n += c[(int64_t)p * E + me * local + e];
    expertAt[e + 1] = expertAt[e] + n;
  }
  int segs = 0;
  for (int p = 0, srcAt = 0; p < world; p++) {
    for (int64_t e = 0; e < local; e++) {
      const int32_t n = c[(int64_t)p * E + me * local + e];
      int64_t to = expertAt[e];
      for (int q = 0; q < p; q++) to += c[(int64_t)q * E + me * local + e];
      if (n) {
        fwd[3 * segs] = srcAt, fwd[3 * segs + 1] = (int32_t)to, fwd[3 * segs + 2] = n;
        bwd[3 * segs] = (int32_t)to, bwd[3 * segs + 1] = srcAt, bwd[3 * segs + 2] = n;
        segs++;
      }
      srcAt += n;
    }
  }
  const int64_t received = expertAt[local];
  if (segs) {
    int32_t* devFwd = s->segments;
    int32_t* devBwd = s->segments + 3 * world * local;
    CUCO_CUDA(ctx, cudaMemcpyAsync(devFwd, fwd, 3 * segs * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    CUCO_CUDA(ctx, cudaMemcpyAsync(devBwd, bwd, 3 * segs * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    moveSegments<<<segs, kThreads, 0, st>>>((const uint4*)dispatch, (uint4*)s->grouped, devFwd, rowVecs);
    CUCO_CUDA(ctx, cudaGetLastError());
    for (int64_t e = 0; e < local; e++) {
      const int64_t n = expertAt[e + 1] - expertAt[e];
      if (!n) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, s->grouped + expertAt[e] * HID, w13 + e * HID * 2 * FF,
                                      s->h13 + expertAt[e] * 2 * FF, n, HID, 2 * FF));
    }
    swiglu<<<blocksFor(received * FF), kThreads, 0, st>>>(s->h13, s->h, received, FF);
    CUCO_CUDA(ctx, cudaGetLastError());
    for (int64_t e = 0; e < local; e++) {
      const int64_t n = expertAt[e + 1] - expertAt[e];
      if (!n) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, s->h + expertAt[e] * FF, w2 + e * FF * HID, s->out + expertAt[e] * HID,
                                      n, FF, HID));
    }
    moveSegments<<<segs, kThreads, 0, st>>>((const uint4*)s->out, (uint4*)s->back, devBwd, rowVecs);
    CUCO_CUDA(ctx, cudaGetLastError());
  }

  // 6. Combine: the outputs back to the ranks their tokens came from, then the weighted sum per token.
  CUCO_NCCL(ctx, ncclGroupStart());
  for (int p = 0, sendAt = 0, recvAt = 0; p < world; p++) {
    CUCO_NCCL(ctx, ncclSend(s->back + recvAt * HID, recvN[p] * HID, ncclBfloat16, p, ctx->comm, st));
    CUCO_NCCL(ctx, ncclRecv(combine + sendAt * HID, sendN[p] * HID, ncclBfloat16, p, ctx->comm, st));
    sendAt += (int)sendN[p];
    recvAt += (int)recvN[p];
  }
  CUCO_NCCL(ctx, ncclGroupEnd());
  combineRows<<<blocksFor(T * HID), kThreads, 0, st>>>(combine, s->slot, s->weight, y, (int)T, (int)K, HID);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  for (void* p : {(void*)s->expert, (void*)s->chunkCounts, (void*)s->chunkOffsets, (void*)s->order, (void*)s->slot,
                  (void*)s->segments, (void*)s->weight, (void*)s->sendRows, (void*)s->grouped, (void*)s->h13,
                  (void*)s->h, (void*)s->out, (void*)s->back})
    CUCO_CUDA(ctx, cudaFree(p));
  CUCO_CUDA(ctx, cudaFreeHost(s->hostCounts));
  CUCO_CUDA(ctx, cudaFreeHost(s->hostSegments));
  delete s;
  ctx->state = NULL;
  return 0;
  // EVOLVE-BLOCK-END
}
