"""What the judges derive from their shared secret: the seed of every draw, the key of every run, and the digest
that says a parameter is as drawn.

The secret is 63 bits from the system's random source. Nothing the candidate sees is a function of it that it could
invert: each generator's seed and each run's key is a keyed hash of it (blake2b), so the values a candidate
legitimately reads (the weights, a run's inputs) give away neither the secret nor the seed of any other draw. Every
generator's stream depends on all 64 bits of its seed, on the CPU too (`seeded`): 32 would be searched in seconds.
"""

from __future__ import annotations

import hashlib
import random
import struct

import torch

SECRET_BITS = 63  # crosses the judges' group as one int64
DIGEST_CHUNK = 64 * 2**20  # bytes hashed at once: the key stream and temporaries stay small beside the weights
# splitmix64's finalizer, a bijection of each word: its rounds (shift, multiplier as a signed int64), then a last
# shift. A multiplication carries a bit only upwards; the shifts around it make a word's top bit reach the rest
# too (else flipping the top bits of two words changes the sum by amounts that cancel, for half of all keys).
_ROUNDS = ((30, -4658895280553007687), (27, -7723592293110705685))
_LAST_SHIFT = 31

# torch's CPU generator state (CPUGeneratorImplState): the legacy head (the seed, left, seeded, next), then
# mt19937's 624 words, each in a uint64, then the normal samples' caches.
MT_WORDS = 624
_MT_HEAD = struct.Struct("=QiiQ")
_MT_STATE = struct.Struct(f"={MT_WORDS}Q")


def new_secret() -> int:
    return random.SystemRandom().randrange(2**SECRET_BITS)


def derive(*parts: object) -> int:
    """A 64-bit value of `parts` (the secret among them) that says nothing of them: a generator's seed, a key."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def generator(device: torch.device | str, *parts: object) -> torch.Generator:
    return seeded(device, derive(*parts))


def seeded(device: torch.device | str, seed: int) -> torch.Generator:
    """A generator whose stream depends on every bit of the 64-bit `seed`. CUDA's Philox takes the seed whole; the
    CPU's mt19937 keeps 32 bits of it, so there its whole state is expanded from the seed instead."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if gen.device.type == "cpu":
        gen.set_state(_mt19937_state(gen.get_state(), seed))
    return gen


def _mt19937_state(state: torch.Tensor, seed: int) -> torch.Tensor:
    """`state`, torch's CPU state just after manual_seed(seed), with mt19937's words replaced by SHAKE-256 of the
    seed's 64 bits: the engine twists them before its first output, as it does a seeded state."""
    seed &= 2**64 - 1  # as manual_seed reads a negative one
    raw = bytearray(state.numpy().tobytes())
    head, words = _MT_HEAD.unpack_from(raw), _MT_STATE.unpack_from(raw, _MT_HEAD.size)
    # As manual_seed leaves it: this seed, one word left, seeded, the next at 0, the first word the seed's low half.
    if head != (seed, 1, 1, 0) or words[0] != seed & 0xFFFFFFFF:
        raise RuntimeError(f"torch {torch.__version__} lays out its CPU generator's state otherwise than cuco reads "
                           "it: the generators' seeds cannot be set")
    stream = hashlib.shake_256(seed.to_bytes(8, "little")).digest(4 * MT_WORDS)
    _MT_STATE.pack_into(raw, _MT_HEAD.size, *struct.unpack(f"<{MT_WORDS}I", stream))
    return torch.frombuffer(raw, dtype=torch.uint8).clone()


def digest(t: torch.Tensor, key: int) -> int:
    """A keyed digest of a tensor's bytes: the sum of every 8-byte word XORed with a key stream and mixed. Without
    the key no change to the bytes can be made to keep it; with it, the judge checks tens of GB of weights
    without holding a second copy of them."""
    flat = t.detach().reshape(-1).view(torch.uint8)
    gen = seeded(t.device, key)
    total = 0
    for start in range(0, flat.numel(), DIGEST_CHUNK):
        part = flat[start:start + DIGEST_CHUNK]
        if part.numel() % 8 or part.storage_offset() % 8:  # whole words, aligned: a fresh copy of the tail
            part = torch.cat([part, part.new_zeros(-part.numel() % 8)])
        # the key stream over the whole int64 range: its sign bits too
        z = part.view(torch.int64) ^ torch.empty(part.numel() // 8, dtype=torch.int64, device=t.device).random_(
            -2**63, None, generator=gen)
        for shift, multiplier in _ROUNDS:
            _xorshift(z, shift)
            z *= multiplier
        _xorshift(z, _LAST_SHIFT)
        total = (total + int(z.sum())) % 2**64
    return total


def _xorshift(z: torch.Tensor, shift: int) -> None:
    """z ^= z >> shift, the shift a logical one: the arithmetic one, its sign bits masked off."""
    z ^= (z >> shift).bitwise_and_((1 << (64 - shift)) - 1)
