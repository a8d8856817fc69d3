// The MLP block's elementwise kernels, launched through these functions: host.cpp is compiled by the host compiler,
// which cannot write a kernel launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 bf16;

// h = gelu(h + bias), bias broadcast over the rows of h [rows, cols].
void bias_gelu(bf16* h, const bf16* bias, int rows, int cols, cudaStream_t stream);

// out = y + bias + x: the second linear layer's bias and the block's residual, over [rows, cols].
void bias_residual(bf16* out, const bf16* y, const bf16* bias, const bf16* x, int rows, int cols,
                   cudaStream_t stream);
