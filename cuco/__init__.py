"""cuco: compute-communication co-design for multi-GPU CUDA programs."""

__version__ = "0.1.0"
