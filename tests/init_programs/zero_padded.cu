// ZeRO-2 style optimizer step: reduce-scatter the fp32 gradients, Adam on this rank's shard of the fp32 master
// weights, cast the updated shard to fp16, all-gather the fp16 parameters for the next forward.
//
// torchrun --nproc-per-node 8 --no-python ./zero_padded [numel]
//   nvcc -O2 -std=c++17 zero_padded.cu -o zero_padded -lnccl -lmpi

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CUDA_CALL(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 2);} } while (0)
#define NCCL_CALL(x) do { ncclResult_t e = (x); if (e != ncclSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, ncclGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 2);} } while (0)

__global__ void adam_shard(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                           const float* __restrict__ g, size_t n, float lr, float b1, float b2, float eps,
                           float inv_world) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i] * inv_world;
  float mi = b1 * m[i] + (1.f - b1) * gi;
  float vi = b2 * v[i] + (1.f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  master[i] -= lr * mi / (sqrtf(vi) + eps);
}

__global__ void cast_to_half(const float* __restrict__ src, __half* __restrict__ dst, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2half_rn(src[i]);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int local_rank = getenv("LOCAL_RANK") ? atoi(getenv("LOCAL_RANK")) : rank;
  const size_t numel_arg = argc > 1 ? strtoull(argv[1], nullptr, 10) : (size_t)1 << 26;
  const size_t numel = (numel_arg + world - 1) / world * world;  // pad to a multiple of the world size
  size_t shard = numel / world;
  const int iters = 10;

  CUDA_CALL(cudaSetDevice(local_rank));
  ncclUniqueId id;
  if (rank == 0) NCCL_CALL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_CALL(ncclCommInitRank(&comm, world, id, rank));
  cudaStream_t stream;
  CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  float *grad, *grad_shard, *master, *exp_avg, *exp_avg_sq;
  __half *param_shard_h, *param_h;
  CUDA_CALL(cudaMalloc(&grad, numel * sizeof(float)));
  CUDA_CALL(cudaMalloc(&grad_shard, shard * sizeof(float)));
  CUDA_CALL(cudaMalloc(&master, shard * sizeof(float)));
  CUDA_CALL(cudaMalloc(&exp_avg, shard * sizeof(float)));
  CUDA_CALL(cudaMalloc(&exp_avg_sq, shard * sizeof(float)));
  CUDA_CALL(cudaMalloc(&param_shard_h, shard * sizeof(__half)));
  CUDA_CALL(cudaMalloc(&param_h, numel * sizeof(__half)));
  CUDA_CALL(cudaMemset(grad, 0, numel * sizeof(float)));
  CUDA_CALL(cudaMemset(master, 0, shard * sizeof(float)));
  CUDA_CALL(cudaMemset(exp_avg, 0, shard * sizeof(float)));
  CUDA_CALL(cudaMemset(exp_avg_sq, 0, shard * sizeof(float)));

  const int threads = 256;
  const unsigned blocks = (unsigned)((shard + threads - 1) / threads);
  for (int it = 0; it < iters; ++it) {
    NCCL_CALL(ncclReduceScatter(grad, grad_shard, shard, ncclFloat, ncclSum, comm, stream));
    adam_shard<<<blocks, threads, 0, stream>>>(master, exp_avg, exp_avg_sq, grad_shard, shard, 1e-4f, 0.9f, 0.999f,
                                               1e-8f, 1.0f / world);
    cast_to_half<<<blocks, threads, 0, stream>>>(master, param_shard_h, shard);
    NCCL_CALL(ncclAllGather(param_shard_h, param_h, shard, ncclHalf, comm, stream));
  }
  CUDA_CALL(cudaStreamSynchronize(stream));
  if (rank == 0) printf("zero step x%d on %zu params: ok\n", iters, numel);
  cudaFree(grad); cudaFree(grad_shard); cudaFree(master); cudaFree(exp_avg); cudaFree(exp_avg_sq);
  cudaFree(param_shard_h); cudaFree(param_h);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
