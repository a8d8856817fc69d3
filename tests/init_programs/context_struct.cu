// A context struct holding the rank, the communicator, the stream, the buffers and the size, filled by a helper and
// handed to the step's helper, for cuco init.
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
struct Context {
  int rank, world;
  ncclComm_t comm;
  cudaStream_t stream;
  float *x, *y;
  size_t n;
};

void setup(Context& c, int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.world);
  ncclUniqueId id;
  if (c.rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclCommInitRank(&c.comm, c.world, id, c.rank);
  cudaStreamCreate(&c.stream);
  c.n = 1 << 20;
  cudaMalloc(&c.x, c.n * sizeof(float));
  cudaMalloc(&c.y, c.n * sizeof(float));
}

void step(Context& c) {
  scale<<<(c.n + 255) / 256, 256, 0, c.stream>>>(c.x, 2.0f, c.n);
  ncclAllReduce(c.x, c.y, c.n, ncclFloat, ncclSum, c.comm, c.stream);
}

int main(int argc, char** argv) {
  Context c;
  setup(c, argc, argv);
  for (int it = 0; it < 20; ++it) step(c);
  cudaStreamSynchronize(c.stream);
  MPI_Finalize();
}
