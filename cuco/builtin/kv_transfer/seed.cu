/*************************************************************************
 * KV-cache transfer, host-driven, as today's connectors do it (the starting point of co-design).
 *
 * The prefill rank (0) computes every layer's K and V with cuBLAS into its contiguous staging; then, layer by
 * layer, ncclSend/ncclRecv move them into the decode rank's staging, where a scatter kernel copies each token's
 * row to its page. All on ctx->stream, one after the other: the transfer starts only once prefill is over.
 *
 * Buffers (workload.toml): x [S, HID], wk and wv [L, HID, KV*D], block_table [ceil(S / PAGE)] (i32),
 * pool [L, POOL, 2*PAGE, KV*D] (K's PAGE slots of a page, then V's), kv_stage [L, 2, S, KV*D]; bf16 unless
 * said, row-major. The decode rank is the last one; at world 1 rank 0 is both and nothing is sent.
 * Evolve blocks: the state and the entry points' bodies; includes and signatures are frozen.
 *************************************************************************/

#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"

// EVOLVE-BLOCK-START
// One 16-byte vector per thread: a row of KV*D bf16 values is KV*D/8 vectors (KV*D is a multiple of 8 at every
// shape: 8 heads of 128, or the small shapes' 2 of 8 and 2 of 16).
constexpr int kVec = 8;
constexpr int kThreads = 256;

// pool[page_of(t)][slot(t)] = kv[t] for every token t of one layer's K (half 0) and V (half 1).
__global__ void scatterToPages(const uint4* __restrict__ kv, uint4* __restrict__ pool, const int32_t* table,
                               int64_t S, int64_t page, int64_t rowVecs) {
  const int64_t perHalf = S * rowVecs;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * perHalf;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t half = i / perHalf, t = (i % perHalf) / rowVecs, v = i % rowVecs;
    const int64_t dst = ((int64_t)table[t / page] * 2 * page + half * page + t % page) * rowVecs + v;
    pool[dst] = kv[i];
  }
}

struct State {
  cublasHandle_t blas;
};
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  const int64_t S = cuco_param(ctx, "S"), L = cuco_param(ctx, "L"), HID = cuco_param(ctx, "HID");
  const int64_t cols = cuco_param(ctx, "KV") * cuco_param(ctx, "D"), page = cuco_param(ctx, "PAGE");
  const int64_t poolLayer = cuco_param(ctx, "POOL") * 2 * page * cols, stageLayer = 2 * S * cols;
  const int decode = ctx->nRanks - 1;
  __nv_bfloat16* stage = (__nv_bfloat16*)cuco_buffer(ctx, "kv_stage")->ptr;
  if (ctx->rank == 0) {
    const __nv_bfloat16* x = (const __nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
    const __nv_bfloat16* wk = (const __nv_bfloat16*)cuco_buffer(ctx, "wk")->ptr;
    const __nv_bfloat16* wv = (const __nv_bfloat16*)cuco_buffer(ctx, "wv")->ptr;
    for (int64_t l = 0; l < L; l++) {
      __nv_bfloat16* kv = stage + l * stageLayer;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wk + l * HID * cols, kv, S, HID, cols));
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wv + l * HID * cols, kv + S * cols, S, HID, cols));
    }
  }
  if (decode != 0 && (ctx->rank == 0 || ctx->rank == decode)) {
    for (int64_t l = 0; l < L; l++) {
      CUCO_NCCL(ctx, ncclGroupStart());
      if (ctx->rank == 0)
        CUCO_NCCL(ctx, ncclSend(stage + l * stageLayer, stageLayer, ncclBfloat16, decode, ctx->comm, ctx->stream));
      else
        CUCO_NCCL(ctx, ncclRecv(stage + l * stageLayer, stageLayer, ncclBfloat16, 0, ctx->comm, ctx->stream));
      CUCO_NCCL(ctx, ncclGroupEnd());
    }
  }
  if (ctx->rank == decode) {
    __nv_bfloat16* pool = (__nv_bfloat16*)cuco_buffer(ctx, "pool")->ptr;
    const int32_t* table = (const int32_t*)cuco_buffer(ctx, "block_table")->ptr;
    const int64_t rowVecs = cols / kVec;
    const int blocks = (int)((2 * S * rowVecs + kThreads - 1) / kThreads);
    for (int64_t l = 0; l < L; l++) {
      scatterToPages<<<blocks, kThreads, 0, ctx->stream>>>((const uint4*)(stage + l * stageLayer),
                                                            (uint4*)(pool + l * poolLayer), table, S, page, rowVecs);
      CUCO_CUDA(ctx, cudaGetLastError());
    }
  }
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
  // EVOLVE-BLOCK-END
}
