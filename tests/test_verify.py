"""The verdicts of the output comparison do not depend on how many rows it checks at a time: a cache of billions of
elements is checked a slice at a time, and every count, first index and norm must be the whole tensor's."""

from __future__ import annotations

import pytest
import torch

from cuco.runner.judge import verify


def _cases():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 5, 4, generator=g)
    ok = ref.to(torch.bfloat16)
    far = ok.clone()
    far[4, 1, 2] += 3.0
    far[5, 0, 0] -= 3.0
    nan = ok.clone()
    nan[3, 2, 1] = float("nan")
    keep_ref = ref.clone()
    keep_ref[2:, 4] = float("nan")  # rows the candidate must leave holding the poison
    poison = torch.empty_like(ok)
    verify.poison(poison)
    kept = torch.where(torch.isnan(keep_ref), poison, ok)
    touched = kept.clone()
    touched[5, 4, 3] = 0.0
    return {"within": (ok, ref), "out_of_tolerance": (far, ref), "nan": (nan, ref),
            "untouched_kept": (kept, keep_ref), "untouched_written": (touched, keep_ref)}


@pytest.mark.parametrize("scale", ["tensor", "row"])
@pytest.mark.parametrize("case", list(_cases()))
def test_slices_give_the_whole_tensors_verdict(case, scale, monkeypatch):
    out, ref = _cases()[case]
    whole = verify.compare("y", out, ref, 0.02, 0.02, 0.01, scale)
    monkeypatch.setattr(verify, "CHUNK_ELEMS", 7)  # one row of 4 per slice, slices ending inside the tensor
    sliced = verify.compare("y", out, ref, 0.02, 0.02, 0.01, scale)
    assert (sliced.ok, sliced.message, sliced.bad) == (whole.ok, whole.message, whole.bad)
    assert sliced.norm_rel_err == pytest.approx(whole.norm_rel_err)
    assert whole.ok == (case in ("within", "untouched_kept"))


def test_first_index_is_the_tensors_not_the_slices(monkeypatch):
    out, ref = _cases()["out_of_tolerance"]
    monkeypatch.setattr(verify, "CHUNK_ELEMS", 7)
    check = verify.compare("y", out, ref, 0.02, 0.02, 0.01)
    assert check.bad == 2 and f"first at flat index {4 * 20 + 1 * 4 + 2};" in check.message
