"""Correctness checks against the workload's PyTorch reference: the verdicts, not the policy of when."""

from __future__ import annotations

from dataclasses import dataclass

import torch

POISON_BYTE = 0xFF  # all-ones bytes are NaN in bf16, f16, f32 and f64, and -1 in integer types


def poison(t: torch.Tensor) -> None:
    t.view(torch.uint8).fill_(POISON_BYTE) if t.is_contiguous() else t.fill_(float("nan"))


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Per element: does it still hold the poison, every byte POISON_BYTE?"""
    b = t.contiguous().view(torch.uint8).view(*t.shape, t.element_size())
    return (b == POISON_BYTE).all(dim=-1)


@dataclass
class Check:
    ok: bool
    message: str = ""
    norm_rel_err: float | None = None
    bad: int = 0


def compare(name: str, out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float, norm_rtol: float,
            atol_scale: str = "tensor") -> Check:
    """Dtype-aware comparison: NaN/Inf fail, every element within rtol*|ref| + atol*rms(ref), small norm error.
    The rms is the whole reference's, or with atol_scale "row" that of the element's vector along the last dimension.
    A NaN in the reference marks an element the candidate must not write: it must still hold the poison."""
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, f"{name}: shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
    if not out.dtype.is_floating_point:
        bad = int((out != ref.to(out.dtype)).sum())
        return Check(bad == 0, f"{name}: {bad} of {out.numel()} elements differ" if bad else "", 0.0, bad)
    keep = torch.isnan(ref)  # where the reference is NaN the output must still hold the poison: nothing wrote there
    if bool(keep.any()):
        written = keep & ~poisoned(out)
        n = int(written.sum())
        if n:
            first = int(torch.nonzero(written.flatten())[0])
            return Check(False, f"{name}: {n} elements written where the buffer must be left untouched (first at "
                                f"flat index {first})", None, n)
        out, ref = out.masked_fill(keep, 0), ref.masked_fill(keep, 0)
    o, r = out.double(), ref.double()
    nonfinite = int((~torch.isfinite(o)).sum())
    if nonfinite:
        first = int(torch.nonzero(~torch.isfinite(o.flatten()))[0])
        return Check(False, f"{name}: {nonfinite} of {o.numel()} elements are NaN/Inf "
                            f"(unwritten or invalid; first at flat index {first})", None, nonfinite)
    diff = (o - r).abs()
    if atol_scale == "row" and r.dim() > 0 and r.shape[-1] > 0:
        rms = r.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-30)
    else:
        rms = max(float(r.pow(2).mean().sqrt()) if r.numel() else 0.0, 1e-30)
    allowed = rtol * r.abs() + atol * rms
    bad_mask = diff > allowed
    bad = int(bad_mask.sum())
    norm_ref = float(r.norm())
    rel = float(diff.norm()) / norm_ref if norm_ref > 0 else float(diff.norm())
    if bad:
        first = int(torch.nonzero(bad_mask.flatten())[0])
        return Check(False, f"{name}: {bad} of {o.numel()} elements out of tolerance (max |err| {float(diff.max()):.4g}, "
                            f"first at flat index {first}; relative norm error {rel:.3g})", rel, bad)
    if rel > norm_rtol:
        return Check(False, f"{name}: relative norm error {rel:.3g} exceeds {norm_rtol}", rel, 0)
    return Check(True, "", rel, 0)


def same(name: str, a: torch.Tensor, b: torch.Tensor, what: str) -> Check:
    """Bitwise equality (NaNs with the same bits count as equal)."""
    if torch.equal(a.view(torch.uint8) if a.is_contiguous() else a, b.view(torch.uint8) if b.is_contiguous() else b):
        return Check(True)
    diff = int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) if a.is_contiguous() else -1
    return Check(False, f"{name}: {what} ({diff} bytes differ)")
