"""The machine's ceilings: the best rates this GPU reaches, each measured with the best microbenchmark cuco has,
with its method and its share of the datasheet figure. They are what a speed-of-light bound divides by.

A ceiling measured while something else runs on the GPU is too low, and a bound made from it too high (honest
candidates would look impossible): `measure` checks before and after that no other process holds the GPU and that
the same probe gives the same rate at the start and at the end, and refuses to return ceilings otherwise.
probes.py holds the microbenchmarks, measure.py the guarded measurement, stream.py the Triton streaming kernels.
"""

from cuco.ceilings.measure import DATASHEET, Busy, Ceiling, all_rates, datasheet, measure, other_processes, to_facts
from cuco.ceilings.probes import (
    GEMM_SHAPES,
    SUSTAINED_MS,
    hbm_rates,
    link_rates,
    probe_gemm,
    sustained_tensor_rate,
    tensor_rate,
)

__all__ = ["DATASHEET", "GEMM_SHAPES", "SUSTAINED_MS", "Busy", "Ceiling", "all_rates", "datasheet", "hbm_rates",
           "link_rates", "measure", "other_processes", "probe_gemm", "sustained_tensor_rate", "tensor_rate",
           "to_facts"]
