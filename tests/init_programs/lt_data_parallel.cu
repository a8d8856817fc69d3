// Data-parallel gradient with cuBLASLt: grad = a @ b each step, then summed over the ranks in place.
#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int m = 1024, n = 1024, k = 1024;
  cudaSetDevice(rank);
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  ncclCommInitRank(&comm, world, id, rank);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float *a, *b, *grad;
  cudaMalloc(&a, (size_t)m * k * sizeof(float));
  cudaMalloc(&b, (size_t)k * n * sizeof(float));
  cudaMalloc(&grad, (size_t)m * n * sizeof(float));
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m);
  const float alpha = 1.0f, beta = 0.0f;
  for (int it = 0; it < 10; ++it) {
    cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, grad, lc, grad, lc, nullptr, nullptr, 0, stream);
    ncclAllReduce(grad, grad, (size_t)m * n, ncclFloat, ncclSum, comm, stream);
  }
  cudaStreamSynchronize(stream);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
