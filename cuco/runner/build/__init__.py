"""Build and the checks before it: L0 on the source, L1 with nvcc (cached by what the compiler sees)."""
