// All-gather then GEMM with cublasLt: each rank gathers the row shards of A (a [M/world, K]) into a_full [M, K],
// then multiplies it by its column slice of B (b [K, N/world]): c [M, N/world]. bf16 in and out, fp32
// accumulation; the matrix layouts are described once, in setup, column-major (row-major c = a b is c^T = b^T a^T).
#include <cublasLt.h>
#include <cuda_bf16.h>

#include "cuco.h"

struct Lt {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t aDesc, bDesc, cDesc;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  Lt* lt = new Lt();
  ctx->state = lt;
  const uint64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K");
  const uint64_t nLocal = cuco_param(ctx, "N") / ctx->nRanks;
  CUCO_CUBLAS(ctx, cublasLtCreate(&lt->handle));
  CUCO_CUBLAS(ctx, cublasLtMatmulDescCreate(&lt->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUCO_CUBLAS(ctx, cublasLtMatrixLayoutCreate(&lt->bDesc, CUDA_R_16BF, nLocal, K, nLocal));
  CUCO_CUBLAS(ctx, cublasLtMatrixLayoutCreate(&lt->aDesc, CUDA_R_16BF, K, M, K));
  CUCO_CUBLAS(ctx, cublasLtMatrixLayoutCreate(&lt->cDesc, CUDA_R_16BF, nLocal, M, nLocal));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  Lt* lt = (Lt*)ctx->state;
  const size_t shardElems = (size_t)(cuco_param(ctx, "M") / ctx->nRanks) * cuco_param(ctx, "K");
  cuco_buffer_t* shard = cuco_buffer(ctx, "a");
  __nv_bfloat16* aFull = (__nv_bfloat16*)cuco_buffer(ctx, "a_full")->ptr;
  const __nv_bfloat16* b = (const __nv_bfloat16*)cuco_buffer(ctx, "b")->ptr;
  __nv_bfloat16* c = (__nv_bfloat16*)cuco_buffer(ctx, "c")->ptr;
  CUCO_NCCL(ctx, ncclAllGather(shard->ptr, aFull, shardElems, ncclBfloat16, ctx->comm, ctx->stream));
  const float alpha = 1.0f, beta = 0.0f;
  CUCO_CUBLAS(ctx, cublasLtMatmul(lt->handle, lt->op, &alpha, b, lt->bDesc, aFull, lt->aDesc, &beta, c, lt->cDesc,
                                  c, lt->cDesc, nullptr, nullptr, 0, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Lt* lt = (Lt*)ctx->state;
  cublasLtMatrixLayoutDestroy(lt->aDesc);
  cublasLtMatrixLayoutDestroy(lt->bDesc);
  cublasLtMatrixLayoutDestroy(lt->cDesc);
  cublasLtMatmulDescDestroy(lt->op);
  cublasLtDestroy(lt->handle);
  delete lt;
  ctx->state = nullptr;
  return 0;
}
