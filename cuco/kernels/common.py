"""What every Triton kernel of cuco.kernels needs from the host side: whether it runs interpreted, how many SMs it
may fill, and whether an operand may be read through a TMA descriptor or must take the pointer path."""

from __future__ import annotations

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

TMA_ALIGN = 16  # bytes: TMA's rule for a descriptor's base address and row stride


@triton.jit
def _probe():
    pass


def interpreted() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1 at import) runs the kernels on the host: no TMA, no PTX."""
    return type(_probe).__name__ == "InterpretedFunction"


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter runs programs one after another: a few keep a CPU test quick
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_major(call: str, **tensors: torch.Tensor) -> None:
    """The kernels address every matrix as row-major and dense (row r starts at r * columns): a transposed or
    sliced view would be read wrongly, so it is refused by name rather than computed on."""
    for name, t in tensors.items():
        if t.dim() != 2 or not t.is_contiguous():
            raise ValueError(f"{call}: {name} must be a dense row-major 2-D tensor (got shape {tuple(t.shape)}, "
                             f"strides {t.stride()}): pass {name}.contiguous()")


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Every tensor may be read through a TMA descriptor (compiled, 16-byte aligned base and rows, unit stride)."""
    return not interpreted() and all(
        t.data_ptr() % TMA_ALIGN == 0 and (t.stride(0) * t.element_size()) % TMA_ALIGN == 0 and t.stride(1) == 1
        for t in tensors)


def descriptor(t: torch.Tensor, block: list[int], tma: bool):
    """A TMA descriptor of `t` in `block`-sized boxes, or `t` itself for the pointer path."""
    return TensorDescriptor.from_tensor(t, block) if tma else t
