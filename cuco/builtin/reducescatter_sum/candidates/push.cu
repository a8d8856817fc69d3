// Device-initiated reduce-scatter by stores: every rank stores the blocks its peers need into their stages
// chunk by chunk and raises a flag per chunk; consumer CTAs add what arrived while the next chunks are in
// flight (cuco::reduceScatterPush). The rules emit the loads version (cuco::reduceScatter); this one needs a
// stage of the program's own, allocated here.
#include "cuco.h"
#include "cuco_collectives.cuh"

// Chunks per CTA range (0: the library picks by size; benchmarks/results/archive/collectives-* compare fixed counts).
#ifndef RS_CHUNKS
#define RS_CHUNKS 0
#endif

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  cuco::coll_requirements(reqs);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  cuco::ReduceScatterStage* stage = new cuco::ReduceScatterStage();
  ctx->state = stage;
  const size_t n = (size_t)cuco_param(ctx, "N") / ctx->nRanks;
  CUCO_CUDA(ctx, cuco::reduceScatterStageAlloc<__nv_bfloat16>(ctx, n, stage));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco::ReduceScatterStage* stage = (cuco::ReduceScatterStage*)ctx->state;
  CUCO_CUDA(ctx, cuco::reduceScatterPush<__nv_bfloat16>(ctx, cuco_buffer(ctx, "x")->ptr, stage,
                                                         cuco_buffer(ctx, "y")->ptr, RS_CHUNKS, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  cuco::ReduceScatterStage* stage = (cuco::ReduceScatterStage*)ctx->state;
  CUCO_CUDA(ctx, cuco::reduceScatterStageFree(ctx, stage));
  delete stage;
  ctx->state = NULL;
  return 0;
}
