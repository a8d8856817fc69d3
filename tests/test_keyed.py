"""What the judges derive from their secret: seeds that give nothing away, and the digest that stands in for a
second copy of the weights."""

from __future__ import annotations

import torch

from cuco.runner.keyed import DIGEST_CHUNK, derive, digest, generator


def test_a_digest_sees_every_word_and_depends_on_its_key():
    w = torch.randn(3, 1001, dtype=torch.bfloat16)  # 6006 bytes: a tail that is not a whole word
    d = digest(w, 7)
    assert digest(w.clone(), 7) == d and digest(w, 8) != d
    for index in [(0, 0), (1, 500), (2, 1000)]:
        changed = w.clone()
        changed[index] = changed[index] + 1
        assert digest(changed, 7) != d, index
    swapped = w.clone()
    swapped[0, :2] = w[0, :2].flip(0)
    assert digest(swapped, 7) != d


def test_a_digest_covers_every_chunk():
    w = torch.zeros(DIGEST_CHUNK + 24, dtype=torch.uint8)
    d = digest(w, 1)
    w[-1] = 1
    assert digest(w, 1) != d
    assert digest(w[1:], 1) != digest(w[:-1], 1)  # an odd start


def test_generators_are_keyed_hashes_of_the_secret():
    assert derive(5, "inputs", 3, 0) != derive(5, "inputs", 3, 1) != derive(5, "parameters", 3, 1)
    a = torch.randn(4, generator=generator("cpu", 5, "inputs", 3, 0))
    assert torch.equal(a, torch.randn(4, generator=generator("cpu", 5, "inputs", 3, 0)))
    assert not torch.equal(a, torch.randn(4, generator=generator("cpu", 6, "inputs", 3, 0)))
    assert 0 <= derive(2**63 - 1, "key", 1, 0) < 2**64
