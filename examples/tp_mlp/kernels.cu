// The MLP block's elementwise kernels (see kernels.cuh): one thread per element, fp32 arithmetic on bf16 data.
#include "kernels.cuh"

#define THREADS 256
#define BLOCKS_FOR(n) (unsigned)(((n) + THREADS - 1) / THREADS)

__global__ void bias_gelu_kernel(bf16* h, const bf16* bias, int rows, int cols) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols) return;
  float v = __bfloat162float(h[i]) + __bfloat162float(bias[i % cols]);
  h[i] = __float2bfloat16(0.5f * v * (1.0f + erff(v * 0.70710678f)));  // exact GELU: 0.5 v (1 + erf(v / sqrt 2))
}

__global__ void bias_residual_kernel(bf16* out, const bf16* y, const bf16* bias, const bf16* x, int rows,
                                     int cols) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols) return;
  out[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(bias[i % cols]) + __bfloat162float(x[i]));
}

void bias_gelu(bf16* h, const bf16* bias, int rows, int cols, cudaStream_t stream) {
  bias_gelu_kernel<<<BLOCKS_FOR((size_t)rows * cols), {THREADS, 1, 1}, 0, stream>>>(h, bias, rows, cols);
}

void bias_residual(bf16* out, const bf16* y, const bf16* bias, const bf16* x, int rows, int cols,
                   cudaStream_t stream) {
  bias_residual_kernel<<<BLOCKS_FOR((size_t)rows * cols), {THREADS, 1, 1}, 0, stream>>>(out, y, bias, x, rows,
                                                                                         cols);
}
