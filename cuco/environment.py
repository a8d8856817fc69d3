"""Every environment variable cuco reads, in one table: `cuco doctor` shows them and docs/configuration.md lists
them (a test keeps the three in step with the code)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str
    internal: bool = False  # set by cuco for its own processes, never by a user


VARIABLES: tuple[Variable, ...] = (
    Variable("CUCO_HOME", "where builds, records, baselines, bounds, machine facts and knowledge live "
                          "(default ~/.cache/cuco; a relative path is read from the folder the command starts in)"),
    Variable("CUCO_WORKLOADS_PATH", "extra folders of workloads, colon-separated, searched before the built-in ones"),
    Variable("CUCO_CUDA_ARCH", "the GPU architecture candidates are compiled for, as a number "
                               "(default 90: sm_90, Hopper)"),
    Variable("CUCO_NVCC", "the nvcc to use (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)"),
    Variable("CUDA_HOME", "the CUDA toolkit the headers and libraries come from (default: the one nvcc belongs to)"),
    Variable("LD_LIBRARY_PATH", "folders of shared libraries; when cuco runs as root, the candidate's own uid is "
                                "given read access to them (and to Python's, cuco's and CUDA_HOME) in its mount "
                                "namespace"),
    Variable("CUCO_NCCL_HOME", "an NCCL installation with the device-API headers (default: the nvidia-nccl-cu13 "
                               "wheel)"),
    Variable("CUCO_CUBLAS_HOME", "a cuBLAS installation (default: the nvidia-cublas wheel, then CUDA_HOME)"),
    Variable("ANTHROPIC_API_KEY", "the Anthropic key, unless [llm] api_key_env names another variable"),
    Variable("OPENAI_API_KEY", "the OpenAI key (and for novelty = openai), unless [llm] api_key_env names another"),
    Variable("CUCO_JUDGE_PORT", "the judges' process-group port; never in a candidate's environment",
             internal=True),
    Variable("CUCO_JUDGE_TOKEN_FD", "the pipe a judge reads the secret that admits it to the judges' group from, new "
                                    "for every launch; read after the candidate's process is forked off",
             internal=True),
)
