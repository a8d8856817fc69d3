"""The fast path: from a host-driven NCCL program to a device-initiated one (analysis first)."""
