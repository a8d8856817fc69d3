/*************************************************************************
 * GEMM + ReduceScatter, host-driven (the starting point of co-design).
 *
 * Each rank computes its partial product A_r @ B_r with cuBLAS, then ncclReduceScatter sums the partials
 * and leaves rank r its M/world rows, both on ctx->stream, one after the other: communication and
 * computation never overlap.
 *
 * Buffers (workload.toml): a [M, K/world], b [K/world, N], c [M/world, N], partial [M, N]; bf16, row-major.
 * Evolve blocks: the state and the entry points' bodies; includes and signatures are frozen.
 *************************************************************************/

#include "cuco.h"
#include "cuco_gemm.h"

// EVOLVE-BLOCK-START
struct State {
  cublasHandle_t blas;
};
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int64_t kLocal = K / ctx->nRanks, mLocal = M / ctx->nRanks;
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *b = cuco_buffer(ctx, "b"), *c = cuco_buffer(ctx, "c");
  cuco_buffer_t* partial = cuco_buffer(ctx, "partial");
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a->ptr, b->ptr, partial->ptr, M, kLocal, N));
  CUCO_NCCL(ctx, ncclReduceScatter(partial->ptr, c->ptr, (size_t)mLocal * N, ncclBfloat16, ncclSum, ctx->comm,
                                   ctx->stream));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
  // EVOLVE-BLOCK-END
}
