"""Memory shared between a rank's judge and the candidate's host, and nothing more.

CPU: every buffer of the rank is an anonymous memfd mapped by both processes; the judge writes inputs,
poisons outputs and scratch, and copies outputs the moment the host reports completion.
GPU: the candidate's buffers live in the host (symmetric ones come from ncclMemAlloc, which CUDA IPC
cannot export), so the judge shares one CUDA allocation of its own over CUDA IPC: a staging area the
judge fills with the next inputs, and snapshot areas into which the host copies outputs (and inputs) in
stream order right after the timed region. Only this rank's buffers ever cross; the other ranks' inputs
and the seeds stay in their judges.
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
BOUNCE = "bounce"  # the parameters' way in and out, a chunk at a time
BOUNCE_BYTES = 256 * 2**20  # a chunk: large enough that a round trip per chunk is nothing beside its copy


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
    """Offsets of the exchange areas: staged inputs, output snapshots and input snapshots, and one bounce area
    through which the parameters pass a chunk at a time (an MoE layer's weights are tens of GB: a copy of
    them in the exchange would double the judge's memory)."""
    areas, off = {}, 0
    for lay in layouts:
        keys = ["stage", "inputs_after"] if lay.role == "input" else ["out"] if lay.role == "output" else []
        for key in keys:
            areas[f"{key}:{lay.name}"] = (off, lay)
            off += (lay.nbytes + ALIGN - 1) // ALIGN * ALIGN
    largest = max((lay.nbytes for lay in layouts if lay.role == "parameter"), default=0)
    if largest:
        areas[BOUNCE] = (off, Layout(BOUNCE, "scratch", "u8", (min(largest, BOUNCE_BYTES),), False))
        off += (min(largest, BOUNCE_BYTES) + ALIGN - 1) // ALIGN * ALIGN
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
        """What the host needs to open the allocation (torch's CUDA IPC handle, bytes as base64)."""
        args = list(self.raw.untyped_storage()._share_cuda_())
        return [base64.b64encode(a).decode() if isinstance(a, bytes) else a for a in args]

    @classmethod
    def open(cls, handle: list[Any], layouts: list[Layout], device: torch.device) -> Exchange:
        # (device, handle, size, offset, ref-counter handle, ref-counter offset, event handle, event sync)
        args = list(handle)
        for i in (1, 4):
            args[i] = base64.b64decode(args[i])
        args[6] = base64.b64decode(args[6]) if args[6] else None
        storage = torch.UntypedStorage._new_shared_cuda(*args)
        raw = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        return cls(raw, layouts)
