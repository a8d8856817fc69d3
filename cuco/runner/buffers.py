"""Memory shared between a rank's judge and the candidate's host, and nothing more.

CPU: every buffer of the rank is an anonymous memfd mapped by both processes; the judge writes inputs,
poisons outputs and scratch, and copies outputs the moment the host reports completion.
GPU: the candidate's buffers live in the host (symmetric ones come from ncclMemAlloc, which CUDA IPC
cannot export), so the judge shares one CUDA allocation of its own over CUDA IPC: a staging area the
judge fills with the next inputs, and snapshot areas into which the host copies outputs (and inputs) in
stream order right after the timed region. Parameters are the exception: the judge draws them and the host
maps them as the candidate's buffers (`share`), so that the weights exist once on the GPU. Only this rank's
buffers ever cross; the other ranks' inputs and the seeds stay in their judges.
"""

from __future__ import annotations

import base64
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
    role: str  # "input", "parameter", "output" or "scratch" (cuco.workload.spec.ROLES)
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


# ---- GPU: one CUDA IPC allocation, sliced ---------------------------------------------------------


def _slices(layouts: list[Layout]) -> tuple[dict[str, tuple[int, Layout]], int]:
    """Offsets of the exchange areas: staged inputs, output snapshots and input snapshots."""
    areas, off = {}, 0
    for lay in layouts:
        keys = ["stage", "inputs_after"] if lay.role == "input" else ["out"] if lay.role == "output" else []
        for key in keys:
            areas[f"{key}:{lay.name}"] = (off, lay)
            off += (lay.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return areas, max(off, ALIGN)


class Exchange:
    """Named views into the shared allocation: `stage:a`, `inputs_after:a`, `out:c`."""

    def __init__(self, raw: torch.Tensor, layouts: list[Layout]) -> None:
        self.raw = raw
        areas, _ = _slices(layouts)
        self.views = {key: lay.view(raw[off:]) for key, (off, lay) in areas.items()}

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.views[key]

    @classmethod
    def create(cls, layouts: list[Layout], device: torch.device) -> Exchange:
        _, size = _slices(layouts)
        return cls(torch.empty(size, dtype=torch.uint8, device=device), layouts)

    def handle(self) -> list[Any]:
        return share(self.raw)

    @classmethod
    def open(cls, handle: list[Any], layouts: list[Layout], device: torch.device) -> Exchange:
        return cls(open_shared(handle, device), layouts)


def share(t: torch.Tensor) -> list[Any]:
    """What another process needs to map t's storage (torch's CUDA IPC handle, bytes as base64), as JSON."""
    args = list(t.untyped_storage()._share_cuda_())
    return [base64.b64encode(a).decode() if isinstance(a, bytes) else a for a in args]


def open_shared(handle: list[Any], device: torch.device) -> torch.Tensor:
    """The storage another process shared (`share`), as bytes."""
    # (device, handle, size, offset, ref-counter handle, ref-counter offset, event handle, event sync)
    args = list(handle)
    for i in (1, 4):
        args[i] = base64.b64decode(args[i])
    args[6] = base64.b64decode(args[6]) if args[6] else None
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
