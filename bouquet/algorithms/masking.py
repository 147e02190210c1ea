"""Secure sums by pairwise masks: the server learns the sum of the parties' arrays and nothing of each one.

The masking of SecAgg (Bonawitz et al., CCS 2017, section 4) without its dropout recovery: every pair of
parties ``i < j`` agrees on a secret seed by an X25519 key exchange (each sends the server its public key; the
server hands every party the list), and for each array of each exchange both draw the same stream of uniform
64-bit words from it (ChaCha20).  Party ``i`` adds the streams of its pairs with later parties and subtracts
those with earlier ones, to its array in fixed point (``round(v * 2**FRACTION_BITS)``, modulo 2**64), so every
mask appears once with each sign and the sum over all parties, modulo 2**64, is the sum of the fixed-point
arrays: :func:`unmask` turns it back into floats.  A single masked array is uniform noise to whoever lacks the
pairs' seeds (the server never has them: it sees public keys only).

Without SecAgg's secret-sharing round a party that drops out leaves its masks in the sum, so the sum is
garbage; bouquet's tree fit already stops when a node does not answer (every row counts), so no weaker
promise is made.  Fixed point keeps ``FRACTION_BITS`` = 24 fractional bits: counts and L1's sign sums are
exact, a float sum moves by at most ``parties * 2**-25``.  Pure numpy and ``cryptography`` (Flower depends on
it); no Flower import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = ["FRACTION_BITS", "add_masked", "mask", "new_private_key", "pair_seeds", "public_key", "unmask"]

#: Fractional bits of the fixed point the masks are added in.
FRACTION_BITS = 24
_SCALE = float(2 ** FRACTION_BITS)


def new_private_key() -> bytes:
    """A fresh X25519 private key (32 bytes, from the operating system's randomness)."""
    return X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_key(private: bytes) -> bytes:
    """The 32-byte public key of ``private``."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def pair_seeds(private: bytes, me: int, public_keys: Sequence[bytes]) -> list[bytes | None]:
    """The seed this party (position ``me`` in ``public_keys``) shares with each other party (None for itself):
    SHA-256 of the X25519 shared secret, the same on both sides."""
    if not 0 <= me < len(public_keys):
        raise ValueError(f"party {me} is not among the {len(public_keys)} public keys")
    own = X25519PrivateKey.from_private_bytes(private)
    if public_keys[me] != public_key(private):
        raise ValueError("the public key listed for this party is not its own")
    return [None if j == me else hashlib.sha256(own.exchange(X25519PublicKey.from_public_bytes(key))).digest()
            for j, key in enumerate(public_keys)]


def _stream(seed: bytes, step: int, name: str, size: int) -> np.ndarray:
    nonce = hashlib.sha256(f"{step}/{name}".encode()).digest()[:16]
    words = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor().update(bytes(8 * size))
    return np.frombuffer(words, dtype=np.uint64)


def _fixed(values: np.ndarray) -> np.ndarray:
    scaled = np.rint(np.asarray(values, dtype=np.float64) * _SCALE)
    if not np.isfinite(scaled).all() or np.abs(scaled).max(initial=0.0) >= 2.0 ** 62:
        raise ValueError(f"values too large (or not finite) for {FRACTION_BITS} fractional bits of 64")
    return scaled.astype(np.int64).view(np.uint64)


def mask(arrays: Mapping[str, np.ndarray], seeds: Sequence[bytes | None], me: int, step: int
         ) -> dict[str, np.ndarray]:
    """``arrays`` in fixed point plus this party's masks for exchange ``step`` (uint64, same shapes)."""
    out = {}
    for name, values in arrays.items():
        fixed = _fixed(values).ravel().copy()
        for j, seed in enumerate(seeds):
            if seed is None:
                continue
            stream = _stream(seed, step, name, fixed.size)
            fixed = fixed + stream if me < j else fixed - stream  # uint64 wraps: arithmetic modulo 2**64
        out[name] = fixed.reshape(np.shape(values))
    return out


def add_masked(replies: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The parties' masked arrays added modulo 2**64, array by array."""
    out: dict[str, np.ndarray] = {}
    for reply in replies:
        for name, values in reply.items():
            values = np.asarray(values, dtype=np.uint64)
            out[name] = out[name] + values if name in out else values.copy()
    return out


def unmask(summed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sums as floats (the masks have cancelled: every party's arrays were added)."""
    return {name: np.asarray(values, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE
            for name, values in summed.items()}
