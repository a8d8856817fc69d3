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
#include "cuco_moe.cuh"

// EVOLVE-BLOCK-START
constexpr int kMaxRanks = 8;
constexpr int kVec = 8;         // bf16 values per 16-byte vector; HID and FF are multiples of 8 at every shape

struct State {
  cublasHandle_t blas;
  cuco::moe::Routing routing;
  int32_t* segments;
  __nv_bfloat16 *sendRows, *grouped, *h13, *h, *out, *back;
  int32_t *hostCounts, *hostSegments;  // pinned
};
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  const int64_t T = cuco_param(ctx, "T"), HID = cuco_param(ctx, "HID"), E = cuco_param(ctx, "E");
  const int64_t K = cuco_param(ctx, "TOPK"), FF = cuco_param(ctx, "FF"), world = ctx->nRanks;
  if (world > kMaxRanks) CUCO_FAIL(ctx, "at most %d ranks, got %ld", kMaxRanks, (long)world);
  if (K > cuco::moe::kMaxTopK) CUCO_FAIL(ctx, "TOPK at most %d, got %ld", cuco::moe::kMaxTopK, (long)K);
  if (E > cuco::moe::kMaxExperts) CUCO_FAIL(ctx, "at most %d experts, got %ld", cuco::moe::kMaxExperts, (long)E);
  if (HID % kVec || FF % kVec) CUCO_FAIL(ctx, "HID and FF must be multiples of %d", kVec);
  State* s = new State();
  ctx->state = s;
  const int64_t pairs = T * K, rows = world * T * K;  // this rank's pairs; the most rows its experts can get
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  CUCO_CUDA(ctx, cuco::moe::allocRouting(&s->routing, T, E, K));
  CUCO_CUDA(ctx, cudaMalloc(&s->segments, 2 * 3 * world * E * sizeof(int32_t)));
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
  const int64_t local = E / world, rowVecs = HID / kVec;
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
  CUCO_CUDA(ctx, cuco::moe::route(s->routing, (const float*)cuco_buffer(ctx, "logits")->ptr, x, s->sendRows, mine, T, E,
                                   K, HID, st));

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
    cuco::moe::moveSegments<<<segs, cuco::moe::kThreads, 0, st>>>((const uint4*)dispatch, (uint4*)s->grouped, devFwd, rowVecs);
    CUCO_CUDA(ctx, cudaGetLastError());
    for (int64_t e = 0; e < local; e++) {
      const int64_t n = expertAt[e + 1] - expertAt[e];
      if (!n) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, s->grouped + expertAt[e] * HID, w13 + e * HID * 2 * FF,
                                      s->h13 + expertAt[e] * 2 * FF, n, HID, 2 * FF));
    }
    cuco::moe::swiglu<<<cuco::moe::blocksFor(received * FF), cuco::moe::kThreads, 0, st>>>(s->h13, s->h, received, FF);
    CUCO_CUDA(ctx, cudaGetLastError());
    for (int64_t e = 0; e < local; e++) {
      const int64_t n = expertAt[e + 1] - expertAt[e];
      if (!n) continue;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, s->h + expertAt[e] * FF, w2 + e * FF * HID, s->out + expertAt[e] * HID,
                                      n, FF, HID));
    }
    cuco::moe::moveSegments<<<segs, cuco::moe::kThreads, 0, st>>>((const uint4*)s->out, (uint4*)s->back, devBwd, rowVecs);
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
  cuco::moe::combineRows<<<cuco::moe::blocksFor(T * HID), cuco::moe::kThreads, 0, st>>>(combine, s->routing.slot, s->routing.weight, y, (int)T, (int)K, HID);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  CUCO_CUDA(ctx, cuco::moe::freeRouting(&s->routing));
  for (void* p : {(void*)s->segments, (void*)s->sendRows, (void*)s->grouped, (void*)s->h13, (void*)s->h, (void*)s->out,
                  (void*)s->back})
    CUCO_CUDA(ctx, cudaFree(p));
  CUCO_CUDA(ctx, cudaFreeHost(s->hostCounts));
  CUCO_CUDA(ctx, cudaFreeHost(s->hostSegments));
  delete s;
  ctx->state = NULL;
  return 0;
  // EVOLVE-BLOCK-END
}
