/*************************************************************************
 * cuco_rs.cuh: GEMM + ReduceScatter's shape as its strategy kernels see it (workload.toml: A is M x K/world on
 * every rank, B K/world x N; rank r's c is rows [r*mLocal, (r+1)*mLocal) of the sum).
 *************************************************************************/
#ifndef CUCO_RS_CUH_
#define CUCO_RS_CUH_

#include <cuda_bf16.h>

#include "cuco.h"

namespace cuco::rs {

using Elem = __nv_bfloat16;  // a, b, c, partial and staging hold bf16 (workload.toml)

struct Shape {
  int64_t M, K, N, mLocal, kLocal;
};

inline Shape shapeOf(const cuco_ctx_t* ctx) {
  Shape sh;
  sh.M = cuco_param(ctx, "M"), sh.K = cuco_param(ctx, "K"), sh.N = cuco_param(ctx, "N");
  sh.mLocal = sh.M / ctx->nRanks, sh.kLocal = sh.K / ctx->nRanks;
  return sh;
}

}  // namespace cuco::rs

#endif  // CUCO_RS_CUH_
