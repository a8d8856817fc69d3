// Expert-parallel token exchange: each rank holds T tokens of width H, already sorted by the rank that owns their
// expert, T / world to each; a loop of ncclSend/ncclRecv trades the blocks, then each rank scales what it received.
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("cuda %s\n", cudaGetErrorString(e)); exit(1); } } while (0)
#define CHECK_NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { printf("nccl %s\n", ncclGetErrorString(r)); exit(1); } } while (0)

__global__ void scale(__nv_bfloat16* y, float s, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) * s);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const size_t tokens = argc > 1 ? atol(argv[1]) : 4096, hidden = 7168;
  const size_t chunk = tokens / nranks * hidden;
  CHECK_CUDA(cudaSetDevice(rank));
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  __nv_bfloat16 *send, *recv;
  CHECK_CUDA(cudaMalloc(&send, tokens * hidden * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&recv, tokens * hidden * sizeof(__nv_bfloat16)));
  for (int it = 0; it < 20; ++it) {
    CHECK_NCCL(ncclGroupStart());
    for (int peer = 0; peer < nranks; ++peer) {
      CHECK_NCCL(ncclSend(send + peer * chunk, chunk, ncclBfloat16, peer, comm, stream));
      CHECK_NCCL(ncclRecv(recv + peer * chunk, chunk, ncclBfloat16, peer, comm, stream));
    }
    CHECK_NCCL(ncclGroupEnd());
    scale<<<256, 256, 0, stream>>>(recv, 0.5f, tokens * hidden);
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(send));
  CHECK_CUDA(cudaFree(recv));
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
