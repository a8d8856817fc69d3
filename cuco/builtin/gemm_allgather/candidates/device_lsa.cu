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
#include "cuco_program.cuh"

struct State : cuco::Common<> {};

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

// Checked by the runner before cuco_setup.
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) {
  needs->lsaTeam = 1;
  cuco_need_symmetric(needs, "a_gathered");
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  return cuco::newState(ctx, &s, 0);
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

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
