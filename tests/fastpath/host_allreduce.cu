// A host-driven program as users write them: a kernel produces, ncclAllReduce sums, a kernel consumes.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#define CUDACHECK(cmd) do { cudaError_t e = cmd; if (e != cudaSuccess) { printf("cuda %d\n", (int)e); return 1; } } while (0)
#define NCCLCHECK(cmd) do { ncclResult_t r = cmd; if (r != ncclSuccess) { printf("nccl %d\n", (int)r); return 1; } } while (0)

__global__ void produce(float* x, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = (float)i;
}

__global__ void consume(const float* x, float* y, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

int step(ncclComm_t comm, cudaStream_t stream, size_t n) {
  float *sendbuff, *recvbuff, *out;
  CUDACHECK(cudaMalloc(&sendbuff, n * sizeof(float)));
  CUDACHECK(cudaMalloc(&recvbuff, n * sizeof(float)));
  NCCLCHECK(ncclMemAlloc((void**)&out, n * sizeof(float)));
  produce<<<(n + 255) / 256, 256, 0, stream>>>(sendbuff, n);
  NCCLCHECK(ncclAllReduce(sendbuff, recvbuff, n, ncclFloat, ncclSum, comm, stream));
  consume<<<(n + 255) / 256, 256, 0, stream>>>(recvbuff, out, n);
  CUDACHECK(cudaStreamSynchronize(stream));
  return 0;
}
