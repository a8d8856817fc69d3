// Device-initiated all-to-all with uneven blocks: one kernel of cuco's library reads every rank's counts
// from their windows, pushes each block to its place on its peer and zeroes the rest; no host round trip.
#include "cuco.h"
#include "cuco_collectives.cuh"

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *counts = cuco_buffer(ctx, "counts"), *y = cuco_buffer(ctx, "y");
  CUCO_CUDA(ctx, cuco::allToAllv(ctx, counts->window, 0, x->ptr, y->window, 0, sizeof(__nv_bfloat16),
                                 (size_t)cuco_param(ctx, "N"), true, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
