"""cuco's device-side library for Python candidates: Triton kernels that a candidate may import.

The CUDA candidates include cuco/cuda/include; the Python ones import `cuco.kernels.<module>` (and only this
package of cuco: the static checks reject the rest). Modules here import torch and Triton alone, never the
runner. The GPU work of a fused placement lives here: a GEMM whose tiles wait for their rows, whose spare
programs send this rank's rows to its peers, and whose epilogue reduce-scatters or all-reduces (gemm.py); and
the symmetric buffers such a GEMM exchanges with its peers (symmetric.py). A GEMM of few rows (decode) splits K over
every SM to read the weights at HBM rate (decode.py).
The MoE layer's experts: one grouped GEMM launch per projection, group sizes read on the GPU (grouped_gemm.py).
Ring attention's block on the fastest attention kernel the machine has, and its fused log-sum-exp merge (attention.py).
"""
