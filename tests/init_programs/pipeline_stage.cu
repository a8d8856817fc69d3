// Pipeline-parallel forward of one micro-batch: stage r receives activations from r-1, runs its layer's GEMM
// (bf16, cuBLAS), and sends the result to r+1. Rank 0 reads the input, the last rank keeps the output.
//
//   nvcc -O2 -std=c++17 pipeline_stage.cu -o pipeline_stage $(mpicxx --showme:compile) $(mpicxx --showme:link) -lnccl -lcublas
//   mpirun -np 4 ./pipeline_stage [micro_batch_tokens] [hidden]

#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <nccl.h>

#define CUDACHECK(c) do { cudaError_t e = (c); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
#define NCCLCHECK(c) do { ncclResult_t e = (c); if (e != ncclSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, ncclGetErrorString(e)); exit(1);} } while (0)
#define CUBLASCHECK(c) do { cublasStatus_t e = (c); if (e != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d cublas %d\n", __FILE__, __LINE__, (int)e); exit(1);} } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nstages;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nstages);
  const int M = argc > 1 ? atoi(argv[1]) : 1024;   // tokens in a micro-batch
  const int H = argc > 2 ? atoi(argv[2]) : 8192;   // hidden size
  const int iters = 20;

  CUDACHECK(cudaSetDevice(rank % 8));
  ncclUniqueId uid;
  if (rank == 0) ncclGetUniqueId(&uid);
  MPI_Bcast(&uid, sizeof(uid), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nstages, uid, rank));

  cudaStream_t stream;
  CUDACHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CUBLASCHECK(cublasCreate(&blas));
  CUBLASCHECK(cublasSetStream(blas, stream));

  __nv_bfloat16 *act_in, *act_out, *weight;
  CUDACHECK(cudaMalloc(&act_in, (size_t)M * H * sizeof(__nv_bfloat16)));
  CUDACHECK(cudaMalloc(&act_out, (size_t)M * H * sizeof(__nv_bfloat16)));
  CUDACHECK(cudaMalloc(&weight, (size_t)H * H * sizeof(__nv_bfloat16)));
  CUDACHECK(cudaMemset(act_in, 0, (size_t)M * H * sizeof(__nv_bfloat16)));
  CUDACHECK(cudaMemset(weight, 0, (size_t)H * H * sizeof(__nv_bfloat16)));

  const int prev = rank - 1, next = rank + 1;
  const bool first = rank == 0, last = rank == nstages - 1;
  const float alpha = 1.f, beta = 0.f;
  for (int it = 0; it < iters; ++it) {
    if (!first) NCCLCHECK(ncclRecv(act_in, (size_t)M * H, ncclBfloat16, prev, comm, stream));
    // act_out[M, H] = act_in[M, H] @ weight[H, H]   (row-major, so column-major W^T X^T)
    CUBLASCHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, H, M, H, &alpha, weight, CUDA_R_16BF, H, act_in,
                             CUDA_R_16BF, H, &beta, act_out, CUDA_R_16BF, H, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    if (!last) NCCLCHECK(ncclSend(act_out, (size_t)M * H, ncclBfloat16, next, comm, stream));
  }
  CUDACHECK(cudaStreamSynchronize(stream));
  if (last) printf("pipeline of %d stages done\n", nstages);

  cudaFree(act_in); cudaFree(act_out); cudaFree(weight);
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
