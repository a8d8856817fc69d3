// Gradient reduce-scatter with averaging (a ZeRO-style optimizer step's communication), replayed as a CUDA graph.
//
// Every rank holds the full gradient; after the step, rank r holds the mean over ranks of shard r. The step, a
// ncclReduceScatter and a kernel that divides by the number of ranks, is captured once into a CUDA graph and
// launched `iters` times.
//
// Launch one process per GPU with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (torchrun does);
// rank 0 hands the NCCL unique id to the others over TCP, on MASTER_PORT + 1:
//   nvcc -O2 -std=c++17 graph_reducescatter.cu -o graph_reducescatter -lnccl
//   torchrun --nproc-per-node 2 --no-python ./graph_reducescatter [shard_count] [iters]

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#define CHECK_CUDA(cmd)                                                                \
  do {                                                                                 \
    cudaError_t e = (cmd);                                                             \
    if (e != cudaSuccess) {                                                            \
      fprintf(stderr, "CUDA error %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#define CHECK_NCCL(cmd)                                                                \
  do {                                                                                 \
    ncclResult_t r = (cmd);                                                            \
    if (r != ncclSuccess) {                                                            \
      fprintf(stderr, "NCCL error %s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static int env_int(const char* name, int fallback) {
  const char* value = getenv(name);
  return value ? atoi(value) : fallback;
}

static void die(const char* what) {
  perror(what);
  exit(1);
}

// Rank 0 listens on MASTER_PORT + 1 and sends the id to each of the other ranks, which connect until it is up.
static void tcp_exchange_id(ncclUniqueId* id, int rank, int world_size) {
  const char* host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
  const int port = env_int("MASTER_PORT", 29500) + 1;
  char service[16];
  snprintf(service, sizeof(service), "%d", port);
  addrinfo hints = {}, *addr = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(rank == 0 ? nullptr : host, service, &hints, &addr) != 0) die("getaddrinfo");
  if (rank == 0) {
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (srv < 0 || bind(srv, addr->ai_addr, addr->ai_addrlen) != 0 || listen(srv, world_size) != 0) die("listen");
    for (int peer = 1; peer < world_size; ++peer) {
      int fd = accept(srv, nullptr, nullptr);
      if (fd < 0 || send(fd, id, sizeof(*id), 0) != (ssize_t)sizeof(*id)) die("send");
      close(fd);
    }
    close(srv);
  } else {
    for (;;) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd >= 0 && connect(fd, addr->ai_addr, addr->ai_addrlen) == 0) {
        if (recv(fd, id, sizeof(*id), MSG_WAITALL) != (ssize_t)sizeof(*id)) die("recv");
        close(fd);
        break;
      }
      if (fd >= 0) close(fd);
      usleep(100000);
    }
  }
  freeaddrinfo(addr);
}

__global__ void fill(float* x, float value, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

__global__ void scale(float* x, float factor, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

int main(int argc, char* argv[]) {
  const int rank = env_int("RANK", 0);
  const int world_size = env_int("WORLD_SIZE", 1);
  const int local_rank = env_int("LOCAL_RANK", 0);
  const size_t shard_count = argc > 1 ? strtoull(argv[1], nullptr, 10) : (size_t)1 << 24;
  const int iters = argc > 2 ? atoi(argv[2]) : 50;
  const size_t count = shard_count * world_size;

  CHECK_CUDA(cudaSetDevice(local_rank));
  ncclUniqueId id;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  tcp_exchange_id(&id, rank, world_size);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, world_size, id, rank));

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  float* d_grad = nullptr;
  float* d_shard = nullptr;
  CHECK_CUDA(cudaMalloc(&d_grad, count * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&d_shard, shard_count * sizeof(float)));
  const int threads = 512;
  fill<<<(count + threads - 1) / threads, threads, 0, stream>>>(d_grad, float(rank + 1), count);
  CHECK_CUDA(cudaGetLastError());

  // capture one step; NCCL calls are captured like kernels (NCCL >= 2.9)
  cudaGraph_t graph;
  cudaGraphExec_t graph_exec;
  const int blocks = (int)((shard_count + threads - 1) / threads);
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_NCCL(ncclReduceScatter(d_grad, d_shard, shard_count, ncclFloat, ncclSum, comm, stream));
  scale<<<blocks, threads, 0, stream>>>(d_shard, 1.0f / world_size, shard_count);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&graph_exec, graph, 0));

  for (int it = 0; it < iters; ++it) CHECK_CUDA(cudaGraphLaunch(graph_exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  // the mean of 1, 2, ..., world_size
  std::vector<float> h_shard(shard_count);
  CHECK_CUDA(cudaMemcpy(h_shard.data(), d_shard, shard_count * sizeof(float), cudaMemcpyDeviceToHost));
  const float expected = (world_size + 1) / 2.0f;
  size_t wrong = 0;
  for (float v : h_shard) wrong += fabsf(v - expected) > 1e-6f * expected;
  printf("rank %d: reduce-scatter of %zu floats per shard, %d graph launches: %s\n", rank, shard_count, iters,
         wrong ? "WRONG" : "OK");

  CHECK_CUDA(cudaGraphExecDestroy(graph_exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(d_grad));
  CHECK_CUDA(cudaFree(d_shard));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_NCCL(ncclCommDestroy(comm));
  return wrong ? 1 : 0;
}
