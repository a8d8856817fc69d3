// Weighted gradient all-reduce, one MPI rank per GPU.
//
// Each rank scales its gradients by a per-element weight, then the ranks sum the scaled gradients with
// ncclAllReduce. The step runs `iters` times on one stream; the result is checked once at the end.
//
//   nvcc -O2 -std=c++17 mpi_allreduce.cu -o mpi_allreduce $(mpicxx --showme:compile) $(mpicxx --showme:link) -lnccl
//   mpirun -np 2 ./mpi_allreduce [count] [iters]

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define MPICHECK(cmd)                                                          \
  do {                                                                         \
    int e = cmd;                                                               \
    if (e != MPI_SUCCESS) {                                                    \
      printf("Failed: MPI error %s:%d '%d'\n", __FILE__, __LINE__, e);         \
      exit(EXIT_FAILURE);                                                      \
    }                                                                          \
  } while (0)

#define CUDACHECK(cmd)                                                         \
  do {                                                                         \
    cudaError_t e = cmd;                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("Failed: Cuda error %s:%d '%s'\n", __FILE__, __LINE__,            \
             cudaGetErrorString(e));                                           \
      exit(EXIT_FAILURE);                                                      \
    }                                                                          \
  } while (0)

#define NCCLCHECK(cmd)                                                         \
  do {                                                                         \
    ncclResult_t r = cmd;                                                      \
    if (r != ncclSuccess) {                                                    \
      printf("Failed, NCCL error %s:%d '%s'\n", __FILE__, __LINE__,            \
             ncclGetErrorString(r));                                           \
      exit(EXIT_FAILURE);                                                      \
    }                                                                          \
  } while (0)

__global__ void scale_by(const float* grad, const float* weight, float* out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = grad[i] * weight[i];
}

int main(int argc, char* argv[]) {
  size_t count = 1 << 22;  // gradient elements on each rank
  int iters = 20;
  if (argc > 1) count = strtoull(argv[1], nullptr, 10);
  if (argc > 2) iters = atoi(argv[2]);

  int rank, nranks;
  MPICHECK(MPI_Init(&argc, &argv));
  MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, &nranks));

  // one GPU per rank, ranks of a node numbered consecutively
  int ndev = 0;
  CUDACHECK(cudaGetDeviceCount(&ndev));
  CUDACHECK(cudaSetDevice(rank % ndev));

  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPICHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));

  cudaStream_t stream;
  CUDACHECK(cudaStreamCreate(&stream));

  float *d_grad, *d_weight, *d_scaled, *d_sum;
  CUDACHECK(cudaMalloc(&d_grad, count * sizeof(float)));
  CUDACHECK(cudaMalloc(&d_weight, count * sizeof(float)));
  CUDACHECK(cudaMalloc(&d_scaled, count * sizeof(float)));
  CUDACHECK(cudaMalloc(&d_sum, count * sizeof(float)));

  std::vector<float> h_grad(count, float(rank + 1)), h_weight(count, 0.5f);
  CUDACHECK(cudaMemcpy(d_grad, h_grad.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  CUDACHECK(cudaMemcpy(d_weight, h_weight.data(), count * sizeof(float), cudaMemcpyHostToDevice));

  const int threads = 256;
  const int blocks = (int)((count + threads - 1) / threads);
  for (int it = 0; it < iters; ++it) {
    scale_by<<<blocks, threads, 0, stream>>>(d_grad, d_weight, d_scaled, count);
    CUDACHECK(cudaGetLastError());
    NCCLCHECK(ncclAllReduce(d_scaled, d_sum, count, ncclFloat, ncclSum, comm, stream));
  }
  CUDACHECK(cudaStreamSynchronize(stream));

  // every element is 0.5 * (1 + 2 + ... + nranks)
  std::vector<float> h_sum(count);
  CUDACHECK(cudaMemcpy(h_sum.data(), d_sum, count * sizeof(float), cudaMemcpyDeviceToHost));
  const float expected = 0.5f * nranks * (nranks + 1) / 2;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += h_sum[i] != expected;
  if (rank == 0) printf("allreduce of %zu floats on %d ranks, %d iterations: %s\n", count, nranks, iters,
                        wrong ? "WRONG" : "OK");

  CUDACHECK(cudaFree(d_grad));
  CUDACHECK(cudaFree(d_weight));
  CUDACHECK(cudaFree(d_scaled));
  CUDACHECK(cudaFree(d_sum));
  CUDACHECK(cudaStreamDestroy(stream));
  NCCLCHECK(ncclCommDestroy(comm));
  MPICHECK(MPI_Finalize());
  return wrong ? 1 : 0;
}
