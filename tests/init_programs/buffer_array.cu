// Buffers held in an array and a size fixed at file scope, for cuco init: refused, every blocker in one run.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>

__global__ void scale(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
#define N (1 << 20)

int main(int argc, char** argv) {
  int rank, world;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  ncclCommInitRank(&comm, world, id, rank);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float* bufs[2];
  for (int b = 0; b < 2; ++b) cudaMalloc(&bufs[b], N * sizeof(float));
  for (int it = 0; it < 20; ++it) {
    scale<<<N / 256, 256, 0, stream>>>(bufs[it % 2], 2.0f, N);
    ncclAllReduce(bufs[0], bufs[1], N, ncclFloat, ncclSum, comm, stream);
  }
  cudaStreamSynchronize(stream);
  MPI_Finalize();
}
