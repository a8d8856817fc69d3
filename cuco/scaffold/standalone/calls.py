"""The API calls that the conversion's modules tell apart: what creates the communicator and cuBLAS handles, what
checks, which GEMMs have sizes, and which kinds of call are device work."""

COMM_INIT = frozenset({"ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable"})
# What cuco_setup creates and cuco_teardown destroys: cuBLAS handles, and cuBLASLt's handle, descriptors and layouts.
HANDLE_CREATE = {"cublasCreate": "cublasDestroy", "cublasCreate_v2": "cublasDestroy_v2",
                 "cublasLtCreate": "cublasLtDestroy", "cublasLtMatmulDescCreate": "cublasLtMatmulDescDestroy",
                 "cublasLtMatrixLayoutCreate": "cublasLtMatrixLayoutDestroy",
                 "cublasLtMatmulPreferenceCreate": "cublasLtMatmulPreferenceDestroy"}
# What cuco_setup computes once and keeps, nothing to destroy: cuBLASLt's chosen algorithm (the result's position,
# the position of the count of results found).
RESULTS = {"cublasLtMatmulAlgoGetHeuristic": (8, 9)}
CHECKS = frozenset({"cudaGetLastError", "cudaPeekAtLastError"})
DEFAULT_STREAMS = frozenset({"0", "NULL", "nullptr", "cudaStreamDefault", "cudaStreamLegacy", "cudaStreamPerThread"})
# A GEMM's m, n, k (and a strided batch's count): the flops are 2 times their product.
GEMM_SIZES = {**{name: (3, 4, 5) for name in ("cublasGemmEx", "cublasSgemm", "cublasSgemm_v2", "cublasHgemm",
                                              "cublasDgemm", "cublasDgemm_v2")},
              **{f"cublas{t}gemmStridedBatched": (3, 4, 5, 17) for t in "SDH"},
              "cublasGemmStridedBatchedEx": (3, 4, 5, 20)}
WORK = frozenset({"launch", "nccl", "blas", "graph_launch"})  # what makes a loop the step's


def made_at(name: str) -> int:
    """The argument a set-up call makes or configures: a result's position, else the first (`cublasCreate(&h)`)."""
    return RESULTS[name][0] if name in RESULTS else 0
