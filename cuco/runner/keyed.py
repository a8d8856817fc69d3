"""What the judges derive from their shared secret: the seed of every draw, the key of every run, and the digest
that says a parameter is as drawn.

The secret is 63 bits from the system's random source. Nothing the candidate sees is a function of it that it could
invert: each generator's seed and each run's key is a keyed hash of it (blake2b), so the values a candidate
legitimately reads (the weights, a run's inputs) give away neither the secret nor the seed of any other draw.
"""

from __future__ import annotations

import hashlib
import random

import torch

SECRET_BITS = 63  # crosses the judges' group as one int64
DIGEST_CHUNK = 64 * 2**20  # bytes hashed at once: the key stream and temporaries stay small beside the weights
# splitmix64's multipliers (as signed int64): a bijection of each word, so that no change of one word cancels out
_MIX = (-7046029254386353131, -4658895280553007687)
_LOW33 = (1 << 33) - 1


def new_secret() -> int:
    return random.SystemRandom().randrange(2**SECRET_BITS)


def derive(*parts: object) -> int:
    """A 64-bit value of `parts` (the secret among them) that says nothing of them: a generator's seed, a key."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def generator(device: torch.device | str, *parts: object) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derive(*parts))


def digest(t: torch.Tensor, key: int) -> int:
    """A keyed digest of a tensor's bytes: the sum of every 8-byte word XORed with a key stream and mixed. Without
    the key no change to the bytes can be made to keep it; with it, the judge checks tens of GB of weights
    without holding a second copy of them."""
    flat = t.detach().reshape(-1).view(torch.uint8)
    gen = torch.Generator(device=t.device).manual_seed(key)
    total = 0
    for start in range(0, flat.numel(), DIGEST_CHUNK):
        part = flat[start:start + DIGEST_CHUNK]
        if part.numel() % 8 or part.storage_offset() % 8:  # whole words, aligned: a fresh copy of the tail
            part = torch.cat([part, part.new_zeros(-part.numel() % 8)])
        z = part.view(torch.int64) ^ torch.empty(part.numel() // 8, dtype=torch.int64, device=t.device).random_(
            generator=gen)
        z *= _MIX[0]
        z ^= (z >> 31) & _LOW33  # a logical shift: the arithmetic one, its sign bits masked off
        z *= _MIX[1]
        total = (total + int(z.sum())) % 2**64
    return total
