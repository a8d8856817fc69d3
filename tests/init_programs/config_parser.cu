// Tensor-parallel embedding scale: each rank scales its partial lookup by a per-channel gain, then the ranks sum
// the partials (ncclAllReduce). Sizes come from the command line (--batch, --seq, --hidden, --iters), read into a
// Config by parse_args() as many programs do.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <mpi.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CHECK(x) do { auto e = (x); if ((int)e != 0) { fprintf(stderr, "%s:%d error %d\n", __FILE__, __LINE__, (int)e); exit(1);} } while (0)

struct Config {
  int batch = 4;
  int seq = 2048;
  int hidden = 4096;
  int iters = 20;
  float gain = 0.5f;
};

static void parse_args(int argc, char** argv, Config* cfg) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--batch")) cfg->batch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--seq")) cfg->seq = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--hidden")) cfg->hidden = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) cfg->iters = atoi(argv[i + 1]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); exit(1); }
  }
}

__global__ void scale_channels(const float* in, const float* gain, float* out, size_t rows, int hidden) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < rows * hidden) out[i] = in[i] * gain[i % hidden];
}

int main(int argc, char** argv) {
  Config cfg;
  parse_args(argc, argv, &cfg);
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CHECK(cudaSetDevice(rank));
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, world, id, rank));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  const size_t rows = (size_t)cfg.batch * cfg.seq;
  const size_t n = rows * cfg.hidden;
  std::vector<float> h_emb(n), h_gain(cfg.hidden, cfg.gain);
  for (size_t i = 0; i < n; ++i) h_emb[i] = (float)((i * 7 + rank) % 13) / 13.f;

  float *d_emb, *d_gain, *d_partial, *d_out;
  CHECK(cudaMalloc(&d_emb, n * sizeof(float)));
  CHECK(cudaMalloc(&d_gain, cfg.hidden * sizeof(float)));
  CHECK(cudaMalloc(&d_partial, n * sizeof(float)));
  CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  CHECK(cudaMemcpy(d_emb, h_emb.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_gain, h_gain.data(), h_gain.size() * sizeof(float), cudaMemcpyHostToDevice));

  const int threads = 256;
  const int blocks = (int)((n + threads - 1) / threads);
  for (int it = 0; it < cfg.iters; ++it) {
    scale_channels<<<blocks, threads, 0, stream>>>(d_emb, d_gain, d_partial, rows, cfg.hidden);
    CHECK(ncclAllReduce(d_partial, d_out, n, ncclFloat, ncclSum, comm, stream));
  }
  CHECK(cudaStreamSynchronize(stream));

  std::vector<float> h_out(n);
  CHECK(cudaMemcpy(h_out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  if (rank == 0) printf("out[0] = %f\n", h_out[0]);
  cudaFree(d_emb); cudaFree(d_gain); cudaFree(d_partial); cudaFree(d_out);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
