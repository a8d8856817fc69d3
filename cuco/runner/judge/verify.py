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


# Elements per float64 temporary in compare: 16M (128 MB), so that checking a cache of billions of elements costs a
# few hundred MB beside it, not several times its size.
CHUNK_ELEMS = 1 << 24


@dataclass
class Check:
    ok: bool
    message: str = ""
    norm_rel_err: float | None = None
    bad: int = 0


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view: vectors along the last dimension (the unit of the "row" tolerance scale) as rows."""
    return t.reshape(1, 1) if t.dim() == 0 else t.reshape(-1, t.shape[-1]) if t.shape[-1] else t.reshape(-1, 1)


def _chunks(rows: int, cols: int):
    step = max(1, CHUNK_ELEMS // max(1, cols))
    return ((i, min(rows, i + step)) for i in range(0, rows, step))


def compare(name: str, out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float, norm_rtol: float,
            atol_scale: str = "tensor") -> Check:
    """Dtype-aware comparison: NaN/Inf fail, every element within rtol*|ref| + atol*rms(ref), small norm error.
    The rms is the whole reference's, or with atol_scale "row" that of the element's vector along the last dimension.
    A NaN in the reference marks an element the candidate must not write: it must still hold the poison.
    Works through the tensors a slice of rows at a time, in float64."""
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, f"{name}: shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
    if not out.dtype.is_floating_point:
        bad = int((out != ref.to(out.dtype)).sum())
        return Check(bad == 0, f"{name}: {bad} of {out.numel()} elements differ" if bad else "", 0.0, bad)
    o2, r2 = _rows(out), _rows(ref)
    rows, cols = r2.shape
    spans = list(_chunks(rows, cols))
    rms = 1e-30
    if atol_scale != "row":
        sq = sum(float(r2[a:b].double().nan_to_num(0.0).pow(2).sum()) for a, b in spans)
        rms = max((sq / ref.numel()) ** 0.5 if ref.numel() else 0.0, 1e-30)
    written = nonfinite = bad = 0
    first: dict[str, int] = {}
    max_err = err_sq = ref_sq = 0.0
    for a, b in spans:
        o, r = o2[a:b], r2[a:b]
        keep = torch.isnan(r)  # where the reference is NaN the output must still hold the poison: nothing wrote there
        if bool(keep.any()):
            w = keep & ~poisoned(o)
            if n := int(w.sum()):
                written += n
                first.setdefault("written", a * cols + int(torch.nonzero(w.flatten())[0]))
            o, r = o.masked_fill(keep, 0), r.masked_fill(keep, 0)
        o, r = o.double(), r.double()
        finite = torch.isfinite(o)
        if n := int((~finite).sum()):
            nonfinite += n
            first.setdefault("nonfinite", a * cols + int(torch.nonzero(~finite.flatten())[0]))
            o = o.masked_fill(~finite, 0)
        diff = (o - r).abs()
        scale = r.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-30) if atol_scale == "row" else rms
        bad_mask = diff > rtol * r.abs() + atol * scale
        if n := int(bad_mask.sum()):
            bad += n
            first.setdefault("bad", a * cols + int(torch.nonzero(bad_mask.flatten())[0]))
        max_err = max(max_err, float(diff.max()) if diff.numel() else 0.0)
        err_sq += float(diff.pow(2).sum())
        ref_sq += float(r.pow(2).sum())
    if written:
        return Check(False, f"{name}: {written} elements written where the buffer must be left untouched (first at "
                            f"flat index {first['written']})", None, written)
    if nonfinite:
        return Check(False, f"{name}: {nonfinite} of {out.numel()} elements are NaN/Inf "
                            f"(unwritten or invalid; first at flat index {first['nonfinite']})", None, nonfinite)
    rel = err_sq ** 0.5 / ref_sq ** 0.5 if ref_sq > 0 else err_sq ** 0.5
    if bad:
        return Check(False, f"{name}: {bad} of {out.numel()} elements out of tolerance (max |err| {max_err:.4g}, "
                            f"first at flat index {first['bad']}; relative norm error {rel:.3g})", rel, bad)
    if rel > norm_rtol:
        return Check(False, f"{name}: relative norm error {rel:.3g} exceeds {norm_rtol}", rel, 0)
    return Check(True, "", rel, 0)


def same(name: str, a: torch.Tensor, b: torch.Tensor, what: str) -> Check:
    """Bitwise equality (NaNs with the same bits count as equal)."""
    if torch.equal(a.view(torch.uint8) if a.is_contiguous() else a, b.view(torch.uint8) if b.is_contiguous() else b):
        return Check(True)
    diff = int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) if a.is_contiguous() else -1
    return Check(False, f"{name}: {what} ({diff} bytes differ)")
