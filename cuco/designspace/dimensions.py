"""The five dimensions of a candidate's communication design (docs/design.md, "The design space")."""

from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    """How bytes move."""

    LSA = "lsa"  # load/store over NVLink through NCCL device-API windows (ncclGetLsaPointer)
    CE = "ce"  # copy engine: cudaMemcpyAsync from peer memory
    GIN = "gin"  # NCCL GPU-initiated networking: needs an RDMA NIC
    NCCL_HOST = "nccl_host"  # host-issued NCCL (or gloo) collectives: the baseline
    NVSHMEM = "nvshmem"


class Placement(str, Enum):
    """Where communication is issued relative to compute."""

    DEFERRED = "deferred"  # all communication, then all compute
    STREAM_OVERLAP = "stream_overlap"  # side stream, chunked compute, a wait per chunk
    SPLIT_PUT_WAIT = "split_put_wait"  # put on a side stream, one wait, compute between
    FUSED = "fused"  # inside the compute kernel


class SyncScope(str, Enum):
    """What a consumer waits for."""

    GLOBAL = "global"  # a world barrier / everything
    PEER = "peer"  # per-peer signals
    CHUNK = "chunk"  # a flag per chunk
    TILE = "tile"  # a flag per output tile


class Issuer(str, Enum):
    """Who issues each transfer."""

    THREAD = "thread"
    WARP = "warp"
    CTA = "cta"
    MULTI_CTA = "multi_cta"


CHUNK_CHOICES = (1, 2, 4, 8, 16)

# name -> allowed values, in the order directives list them
DIMENSIONS: dict[str, tuple] = {
    "backend": tuple(b.value for b in Backend),
    "placement": tuple(p.value for p in Placement),
    "sync": tuple(s.value for s in SyncScope),
    "issuer": tuple(i.value for i in Issuer),
    "chunks": CHUNK_CHOICES,
}
