/*************************************************************************
 * GEMM + ReduceScatter, device-initiated at the conservative design point: cuBLAS, then the device
 * collectives' LSA reduce-scatter (cuco::reduceScatter, cuco_collectives.cuh).
 *
 *   backend lsa (loads through NCCL 2.28 device-API windows) | placement deferred (cuBLAS, then the
 *   reduction kernel) | sync global (one LSA barrier per CTA, all ranks) | issuer cta | chunk: whole block.
 *
 * The reduction reads rank r's rows of every rank's partial window, adds them in rank order in fp32 and
 * stores c, between two LSA barriers: the first makes sure every rank's partial product is complete, the
 * second that no peer still reads this rank's partial when its next GEMM overwrites it.
 *
 * Requires: partial symmetric (a window); all ranks in one LSA team (one NVLink domain), at most
 * CUCO_COLL_MAX_RANKS of them; a device communicator with the collectives' LSA barriers
 * (cuco_dev_requirements).
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
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  return cuco::newState(ctx, &s, 0);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  cuco_buffer_t* partial = cuco_buffer(ctx, "partial");
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr, partial->ptr, M,
                                  K / ctx->nRanks, N));
  CUCO_CUDA(ctx, cuco::reduceScatter<__nv_bfloat16>(ctx, partial->window, 0, cuco_buffer(ctx, "c")->ptr,
                                                    (size_t)(M / ctx->nRanks) * N, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
