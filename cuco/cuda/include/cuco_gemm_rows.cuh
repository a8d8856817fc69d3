/*************************************************************************
 * cuco_gemm_rows.cuh: a cuBLAS GEMM beside a collective, cut by rows into the collective's pieces.
 *
 * The GEMM half of sync chunk (cuco_collectives.cuh): the fast path's rewrite (cuco/fastpath/knobs.py) turns the
 * program's own GEMM call into one of these, the call given as gemm(first row, rows).
 *   gemmByGatheredRows  a GEMM that reads an all-gather's output as whole rows of one operand: this rank's own
 *                       block first, then each peer's, CUCO_CHUNKS pieces of rows each, every piece behind a wait for
 *                       the flags of the bytes it reads (allGatherChunks).
 *   gemmSignalRows      a GEMM that writes a reduce-scatter's input as whole rows of its output: the peers' blocks
 *                       first, this rank's own last, each piece followed by a flag on the rank that sums that block
 *                       (reduceScatterChunks).
 *   gemmSignalColumns   a GEMM that writes an all-reduce's input: its output's columns in CUCO_CHUNKS pieces (each
 *                       piece reads its own columns of the weights, so they are read once), each flagged on every
 *                       rank, which sums its share of the piece (allReduceChunks).
 * Where the rows do not fall into whole rows of every rank's block (a check at run time), or without
 * CUCO_COLL_CHUNK_SYNC, the GEMM runs once, after (or before) the whole collective.
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

// A CUDA error around a GEMM's pieces (a wait, a flag, the side stream's join), said by `call` and returned as
// cuBLAS's, since the GEMM's caller checks a cuBLAS status.
inline cublasStatus_t piecesFailed(const char* call, cudaError_t err) {
  fprintf(stderr, "%s: %s\n", call, cudaGetErrorString(err));
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
  const PieceSite& site = pieceSite<Site>();
  const int n = ctx->nRanks;
  const bool byBlocks = operand == site.buffer && rowBytes > 0 && site.bytes % rowBytes == 0 &&
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
        const cudaError_t err = chunkFlags().await(*ctx->devComm, stream, chunkFlag(Site, p, j0),
                                                   chunkFlag(Site, p, j1), complete);
        if (err != cudaSuccess) return piecesFailed("cuco::gemmByGatheredRows", err);
        const cublasStatus_t st = gemm(p * perBlock + r0, r1 - r0);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
      }
    }
    const cudaError_t err = joinSideStream<Site>(ctx, stream);  // what follows may read the buffer without a wait
    return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : piecesFailed("cuco::gemmByGatheredRows", err);
  }
  static bool said = false;
  sayOnce(&said, "cuco::gemmByGatheredRows: the GEMM's operand is not the gathered buffer in whole rows of every "
                 "rank's block: it waits for the whole all-gather");
#endif
  const cudaError_t err = joinSideStream<Site>(ctx, stream);
  return err == cudaSuccess ? gemm(0, rows) : piecesFailed("cuco::gemmByGatheredRows", err);
}

// The GEMM whose output `out` holds `rows` rows of `rowBytes`, issued on `stream` as gemm(r0, n), feeding the
// reduce-scatter of site Site: at sync chunk each piece of rank q's block flags rank q once it is written.
template <int Site, typename Gemm>
inline cublasStatus_t gemmSignalRows(const cuco_ctx_t* ctx, cudaStream_t stream, const void* out, int64_t rows,
                                     int64_t rowBytes, Gemm gemm) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  const int n = ctx->nRanks;
  cudaError_t err = beforePieces<Site>(ctx, stream);
  if (err != cudaSuccess) return piecesFailed("cuco::gemmSignalRows", err);
  PieceSite& site = pieceSite<Site>();
  site.calls++;
  if (rows % n == 0 && rowBytes > 0 && n <= CUCO_COLL_MAX_RANKS) {
    const int64_t perBlock = rows / n;
    site.buffer = out, site.bytes = (size_t)(perBlock * rowBytes), site.rowBytes = rowBytes;
    for (int i = 1; i <= n; i++) {
      const int q = (ctx->rank + i) % n;  // the peers' blocks first: they sum them while this rank writes its own
      for (int c = 0; c < CUCO_CHUNKS; c++) {
        const int64_t r0 = perBlock * c / CUCO_CHUNKS, r1 = perBlock * (c + 1) / CUCO_CHUNKS;
        if (r1 > r0) {
          const cublasStatus_t st = gemm(q * perBlock + r0, r1 - r0);
          if (st != CUBLAS_STATUS_SUCCESS) return st;
        }
        err = signalPiece<Site>(ctx, stream, q, c);  // an empty piece too: the summing rank waits for every flag
        if (err != cudaSuccess) return piecesFailed("cuco::gemmSignalRows", err);
      }
    }
    return CUBLAS_STATUS_SUCCESS;
  }
  site.buffer = nullptr, site.bytes = 0;  // not in whole rows of every block: the reduce-scatter waits for all of it
#endif
  (void)ctx, (void)stream, (void)out, (void)rowBytes;
  return gemm(0, rows);
}

// The GEMM whose output `out` is `lines` lines `ld` elements of `elemBytes` apart, of which it writes the first
// `cols`, issued on `stream` as gemm(c0, n) for columns [c0, c0 + n), feeding the all-reduce of site Site: at sync
// chunk each piece of columns, cut on 16-byte boundaries as allReduceChunks cuts it, flags every rank once written.
template <int Site, typename Gemm>
inline cublasStatus_t gemmSignalColumns(const cuco_ctx_t* ctx, cudaStream_t stream, const void* out, int64_t cols,
                                        int64_t lines, int64_t ld, int64_t elemBytes, Gemm gemm) {
#if defined(CUCO_COLL_CHUNK_SYNC)
  cudaError_t err = beforePieces<Site>(ctx, stream);
  if (err != cudaSuccess) return piecesFailed("cuco::gemmSignalColumns", err);
  PieceSite& site = pieceSite<Site>();
  site.calls++;
  if (cols > 0 && lines > 0 && elemBytes > 0 && 16 % elemBytes == 0 && ctx->nRanks <= CUCO_COLL_MAX_RANKS) {
    site.buffer = out, site.lines = lines, site.ld = ld, site.cols = cols, site.elemBytes = elemBytes;
    for (int j = 0; j < CUCO_CHUNKS; j++) {
      size_t c0, c1;
      packSlice((size_t)cols, (size_t)(16 / elemBytes), j, CUCO_CHUNKS, &c0, &c1);
      if (c1 > c0) {
        const cublasStatus_t st = gemm((int64_t)c0, (int64_t)(c1 - c0));
        if (st != CUBLAS_STATUS_SUCCESS) return st;
      }
      err = signalPieceEveryRank<Site>(ctx, stream, j);  // an empty piece too: every rank waits for every flag
      if (err != cudaSuccess) return piecesFailed("cuco::gemmSignalColumns", err);
    }
    return CUBLAS_STATUS_SUCCESS;
  }
  site.buffer = nullptr, site.cols = 0;  // not cut: the all-reduce waits for all of it
#endif
  (void)ctx, (void)stream, (void)out, (void)lines, (void)ld, (void)elemBytes;
  return gemm(0, cols);
}

}  // namespace cuco

#endif  // CUCO_GEMM_ROWS_CUH_
