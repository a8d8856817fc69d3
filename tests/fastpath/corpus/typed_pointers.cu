// allreduce_sum, as a user writes it: typed local pointers and the program's own NCCL check macro.
#include <cuda_bf16.h>

#include "cuco.h"

#define NCCLCHECK(cmd)                                                    \
  do {                                                                    \
    ncclResult_t res = (cmd);                                             \
    if (res != ncclSuccess) {                                             \
      fprintf(stderr, "NCCL error %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(res)); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t* xb = cuco_buffer(ctx, "x");
  cuco_buffer_t* yb = cuco_buffer(ctx, "y");
  const __nv_bfloat16* in = (const __nv_bfloat16*)xb->ptr;
  __nv_bfloat16* out = (__nv_bfloat16*)yb->ptr;
  const size_t count = (size_t)cuco_param(ctx, "N");
  NCCLCHECK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
