// Row-parallel linear layer (Megatron): Y_partial = X_shard @ W_shard + bias/world via cuBLASLt with a bias
// epilogue, then ncclAllReduce sums the partial products across the tensor-parallel ranks.
//
//   nvcc -O2 -std=c++17 lt_heuristic_bias.cu -o lt_heuristic_bias $(mpicxx --showme:compile) $(mpicxx --showme:link) -lnccl -lcublasLt
//   mpirun -np 2 ./lt_heuristic_bias [tokens] [in_features] [out_features]

#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <nccl.h>

#define CUDA_OK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
#define NCCL_OK(x) do { ncclResult_t e = (x); if (e != ncclSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, ncclGetErrorString(e)); exit(1);} } while (0)
#define LT_OK(x) do { cublasStatus_t e = (x); if (e != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d cublasLt %d\n", __FILE__, __LINE__, (int)e); exit(1);} } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, tp;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &tp);
  const int tokens = argc > 1 ? atoi(argv[1]) : 4096;
  const int in_features = argc > 2 ? atoi(argv[2]) : 16384;   // full K; each rank holds in_features / tp
  const int out_features = argc > 3 ? atoi(argv[3]) : 4096;
  const int k_local = in_features / tp;
  const int iters = 20;

  CUDA_OK(cudaSetDevice(rank));
  ncclUniqueId id;
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, tp, id, rank));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  __nv_bfloat16 *x, *w, *bias, *y;
  CUDA_OK(cudaMalloc(&x, (size_t)tokens * k_local * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMalloc(&w, (size_t)k_local * out_features * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMalloc(&bias, (size_t)out_features * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMalloc(&y, (size_t)tokens * out_features * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMemset(x, 0, (size_t)tokens * k_local * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMemset(w, 0, (size_t)k_local * out_features * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMemset(bias, 0, (size_t)out_features * sizeof(__nv_bfloat16)));
  size_t ws_bytes = 64ull << 20;
  void* workspace;
  CUDA_OK(cudaMalloc(&workspace, ws_bytes));

  cublasLtHandle_t lt;
  LT_OK(cublasLtCreate(&lt));
  // column-major: Y^T[out, tokens] = W^T[out, k_local] @ X^T[k_local, tokens] + bias[out]
  cublasLtMatmulDesc_t op;
  LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t no_trans = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &no_trans, sizeof(no_trans)));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  cublasLtMatrixLayout_t a_desc, b_desc, c_desc;
  LT_OK(cublasLtMatrixLayoutCreate(&a_desc, CUDA_R_16BF, out_features, k_local, out_features));
  LT_OK(cublasLtMatrixLayoutCreate(&b_desc, CUDA_R_16BF, k_local, tokens, k_local));
  LT_OK(cublasLtMatrixLayoutCreate(&c_desc, CUDA_R_16BF, out_features, tokens, out_features));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, a_desc, b_desc, c_desc, c_desc, pref, 1, &heur, &found));
  if (!found) { fprintf(stderr, "no cublasLt algorithm\n"); return 1; }

  const float alpha = 1.f, beta = 0.f;
  for (int it = 0; it < iters; ++it) {
    LT_OK(cublasLtMatmul(lt, op, &alpha, w, a_desc, x, b_desc, &beta, y, c_desc, y, c_desc, &heur.algo, workspace,
                         ws_bytes, stream));
    NCCL_OK(ncclAllReduce(y, y, (size_t)tokens * out_features, ncclBfloat16, ncclSum, comm, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  if (rank == 0) printf("row-parallel linear x%d done\n", iters);

  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a_desc); cublasLtMatrixLayoutDestroy(b_desc); cublasLtMatrixLayoutDestroy(c_desc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cudaFree(x); cudaFree(w); cudaFree(bias); cudaFree(y); cudaFree(workspace);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
