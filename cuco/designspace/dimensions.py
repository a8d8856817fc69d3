"""The five dimensions of a candidate's communication design (docs/design.md, "The design space").

Each value is a string in workload.toml, in directives and in the store, and an enumerator of the same name in
CamelCase in cuco/cuda/include/cuco_design_point.cuh (`stream_overlap` is `cuco::Placement::StreamOverlap`), which a
test holds to this file."""

from __future__ import annotations

from enum import Enum


class DimensionValue(str, Enum):
    """A value that compares, hashes and prints as its string, so stored points and TOML lists read back equal."""

    def __str__(self) -> str:
        return self.value

    @property
    def cxx(self) -> str:
        """Its enumerator in cuco_design_point.cuh."""
        return "".join(word.capitalize() for word in self.value.split("_"))


class Backend(DimensionValue):
    """How bytes move."""

    LSA = "lsa"  # load/store over NVLink through NCCL device-API windows (ncclGetLsaPointer)
    CE = "ce"  # copy engine: cudaMemcpyAsync from peer memory
    GIN = "gin"  # NCCL GPU-initiated networking: needs an RDMA NIC
    NCCL_HOST = "nccl_host"  # host-issued NCCL (or gloo) collectives: the baseline
    NVSHMEM = "nvshmem"


class Placement(DimensionValue):
    """Where communication is issued relative to compute."""

    DEFERRED = "deferred"  # all communication, then all compute
    STREAM_OVERLAP = "stream_overlap"  # side stream, chunked compute, a wait per chunk
    SPLIT_PUT_WAIT = "split_put_wait"  # put on a side stream, one wait, compute between
    FUSED = "fused"  # inside the compute kernel


class SyncScope(DimensionValue):
    """What a consumer waits for."""

    GLOBAL = "global"  # a world barrier / everything
    PEER = "peer"  # per-peer signals
    CHUNK = "chunk"  # a flag per chunk
    TILE = "tile"  # a flag per output tile


class Issuer(DimensionValue):
    """Who issues each transfer."""

    THREAD = "thread"
    WARP = "warp"
    CTA = "cta"
    MULTI_CTA = "multi_cta"


CHUNK_CHOICES = (1, 2, 4, 8, 16)  # cuco::kMaxChunks (cuco_design_point.cuh) is the largest

# The enumerated dimensions, in the order directives list them; chunks, a count, comes last.
ENUMS: dict[str, type[DimensionValue]] = {"backend": Backend, "placement": Placement, "sync": SyncScope,
                                          "issuer": Issuer}

# name -> allowed values, in the order directives list them
DIMENSIONS: dict[str, tuple] = {**{name: tuple(v.value for v in kind) for name, kind in ENUMS.items()},
                                "chunks": CHUNK_CHOICES}
