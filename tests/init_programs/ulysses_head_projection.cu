// Ulysses sequence parallelism into per-head projections (as in MLA's absorbed attention): each rank holds
// SEQ/world tokens of every head, q [SEQ/world, HEADS, HEAD_DIM]. A kernel packs them by the rank that owns each
// group of HEADS/world heads, ncclAlltoAll exchanges the groups, and then each rank holds every token of its own
// heads, [SEQ, HEADS/world, HEAD_DIM], which it multiplies head by head with its heads' weights
// (w [HEADS/world, HEAD_DIM, HEAD_DIM]) in one strided batched GEMM: out [SEQ, HEADS/world, HEAD_DIM].
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco.h"

struct Plan {
  cublasHandle_t blas;
  int64_t n;    // tokens on this rank
  int64_t hq;   // query heads in all
  int64_t dh;   // the size of a head
};

// src [tokens][heads][dim] -> dst [world][tokens][heads / world][dim]: block p holds the heads rank p owns.
__global__ void packByOwner(const __nv_bfloat16* __restrict__ src, __nv_bfloat16* __restrict__ dst, int64_t tokens,
                            int64_t heads, int64_t dim, int world) {
  const int64_t per = heads / world, total = tokens * heads * dim;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / (heads * dim), h = (i / dim) % heads, d = i % dim;
    dst[(((h / per) * tokens + t) * per + h % per) * dim + d] = src[i];
  }
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  Plan* plan = new Plan();
  ctx->state = plan;
  const int64_t n = cuco_param(ctx, "SEQ");
  plan->n = n / ctx->nRanks;
  plan->hq = cuco_param(ctx, "HEADS");
  plan->dh = cuco_param(ctx, "HEAD_DIM");
  if (plan->hq % ctx->nRanks) CUCO_FAIL(ctx, "HEADS must divide by the number of ranks");
  CUCO_CUBLAS(ctx, cublasCreate(&plan->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(plan->blas, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const Plan* p = (const Plan*)ctx->state;
  const int world = ctx->nRanks;
  const int64_t tokens{p->n};
  const int64_t mine = p->hq / world;  // heads this rank owns after the exchange
  const size_t perPeer = size_t(tokens) * mine * p->dh;
  const auto* q = static_cast<const __nv_bfloat16*>(cuco_buffer(ctx, "q")->ptr);
  auto* packed = static_cast<__nv_bfloat16*>(cuco_buffer(ctx, "q_packed")->ptr);
  auto* byHead = static_cast<__nv_bfloat16*>(cuco_buffer(ctx, "q_heads")->ptr);
  const auto* w = reinterpret_cast<const __nv_bfloat16*>(cuco_buffer(ctx, "w")->ptr);
  auto* out = static_cast<__nv_bfloat16*>(cuco_buffer(ctx, "out")->ptr);
  packByOwner<<<1024, 256, 0, ctx->stream>>>(q, packed, tokens, p->hq, p->dh, world);
  CUCO_CUDA(ctx, cudaGetLastError());
  CUCO_NCCL(ctx, ncclAlltoAll(packed, byHead, perPeer, ncclBfloat16, ctx->comm, ctx->stream));
  const int64_t seq = tokens * world;
  const int ld = (int)(mine * p->dh);  // a token's row holds every local head
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out[:, h] = byHead[:, h] @ w[h] is column-major out_h^T = w_h^T byHead_h^T, for each local head h.
  CUCO_CUBLAS(ctx, cublasGemmStridedBatchedEx(p->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->dh, (int)seq, (int)p->dh,
                                              &alpha, w, CUDA_R_16BF, (int)p->dh, p->dh * p->dh, byHead, CUDA_R_16BF,
                                              ld, p->dh, &beta, out, CUDA_R_16BF, ld, p->dh, (int)mine,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Plan* p = (Plan*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(p->blas));
  delete p;
  ctx->state = nullptr;
  return 0;
}
