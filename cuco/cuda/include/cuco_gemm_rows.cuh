/*************************************************************************
 * cuco_gemm_rows.cuh: a cuBLAS GEMM over an all-gather's output, cut by the gathered rows.
 *
 * The consumer half of sync chunk (cuco_collectives.cuh, allGatherChunks): the fast path's rewrite (cuco/fastpath/
 * knobs.py) turns a GEMM that reads the gathered buffer as whole rows of one operand into gemmByGatheredRows, which
 * issues the same GEMM on this rank's own block first, then each peer's, CUCO_CHUNKS pieces of rows each, every
 * piece behind a wait for the flags of the bytes it reads. The GEMM itself is the program's own call, given as
 * gemm(first row, rows). Where the operand is not the gathered buffer cut into whole rows of every rank's block
 * (a check at run time), or without CUCO_COLL_CHUNK_SYNC, it waits for the whole all-gather and runs once.
 *************************************************************************/
#ifndef CUCO_GEMM_ROWS_CUH_
#define CUCO_GEMM_ROWS_CUH_

#include <cublas_v2.h>
#include <stdio.h>

#include <type_traits>

#include "cuco_collectives.cuh"

namespace cuco {

// Bytes of one element of a cuBLAS data type; 0 for a type the rewrite has no use for (the GEMM then runs once).
inline int64_t dataTypeBytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_8I: case CUDA_R_8U: case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: return 1;
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    case CUDA_R_32F: case CUDA_R_32I: return 4;
    case CUDA_R_64F: return 8;
    default: return 0;
  }
}

// `p` moved by `row` rows of `rowBytes`, as the same pointer type (a GEMM's operands are typed: const __half*, ...).
template <typename T>
inline T* rowsAt(T* p, int64_t row, int64_t rowBytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return (T*)((Byte*)p + row * rowBytes);
}

inline cublasStatus_t waitFailed(cudaError_t err) {
  fprintf(stderr, "cuco::gemmByGatheredRows: waiting for the gathered rows: %s\n", cudaGetErrorString(err));
  return CUBLAS_STATUS_EXECUTION_FAILED;
}

// Pieces [*j0, *j1) of a block of `bytes` cut into nPieces (as gatherPiecesKernel cuts it) that bytes [lo, hi) touch.
inline void piecesTouched(size_t bytes, int nPieces, size_t lo, size_t hi, int* j0, int* j1) {
  *j0 = nPieces, *j1 = 0;
  for (int j = 0; j < nPieces; j++) {
    size_t a, b;
    packSlice(bytes, 16, j, nPieces, &a, &b);
    if (a < hi && lo < b) *j0 = std::min(*j0, j), *j1 = j + 1;
  }
}

// The GEMM whose operand `operand` holds `rows` rows of `rowBytes`, issued on `stream` (the GEMM's) as gemm(r0, n)
// for rows [r0, r0 + n), once the all-gather of site Site has delivered them.
template <int Site, typename Gemm>
inline cublasStatus_t gemmByGatheredRows(const cuco_ctx_t* ctx, cudaStream_t stream, const void* operand,
                                         int64_t rows, int64_t rowBytes, Gemm gemm) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  const GatherSite& site = gatherSite<Site>();
  const int n = ctx->nRanks;
  const bool byBlocks = operand == site.recv && rowBytes > 0 && site.bytes % rowBytes == 0 &&
                        (int64_t)(site.bytes / rowBytes) * n == rows;
  if (byBlocks) {
    const int64_t perBlock = rows / n;
    const unsigned long long complete = site.calls * CUCO_COLL_CTAS;  // every CTA of the call's kernel bumped it
    for (int i = 0; i < n; i++) {
      const int p = (ctx->rank + i) % n;  // this rank's own block first: its stores are local
      for (int c = 0; c < CUCO_CHUNKS; c++) {
        const int64_t r0 = perBlock * c / CUCO_CHUNKS, r1 = perBlock * (c + 1) / CUCO_CHUNKS;
        if (r0 == r1) continue;
        int j0, j1;
        piecesTouched(site.bytes, CUCO_CHUNKS, r0 * rowBytes, r1 * rowBytes, &j0, &j1);
        const cudaError_t err = chunkFlags().await(ctx->devComm, stream, chunkFlag(Site, p, j0),
                                                   chunkFlag(Site, p, j1), complete);
        if (err != cudaSuccess) return waitFailed(err);
        const cublasStatus_t st = gemm(p * perBlock + r0, r1 - r0);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
      }
    }
    const cudaError_t err = joinSideStream<Site>(ctx, stream);  // what follows may read the buffer without a wait
    return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : waitFailed(err);
  }
  static bool told = false;
  if (!told) {
    told = true;
    fprintf(stderr, "cuco::gemmByGatheredRows: the GEMM's operand is not the gathered buffer in whole rows of every "
                    "rank's block: it waits for the whole all-gather\n");
  }
#endif
  const cudaError_t err = joinSideStream<Site>(ctx, stream);
  return err == cudaSuccess ? gemm(0, rows) : waitFailed(err);
}

}  // namespace cuco

#endif  // CUCO_GEMM_ROWS_CUH_
