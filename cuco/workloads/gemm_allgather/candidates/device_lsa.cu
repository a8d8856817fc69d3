/*************************************************************************
 * GEMM + AllGather, device-initiated at the conservative design point: the device collectives' LSA
 * all-gather (cuco::allGather, cuco_collectives.cuh), then cuBLAS.
 *
 *   backend lsa (stores through NCCL 2.28 device-API windows) | placement deferred (all-gather kernel,
 *   then cuBLAS) | sync global (one LSA barrier per CTA, all ranks) | issuer cta | chunk: whole shard.
 *
 * The all-gather pushes this rank's shard of A into slot `rank` of every rank's a_gathered window between
 * two LSA barriers: the first makes sure no peer is still reading a_gathered from its previous run, the
 * second that every peer's stores have landed before the GEMM reads them.
 *
 * Requires: a_gathered symmetric (a window); all ranks in one LSA team (one NVLink domain), at most
 * CUCO_COLL_MAX_RANKS of them; a device communicator with the collectives' LSA barriers
 * (cuco_dev_requirements).
 *************************************************************************/
#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_gemm.h"

struct State {
  cublasHandle_t blas;
};

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  cuco_buffer_t* aFull = cuco_buffer(ctx, "a_gathered");
  if (!aFull || !aFull->symmetric) CUCO_FAIL(ctx, "a_gathered must be a symmetric buffer (a window)");
  if (ctx->nRanks > CUCO_COLL_MAX_RANKS) CUCO_FAIL(ctx, "at most %d ranks", CUCO_COLL_MAX_RANKS);
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  if (ctx->devComm.lsaSize != ctx->nRanks)
    CUCO_FAIL(ctx, "all %d ranks must share one LSA team; this one has %d", ctx->nRanks, ctx->devComm.lsaSize);
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
  // This rank's shard lands at offset rank * a->bytes of every rank's a_gathered.
  CUCO_CUDA(ctx, cuco::allGather(ctx, aFull->window, 0, a->ptr, a->bytes, ctx->stream));
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, aFull->ptr, cuco_buffer(ctx, "b")->ptr, cuco_buffer(ctx, "c")->ptr, M, K,
                                N / ctx->nRanks));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
}
