"""The peer-visible buffers of a fused row-parallel GEMM, for Python candidates: torch symmetric memory,
allocated and exchanged once, in setup, on every rank in the same order (the rendezvous is collective)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed._symmetric_memory as symm_mem

from cuco.kernels.gemm import Partials, partials_counters


@dataclass
class PartialsExchange:
    """Two receive buffers, by the parity of the run, so that a sender one run ahead never overwrites partials
    their owner still reads (two runs ahead is impossible: the sender's previous run waited for this rank's
    partials, which this rank's previous kernel, ended by then, sent); one set of counters, which only grow."""

    rank: int
    world: int
    recv: torch.Tensor  # [2, world, rows, n]
    counters: torch.Tensor
    dest: list[torch.Tensor]  # per parity: each rank's address of its recv slot for this rank
    flags: torch.Tensor
    run: int = 0  # runs so far

    def next_run(self) -> Partials:
        """What the next run (every run calls this once) passes to the GEMM."""
        self.run += 1
        parity = self.run % 2
        return Partials(self.rank, self.world, self.recv[parity], self.counters, self.dest[parity], self.flags,
                        self.run)


def symmetric_tensor(shape, dtype: torch.dtype, device: torch.device, group_name: str, zeroed: bool = False):
    """A tensor in torch symmetric memory and its handle, exchanged with every rank of the group (collective: every
    rank calls it at the same point). `zeroed`: zero, and finished so, before the rendezvous, so that no peer that
    passes it can bump a counter in it that is still to be zeroed."""
    t = symm_mem.empty(shape, dtype=dtype, device=device)
    if zeroed:
        t.zero_()
        torch.cuda.current_stream(device).synchronize()
    return t, symm_mem.rendezvous(t, group_name)


def partials_exchange(out: torch.Tensor, rank: int, world: int, group_name: str) -> PartialsExchange:
    """The exchange of a GEMM whose output, on every rank, is `out` (rows x n): a partial product of that shape
    passes from each rank to each other."""
    (rows, n), dtype, device = out.shape, out.dtype, out.device
    recv, hr = symmetric_tensor(2 * world * rows * n, dtype, device, group_name)
    counters, hc = symmetric_tensor(partials_counters(world, rows, n), torch.int32, device, group_name, zeroed=True)
    slot = rows * n * recv.element_size()

    def per_rank(addr) -> torch.Tensor:
        return torch.tensor([addr(s) if s != rank else 0 for s in range(world)], dtype=torch.int64, device=device)

    return PartialsExchange(rank, world, recv.view(2, world, rows, n), counters,
                            [per_rank(lambda s, p=parity: hr.buffer_ptrs[s] + (p * world + rank) * slot)
                             for parity in range(2)],
                            per_rank(lambda s: hc.buffer_ptrs[s]))
