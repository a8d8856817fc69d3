/*************************************************************************
 * GEMM + AllReduce, device-initiated at the conservative design point: cuBLAS into the first partial slot,
 * then the device collectives' LSA all-reduce (cuco::allReduce, cuco_collectives.cuh).
 *
 *   backend lsa (loads and stores through NCCL 2.28 device-API windows) | placement deferred | sync global
 *   (one LSA barrier per CTA, all ranks, before and after) | issuer cta | chunk: the whole product.
 *
 * Rank r adds its 1/world slice of every rank's partial, in rank order in fp32, and stores the sum into every
 * rank's c; the barriers make every partial complete before it is read, and every store land before the run ends.
 *
 * Requires: partial and c symmetric (windows); all ranks in one LSA team (one NVLink domain), at most
 * CUCO_COLL_MAX_RANKS of them; a device communicator with the collectives' LSA barriers (cuco_dev_requirements).
 *************************************************************************/
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_gemm.h"
#include "cuco_program.cuh"

struct State : cuco::Common<> {};

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

// Checked by the runner before cuco_setup.
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) {
  needs->lsaTeam = 1;
  cuco_need_symmetric(needs, "partial");
  cuco_need_symmetric(needs, "c");
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  return cuco::newState(ctx, &s, 0);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  cuco_buffer_t *partial = cuco_buffer(ctx, "partial"), *c = cuco_buffer(ctx, "c");
  // Slot 0 only: the all-reduce's closing barrier keeps every peer's reads ahead of the next run's GEMM.
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr, partial->ptr, M,
                                  K / ctx->nRanks, N));
  CUCO_CUDA(ctx, cuco::allReduce<__nv_bfloat16>(ctx, partial->window, 0, c->window, 0, (size_t)M * N, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
