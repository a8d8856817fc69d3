"""What the judges derive from their secret: seeds that give nothing away, and the digest that stands in for a
second copy of the weights."""

from __future__ import annotations

import pytest
import torch

from cuco.runner.judge.keyed import DIGEST_CHUNK, _mt19937_state, derive, digest, generator, seeded


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


def _draws(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, generator=gen), torch.empty(8, dtype=torch.int64).random_(generator=gen)


@pytest.mark.parametrize("bit", [0, 31, 32, 40, 63])
def test_a_cpu_generator_depends_on_every_bit_of_its_seed(bit):
    """mt19937 keeps 32 bits of a seed given to manual_seed: seeds alike in those would draw alike."""
    seed = derive(5, "inputs", 3, 0)
    first, again, other = (_draws(seeded("cpu", s)) for s in (seed, seed, seed ^ (1 << bit)))
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not any(torch.equal(x, y) for x, y in zip(first, other))
    assert seeded("cpu", seed).initial_seed() == seed


def test_an_unknown_generator_state_is_refused():
    with pytest.raises(RuntimeError, match="lays out its CPU generator's state otherwise"):
        _mt19937_state(torch.Generator().manual_seed(1).get_state(), 2)


def test_a_digest_depends_on_every_bit_of_its_key_and_every_bit_of_a_word():
    w = torch.randn(64, dtype=torch.bfloat16)
    d = digest(w, derive(1, "key"))
    assert digest(w, derive(1, "key") ^ (1 << 63)) != d and digest(w, derive(1, "key") ^ (1 << 40)) != d
    flipped = w.clone()
    flipped[3], flipped[7] = -w[3], -w[7]  # the top bits of two words: changes that cancel in a weaker mix
    assert all(digest(flipped, derive(k, "key")) != digest(w, derive(k, "key")) for k in range(64))
