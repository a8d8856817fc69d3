"""One page of host memory shared by processes: the start gate every rank waits behind (its first word, then
each rank's key to the run's sealed inputs, written as the clock starts), and each rank's done flag, written by
the GPU in stream order once the timed region and its snapshot are finished."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

KEYS_AT = 64  # bytes: the gate counter has the page's first cache line; the ranks' 64-bit keys follow
KEY_SLOT = 16  # bytes per rank: each key 16-byte aligned, as the snapshot kernel that fetches it wants


def key_offset(rank: int) -> int:
    """Where rank's key lies in the gate page (a page holds the keys of (4096 - 64) / 16 = 252 ranks)."""
    if not 0 <= rank < (mmap.PAGESIZE - KEYS_AT) // KEY_SLOT:
        raise ValueError(f"rank {rank} has no key slot in one page")
    return KEYS_AT + KEY_SLOT * rank


class Page:
    """A page mapped from a file descriptor; 64-bit counters at 8-byte offsets."""

    def __init__(self, fd: int) -> None:
        self.map = mmap.mmap(fd, mmap.PAGESIZE)
        self.host_ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.dev_ptr: int | None = None

    @classmethod
    def anonymous(cls, name: str) -> tuple[Page, int]:
        """A new zeroed page and its descriptor (to pass to another process)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, mmap.PAGESIZE)
        return cls(fd), fd

    def read(self, offset: int = 0) -> int:
        return struct.unpack_from("<Q", self.map, offset)[0]

    def write(self, value: int, offset: int = 0) -> None:
        struct.pack_into("<Q", self.map, offset, value)

    def register(self, harness) -> int:
        """Pin the page so kernels can read and write it (cudaHostRegister, mapped); returns the device pointer."""
        self.dev_ptr = harness.host_register(self.host_ptr, mmap.PAGESIZE)
        return self.dev_ptr
