"""Memory shared between a rank's judge and the candidate's host, and nothing more.

CPU: every buffer of the rank is an anonymous memfd mapped by both processes; the judge writes inputs,
poisons outputs and scratch, and copies outputs the moment the host reports completion.
GPU: the candidate's buffers live in the host (symmetric ones come from ncclMemAlloc), and the judge shares
regions of device memory of its own through file descriptors (SharedRegion): the exchange (a staging area the
judge fills with the next inputs, and snapshot areas into which the host copies outputs and inputs in stream
order right after the timed region) and the parameters, which the host maps as the candidate's buffers. Only this
rank's buffers ever cross; the other ranks' inputs and the seeds stay in their judges.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cuco.dtypes import DTYPES, torch_dtype

TORCH_DTYPES = {name: torch_dtype(name) for name in DTYPES}
ALIGN = 256  # bytes: every exchange slice starts aligned for vector loads and cudaMemcpy


@dataclass(frozen=True)
class Layout:
    """One buffer of one shape, as both processes see it."""

    name: str
    role: str  # "input", "inout", "parameter", "output" or "scratch" (cuco.workload.spec.ROLES)
    dtype: str
    shape: tuple[int, ...]
    symmetric: bool

    @property
    def nbytes(self) -> int:
        n = TORCH_DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n

    def view(self, raw: torch.Tensor) -> torch.Tensor:
        return raw[: self.nbytes].view(TORCH_DTYPES[self.dtype]).view(self.shape)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Layout:
        return cls(str(d["name"]), str(d["role"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]),
                   bool(d["symmetric"]))


def cuda_array(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over device memory allocated outside torch (ncclMemAlloc), without a copy."""

    class _Array:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    return torch.as_tensor(_Array(), device=device)


# ---- CPU: one memfd per buffer --------------------------------------------------------------------


def _map(fd: int, nbytes: int) -> torch.Tensor:
    m = mmap.mmap(fd, max(nbytes, 1))
    return torch.frombuffer(m, dtype=torch.uint8)


def memfd_buffers(layouts: list[Layout]) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The judge's side: new shared buffers and their descriptors (to pass to the host, then close)."""
    tensors, fds = {}, []
    for lay in layouts:
        fd = os.memfd_create(f"cuco-{lay.name}", os.MFD_CLOEXEC)
        os.ftruncate(fd, max(lay.nbytes, 1))
        tensors[lay.name] = lay.view(_map(fd, lay.nbytes))
        fds.append(fd)
    return tensors, fds


def attach_memfd_buffers(layouts: list[Layout], fds: list[int]) -> dict[str, torch.Tensor]:
    """The host's side: the same buffers, from the descriptors the judge sent."""
    if len(fds) != len(layouts):
        raise ValueError(f"{len(fds)} descriptors for {len(layouts)} buffers")
    out = {}
    for lay, fd in zip(layouts, fds):
        out[lay.name] = lay.view(_map(fd, lay.nbytes))
        os.close(fd)
    return out


# ---- GPU: device memory shared through file descriptors ------------------------------------------


class SharedRegion:
    """Device memory of the judge's that the candidate's process maps too: allocated by the driver's virtual memory
    API and passed as a file descriptor over the judge's channel (harness.share_alloc), so that the one who holds
    the descriptor, whatever its uid, maps it, and nothing else of the judge's sits beside it."""

    def __init__(self, harness: Any, device: torch.device, ptr: int, nbytes: int, fd: int | None) -> None:
        self.harness, self.device, self.ptr, self.nbytes, self.fd = harness, device, ptr, nbytes, fd
        self.tensor = cuda_array(ptr, nbytes, device)

    @classmethod
    def create(cls, harness: Any, nbytes: int, device: torch.device) -> SharedRegion:
        ptr, fd, mapped = harness.share_alloc(device.index, max(nbytes, 1))
        return cls(harness, device, ptr, mapped, fd)

    @classmethod
    def open(cls, harness: Any, fd: int, nbytes: int, device: torch.device) -> SharedRegion:
        try:
            return cls(harness, device, harness.share_import(device.index, fd, nbytes), nbytes, None)
        finally:
            os.close(fd)

    def handoff(self) -> int:
        """The descriptor, to send to the host and close: once the host has mapped the region, the mapping alone
        keeps it."""
        fd, self.fd = self.fd, None
        assert fd is not None
        return fd

    def close(self) -> None:
        """Unmap (the memory goes once no process maps it) and close the descriptor."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.ptr:
            torch.cuda.synchronize(self.device)
            self.harness.share_free(self.ptr, self.nbytes)
            self.ptr = 0


def _slices(layouts: list[Layout]) -> tuple[dict[str, tuple[int, Layout]], int]:
    """Offsets of the exchange areas: staged inputs, output snapshots and input snapshots."""
    areas, off = {}, 0
    for lay in layouts:
        keys = {"input": ["stage", "inputs_after"], "inout": ["stage", "out"], "output": ["out"]}.get(lay.role, [])
        for key in keys:
            areas[f"{key}:{lay.name}"] = (off, lay)
            off += (lay.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return areas, max(off, ALIGN)


def exchange_bytes(layouts: list[Layout]) -> int:
    return _slices(layouts)[1]


class Exchange:
    """Named views into the shared region: `stage:a`, `inputs_after:a`, `out:c`."""

    def __init__(self, region: SharedRegion, layouts: list[Layout]) -> None:
        self.region = region
        areas, _ = _slices(layouts)
        self.views = {key: lay.view(region.tensor[off:]) for key, (off, lay) in areas.items()}

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.views[key]
