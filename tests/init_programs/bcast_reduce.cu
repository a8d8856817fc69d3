// Data-parallel evaluation: rank 0 initialises the classifier weights and broadcasts them once; every step each
// rank scores its batch (logits = feats @ W^T via cuBLAS SGEMM, then per-class sums) and the class sums are
// reduced to rank 0 with ncclReduce.
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <nccl.h>

#define CUDACHECK(cmd) do { cudaError_t e = cmd; if (e != cudaSuccess) { printf("Failed: Cuda error %s:%d '%s'\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(EXIT_FAILURE); } } while (0)
#define NCCLCHECK(cmd) do { ncclResult_t r = cmd; if (r != ncclSuccess) { printf("Failed, NCCL error %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r)); exit(EXIT_FAILURE); } } while (0)

__global__ void init_weights(float* w, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) w[i] = ((i * 2654435761u + seed) % 1000) * 1e-3f - 0.5f;
}

// class_sums[c] = sum over rows b of logits[b, c]  (logits row-major [batch, classes])
__global__ void column_sums(const float* logits, float* class_sums, int batch, int classes) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= classes) return;
  float acc = 0.f;
  for (int b = 0; b < batch; ++b) acc += logits[(size_t)b * classes + c];
  class_sums[c] = acc;
}

int main(int argc, char** argv) {
  int rank, nranks;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int batch = 2048, dim = 4096, classes = 1000;
  if (argc > 1) batch = atoi(argv[1]);
  CUDACHECK(cudaSetDevice(rank));

  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast((void*)&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream;
  CUDACHECK(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  cublasCreate(&handle);
  cublasSetStream(handle, stream);

  float *feats, *weights, *logits, *class_sums, *totals;
  CUDACHECK(cudaMalloc(&feats, sizeof(float) * batch * dim));
  CUDACHECK(cudaMalloc(&weights, sizeof(float) * classes * dim));
  CUDACHECK(cudaMalloc(&logits, sizeof(float) * batch * classes));
  CUDACHECK(cudaMalloc(&class_sums, sizeof(float) * classes));
  CUDACHECK(cudaMalloc(&totals, sizeof(float) * classes));

  if (rank == 0) init_weights<<<(classes * dim + 255) / 256, 256, 0, stream>>>(weights, (size_t)classes * dim, 1234u);
  NCCLCHECK(ncclBroadcast(weights, weights, (size_t)classes * dim, ncclFloat, 0, comm, stream));
  CUDACHECK(cudaStreamSynchronize(stream));

  const float one = 1.0f, zero = 0.0f;
  for (int iter = 0; iter < 100; iter++) {
    // row-major logits[batch, classes] = feats[batch, dim] @ weights[classes, dim]^T
    cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, classes, batch, dim, &one, weights, dim, feats, dim, &zero,
                logits, classes);
    column_sums<<<(classes + 127) / 128, 128, 0, stream>>>(logits, class_sums, batch, classes);
    NCCLCHECK(ncclReduce(class_sums, totals, classes, ncclFloat, ncclSum, 0, comm, stream));
  }
  CUDACHECK(cudaStreamSynchronize(stream));
  cudaFree(feats); cudaFree(weights); cudaFree(logits); cudaFree(class_sums); cudaFree(totals);
  cublasDestroy(handle);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
