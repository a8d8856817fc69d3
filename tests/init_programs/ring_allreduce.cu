// Hand-written ring all-reduce (reduce-scatter phase then all-gather phase) with ncclSend/ncclRecv, fp32.
// Each step sends one chunk to the right neighbour and receives one from the left, chunk index rotating with the step.
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CK(x) do { auto e_ = (x); if ((int)e_ != 0) { fprintf(stderr, "err %d at line %d\n", (int)e_, __LINE__); exit(1);} } while (0)

__global__ void add_into(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] += src[i];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const size_t count = argc > 1 ? strtoull(argv[1], nullptr, 10) : (64u << 20);
  const size_t chunk = count / world;
  CK(cudaSetDevice(rank));
  ncclUniqueId id;
  if (rank == 0) CK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CK(ncclCommInitRank(&comm, world, id, rank));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  float *data, *tmp;
  CK(cudaMalloc(&data, count * sizeof(float)));
  CK(cudaMalloc(&tmp, chunk * sizeof(float)));
  const int right = (rank + 1) % world, left = (rank - 1 + world) % world;
  for (int iter = 0; iter < 20; ++iter) {
    // reduce-scatter: after world-1 steps rank r owns the full sum of chunk (r+1)%world
    for (int step = 0; step < world - 1; ++step) {
      const int send_chunk = (rank - step + world) % world;
      const int recv_chunk = (rank - step - 1 + world) % world;
      CK(ncclGroupStart());
      CK(ncclSend(data + send_chunk * chunk, chunk, ncclFloat, right, comm, s));
      CK(ncclRecv(tmp, chunk, ncclFloat, left, comm, s));
      CK(ncclGroupEnd());
      add_into<<<264, 512, 0, s>>>(data + recv_chunk * chunk, tmp, chunk);
    }
    // all-gather
    for (int step = 0; step < world - 1; ++step) {
      const int send_chunk = (rank - step + 1 + world) % world;
      const int recv_chunk = (rank - step + world) % world;
      CK(ncclGroupStart());
      CK(ncclSend(data + send_chunk * chunk, chunk, ncclFloat, right, comm, s));
      CK(ncclRecv(data + recv_chunk * chunk, chunk, ncclFloat, left, comm, s));
      CK(ncclGroupEnd());
    }
  }
  CK(cudaStreamSynchronize(s));
  CK(cudaFree(data));
  CK(cudaFree(tmp));
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
