// Sequence-parallel projection: Y = X @ W with the rows of X split across ranks.
//
// Rank r holds rows [r * M / world, (r + 1) * M / world) of X and all of W; it computes its rows of Y with
// cuBLAS (bf16 in and out, fp32 accumulation) and the ranks all-gather the rows into the full Y.
//
// Launch one process per GPU with RANK, WORLD_SIZE and LOCAL_RANK set, as torchrun does:
//   nvcc -O2 -std=c++17 env_gemm_allgather.cu -o env_gemm_allgather -lnccl -lcublas
//   torchrun --nproc-per-node 2 --no-python ./env_gemm_allgather [M] [iters]
// Rank 0 writes the NCCL unique id to $NCCL_ID_FILE (default ./nccl_id.bin), the other ranks read it from there,
// so the file must be on a file system every rank sees.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#define CUDA_CHECK(call)                                                                 \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define NCCL_CHECK(call)                                                                 \
  do {                                                                                   \
    ncclResult_t res_ = (call);                                                          \
    if (res_ != ncclSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(res_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define CUBLAS_CHECK(call)                                                               \
  do {                                                                                   \
    cublasStatus_t st_ = (call);                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)st_); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static int env_int(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) {
    fprintf(stderr, "%s is not set: launch with torchrun, or set RANK, WORLD_SIZE and LOCAL_RANK\n", name);
    exit(1);
  }
  return atoi(value);
}

// Rank 0 publishes the id with a rename, so that a reader never sees half a file.
static void share_unique_id(ncclUniqueId* id, int rank, const char* path) {
  if (rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (f == nullptr || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "cannot write the NCCL id to %s\n", path);
      exit(1);
    }
    return;
  }
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f != nullptr) {
      size_t got = fread(id, sizeof(*id), 1, f);
      fclose(f);
      if (got == 1) return;
    }
    usleep(10000);
  }
}

__global__ void fill(__nv_bfloat16* x, float value, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16(value);
}

int main(int argc, char** argv) {
  const int rank = env_int("RANK");
  const int world_size = env_int("WORLD_SIZE");
  const int local_rank = env_int("LOCAL_RANK");
  const char* id_file = getenv("NCCL_ID_FILE") ? getenv("NCCL_ID_FILE") : "nccl_id.bin";

  // problem size: tokens M (split across ranks), hidden K, output features N
  const int64_t M = argc > 1 ? atoll(argv[1]) : 8192;
  const int64_t K = 4096, N = 4096;
  const int iters = argc > 2 ? atoi(argv[2]) : 10;
  if (M % world_size != 0) {
    fprintf(stderr, "M=%lld is not a multiple of WORLD_SIZE=%d\n", (long long)M, world_size);
    return 1;
  }
  const int64_t m_local = M / world_size;

  CUDA_CHECK(cudaSetDevice(local_rank));
  ncclUniqueId id;
  share_unique_id(&id, rank, id_file);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, world_size, id, rank));
  if (rank == 0) unlink(id_file);  // every rank has joined: the id is no longer needed

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const size_t workspace_bytes = 32u << 20;
  void* d_workspace = nullptr;
  CUDA_CHECK(cudaMalloc(&d_workspace, workspace_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(handle, d_workspace, workspace_bytes));

  __nv_bfloat16 *d_x, *d_w, *d_y_local, *d_y;
  CUDA_CHECK(cudaMalloc(&d_x, (size_t)m_local * K * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&d_w, (size_t)K * N * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&d_y_local, (size_t)m_local * N * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&d_y, (size_t)M * N * sizeof(__nv_bfloat16)));

  // X's rows on rank r are (r + 1) / 64 and W is 1/4, so Y's rows from rank r are exactly K * (r + 1) / 256
  fill<<<(m_local * K + 255) / 256, 256, 0, stream>>>(d_x, (rank + 1) / 64.0f, (size_t)m_local * K);
  CUDA_CHECK(cudaGetLastError());
  fill<<<(K * N + 255) / 256, 256, 0, stream>>>(d_w, 0.25f, (size_t)K * N);
  CUDA_CHECK(cudaGetLastError());

  // row-major Y_local[m_local, N] = X[m_local, K] @ W[K, N] is column-major Y_local^T = W^T @ X^T
  const float alpha = 1.0f, beta = 0.0f;
  for (int it = 0; it < iters; ++it) {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)m_local, (int)K, &alpha, d_w,
                              CUDA_R_16BF, (int)N, d_x, CUDA_R_16BF, (int)K, &beta, d_y_local, CUDA_R_16BF, (int)N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    NCCL_CHECK(ncclAllGather(d_y_local, d_y, (size_t)m_local * N, ncclBfloat16, comm, stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<__nv_bfloat16> h_y((size_t)M * N);
  CUDA_CHECK(cudaMemcpy(h_y.data(), d_y, h_y.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (int64_t row = 0; row < M; ++row) {
    const float expected = K * (row / m_local + 1) / 256.0f;
    for (int64_t col = 0; col < N; ++col) wrong += __bfloat162float(h_y[row * N + col]) != expected;
  }
  printf("rank %d: Y[%lld, %lld] after %d iterations: %s\n", rank, (long long)M, (long long)N, iters,
         wrong ? "WRONG" : "OK");

  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_w));
  CUDA_CHECK(cudaFree(d_y_local));
  CUDA_CHECK(cudaFree(d_y));
  CUDA_CHECK(cudaFree(d_workspace));
  CUBLAS_CHECK(cublasDestroy(handle));
  CUDA_CHECK(cudaStreamDestroy(stream));
  NCCL_CHECK(ncclCommDestroy(comm));
  return wrong ? 1 : 0;
}
