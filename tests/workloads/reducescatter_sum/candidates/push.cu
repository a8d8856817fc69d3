// Device-initiated reduce-scatter by stores: every rank stores the blocks its peers need into their stage
// windows chunk by chunk, and adds what it received while the next chunk's stores drain
// (cuco::reduceScatterPush). The rules emit the loads version (cuco::reduceScatter); this one needs a stage
// buffer of the program's own, allocated here.
#include "cuco.h"
#include "cuco_collectives.cuh"

// Chunks per CTA: each costs one LSA barrier; more of them hide more of the additions behind the stores.
#ifndef RS_CHUNKS
#define RS_CHUNKS 4
#endif

struct State {
  void* stage;  // nRanks blocks of N / nRanks bf16: slot r holds what rank r stored here
  ncclWindow_t stageWin;
};

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cuco::symmetricAlloc(ctx, &s->stage, (size_t)cuco_param(ctx, "N") * sizeof(__nv_bfloat16),
                                      &s->stageWin));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const size_t n = (size_t)cuco_param(ctx, "N") / ctx->nRanks;
  CUCO_CUDA(ctx, cuco::reduceScatterPush<__nv_bfloat16>(ctx, x->ptr, s->stageWin, 0, y->ptr, n, RS_CHUNKS,
                                                         ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cuco::symmetricFree(ctx, s->stage, s->stageWin));
  delete s;
  ctx->state = NULL;
  return 0;
}
