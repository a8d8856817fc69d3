// allreduce_sum accumulated in passes, ping-ponging between two pointers that are swapped after each pass (one
// pass here): which buffer `src` and `dst` name changes as the loop runs.
#include <utility>

#include "cuco.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  void* src = x->ptr;
  void* dst = y->ptr;
  for (int pass = 0; pass < 1; pass++) {
    CUCO_NCCL(ctx, ncclAllReduce(src, dst, n, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
    void* t = src;
    src = dst;
    dst = t;
  }
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
