// A standalone program whose sizes live in a struct (defaults, argv overriding one), for cuco init.
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>

struct Config {
  int count = 1 << 20;
  int iters = 20;
};

__global__ void scale(float* x, float s, int n) { }

int main(int argc, char** argv) {
  Config cfg;
  if (argc > 1) cfg.count = atoi(argv[1]);
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
  float *d_x, *d_y;
  cudaMalloc(&d_x, cfg.count * sizeof(float));
  cudaMalloc(&d_y, cfg.count * sizeof(float));
  for (int it = 0; it < cfg.iters; ++it) {
    scale<<<256, 256, 0, stream>>>(d_x, 2.0f, cfg.count);
    ncclAllReduce(d_x, d_y, cfg.count, ncclFloat, ncclSum, comm, stream);
  }
  cudaStreamSynchronize(stream);
  MPI_Finalize();
}
