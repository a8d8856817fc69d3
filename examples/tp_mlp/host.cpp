// A tensor-parallel MLP block, as Megatron splits it over `world` GPUs:
//   h   = gelu(x @ W1[:, shard] + b1[shard])     (column-parallel: no communication)
//   y   = sum over ranks of h @ W2[shard, :]     (row-parallel: the all-reduce)
//   out = y + b2 + x                             (bias and residual)
// x [tokens, hidden] is replicated; each rank holds its ffn / world columns of W1 and rows of W2. bf16 data, fp32
// accumulation, cuBLAS for the GEMMs, NCCL for the all-reduce.
//
// Built and launched as people do, one process per GPU under MPI:
//   nvcc -c -O2 kernels.cu -o kernels.o
//   mpicxx -O2 -DUSE_NVTX host.cpp kernels.o -o tp_mlp -lcudart -lnccl -lcublas -lnvToolsExt
//   mpirun -np 2 ./tp_mlp [tokens] [hidden] [ffn] [iters]

#include <cstdio>
#include <cstdlib>

#include <cublas_v2.h>
#include <mpi.h>
#include <nccl.h>
#ifdef USE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#include "kernels.cuh"

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));    \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    }                                                                                \
  } while (0)
#define NCCL_CHECK(call)                                                             \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r_));    \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    }                                                                                \
  } while (0)
#define CUBLAS_CHECK(call)                                                           \
  do {                                                                               \
    cublasStatus_t s_ = (call);                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, (int)s_);     \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    }                                                                                \
  } while (0)

// NVTX ranges around the step, for Nsight Systems; nothing without -DUSE_NVTX.
#ifdef USE_NVTX
#define RANGE_PUSH(name) nvtxRangePushA(name);
#define RANGE_POP() nvtxRangePop();
#else
#define RANGE_PUSH(name)
#define RANGE_POP()
#endif

#define WARMUP 5

// The communicator over MPI's ranks: rank 0 makes the unique id, MPI hands it to the others.
static void init_comm(ncclComm_t* comm, int rank, int world) {
  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  NCCL_CHECK(ncclCommInitRank(comm, world, id, rank));
}

// c [m, n] = a [m, k] @ b [k, n], row-major bf16 with fp32 accumulation: cuBLAS is column-major, so it computes
// c^T = b^T a^T.
static void gemm_bf16(cublasHandle_t blas, const bf16* a, const bf16* b, bf16* c, int m, int n, int k) {
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, n, a, CUDA_R_16BF, k,
                            &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int tokens = argc > 1 ? atoi(argv[1]) : 2048;
  const int hidden = argc > 2 ? atoi(argv[2]) : 4096;
  const int ffn = argc > 3 ? atoi(argv[3]) : 16384;
  const int iters = argc > 4 ? atoi(argv[4]) : 50;
  const int shard = ffn / world;

  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  CUDA_CHECK(cudaSetDevice(rank % devices));
  ncclComm_t comm;
  init_comm(&comm, rank, world);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetStream(blas, stream));

  bf16 *d_x, *d_w1, *d_b1, *d_h, *d_w2, *d_y, *d_b2, *d_out;
  CUDA_CHECK(cudaMalloc(&d_x, (size_t)tokens * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_w1, (size_t)hidden * shard * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_b1, (size_t)shard * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_h, (size_t)tokens * shard * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_w2, (size_t)shard * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_y, (size_t)tokens * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_b2, (size_t)hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)tokens * hidden * sizeof(bf16)));
  // Inputs and weights: zeros here; a real run loads them.
  CUDA_CHECK(cudaMemset(d_x, 0, (size_t)tokens * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(d_w1, 0, (size_t)hidden * shard * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(d_b1, 0, (size_t)shard * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(d_w2, 0, (size_t)shard * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(d_b2, 0, (size_t)hidden * sizeof(bf16)));

  for (int i = 0; i < WARMUP; ++i) {
    gemm_bf16(blas, d_x, d_w1, d_h, tokens, shard, hidden);
    bias_gelu(d_h, d_b1, tokens, shard, stream);
    gemm_bf16(blas, d_h, d_w2, d_y, tokens, hidden, shard);
    NCCL_CHECK(ncclAllReduce(d_y, d_y, (size_t)tokens * hidden, ncclBfloat16, ncclSum, comm, stream));
    bias_residual(d_out, d_y, d_b2, d_x, tokens, hidden, stream);
  }
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int it = 0; it < iters; ++it) {
    RANGE_PUSH("mlp")
    gemm_bf16(blas, d_x, d_w1, d_h, tokens, shard, hidden);
    bias_gelu(d_h, d_b1, tokens, shard, stream);
    gemm_bf16(blas, d_h, d_w2, d_y, tokens, hidden, shard);
    NCCL_CHECK(ncclAllReduce(d_y, d_y, (size_t)tokens * hidden, ncclBfloat16, ncclSum, comm, stream));
    bias_residual(d_out, d_y, d_b2, d_x, tokens, hidden, stream);
    RANGE_POP()
  }
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  if (rank == 0) printf("tp_mlp: %d x %d x %d over %d ranks: %.3f ms per step\n", tokens, hidden, ffn, world,
                        ms / iters);

  CUBLAS_CHECK(cublasDestroy(blas));
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_w1));
  CUDA_CHECK(cudaFree(d_b1));
  CUDA_CHECK(cudaFree(d_h));
  CUDA_CHECK(cudaFree(d_w2));
  CUDA_CHECK(cudaFree(d_y));
  CUDA_CHECK(cudaFree(d_b2));
  CUDA_CHECK(cudaFree(d_out));
  NCCL_CHECK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
