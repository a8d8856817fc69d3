"""The L2 flush between timed runs: every line the last run (or the judge's own writes of inputs and poison) left in
L2 is evicted before the clock starts, and what replaces it is clean.

The flush reads a buffer twice L2's size rather than writing it. A written flush leaves L2 full of dirty lines, and
the timed run then pays to write them back to HBM as its own reads evict them: about 60 MB on an H200, 13 us at its
HBM rate, a third of a decode GEMM's time (benchmarks/results/decode_gemm.md, the flush's effect). Read lines are
clean and leave without a write, so a run is charged for its own traffic alone.
"""

from __future__ import annotations

import torch

L2_FLUSH_BYTES = 2 * 60 * 2**20  # twice the largest Hopper L2 (60 MB on H200): evicts everything


class L2Flush:
    """A zeroed buffer of L2_FLUSH_BYTES on `device`, read whole by `flush()` on the current stream."""

    def __init__(self, device: torch.device) -> None:
        self.buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
        self.out = torch.zeros((), dtype=torch.float32, device=device)  # the sum, kept so the reads are not elided

    def flush(self) -> None:
        torch.sum(self.buf, dim=0, out=self.out)
