"""Counter-based random bits for stochastic rounding (issue 30): Philox4x32-10.

``fpsim.round(x, fmt, rounding="sr", rng=fpsim.random.Philox(seed))`` draws its random words from a
counter-based generator (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11: the Philox of
cuRAND and Random123) instead of a NumPy ``Generator``. Word ``t`` of the stream is a pure function of the
key and ``t``, so every thread computes its own elements' words with nothing to jump over: the result is the
same on 1, 2 or N threads and whatever the chunking, and the compiled kernel vectorises the generator.

The stream is not NumPy's (``numpy.random.Philox`` is Philox4x64 and orders its words otherwise): a seeded
NumPy ``Generator`` keeps giving the bits it always gave. Words are handed out in call order: each call takes
the next ``n`` words (float32 carrier: one per element; float64 carrier: two, the first the low half; half a
word, the low half first, where the rounding reads at most 16 random bits per element of a float32 carrier:
bf16, ``sr_bits <= 16``) and the position moves on to the next multiple of four, so consecutive calls never
share a block.

The NumPy implementation here (:func:`philox_words`) is the reference of the compiled one; Random123's
known-answer vectors are the oracle of both (tests/test_philox.py).
"""

from __future__ import annotations

import threading

import numpy as np

from ._checks import check_int
from ._fpenv import ieee_mode

__all__ = ["Philox", "philox_words"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_MAX_KEY = (1 << 64) - 1
_MAX_POS = (1 << 66) - 1  # the counter is the block index t // 4: 64 bits of it


def _rounds(c: np.ndarray, key: int, rounds: int = 10) -> np.ndarray:
    """Philox4x32 rounds on blocks ``c`` (shape (..., 4), uint64 holding 32-bit words): the bijection of SC'11."""
    c0, c1, c2, c3 = (c[..., i].astype(np.uint64) for i in range(4))
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    for _ in range(rounds):
        p0, p1 = _M0 * c0, _M1 * c2  # 32 x 32 -> 64 bits: exact in uint64
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & _MASK32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & _MASK32)
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


@ieee_mode
def philox_words(key: int, start: int, n: int) -> np.ndarray:
    """Words ``start .. start + n - 1`` of the Philox4x32-10 stream of ``key`` (the NumPy reference).

    Word ``t`` is word ``t % 4`` of the block ``Philox4x32-10(counter, key)`` with the 128-bit counter
    ``t // 4`` (its low 32 bits first) and the 64-bit ``key`` as the two key words (low first).

    Examples
    --------
    >>> [f"{w:08x}" for w in philox_words(0, 0, 4)]  # Random123's known answer for counter 0, key 0
    ['6627e8d5', 'e169c58d', 'bc57ac4c', '9b00dbd8']
    """
    key = check_int(key, "key", lo=0, hi=_MAX_KEY)
    start = check_int(start, "start", lo=0, hi=_MAX_POS)
    n = check_int(n, "n", lo=0)
    if start + n > _MAX_POS + 1:
        raise ValueError(f"words {start} .. {start + n - 1} run past the end of the stream (2**66 words)")
    b0, b1 = start // 4, (start + n + 3) // 4
    blocks = np.arange(b1 - b0, dtype=np.uint64) + np.uint64(b0) if b1 > b0 else np.zeros(0, np.uint64)
    c = np.zeros((blocks.size, 4), dtype=np.uint64)
    c[:, 0], c[:, 1] = blocks & _MASK32, blocks >> np.uint64(32)
    words = _rounds(c, key).reshape(-1)
    off = start - 4 * b0
    return words[off : off + n]


@ieee_mode
class Philox:
    """A Philox4x32-10 random stream for ``rounding="sr"``: ``rng=fpsim.random.Philox(seed)``.

    Parameters
    ----------
    seed : int or numpy.random.Generator
        The 64-bit key (0 .. 2**64 - 1), or a ``Generator`` to draw it from (one 64-bit word, once).
    position : int, optional
        The stream word the next call starts at (default 0); with :attr:`state`, a stream resumes exactly.

    Notes
    -----
    Each call of ``fpsim.round`` takes the next words and moves :attr:`position` on (safe to share between
    threads: the words a call takes are reserved under a lock). Unlike a NumPy ``Generator``, the words one
    element gets do not depend on how the work is split among threads.

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> x = np.full(8, 1 + 2**-9, dtype=np.float32)  # a quarter of a bf16 ulp above 1
    >>> r = fpsim.round(x, "bf16", rounding="sr", rng=fpsim.random.Philox(7))
    >>> sorted(set(r.tolist()))
    [1.0, 1.0078125]
    >>> fpsim.random.Philox(7, position=8).state
    {'key': 7, 'position': 8}
    """

    def __init__(self, seed: int | np.random.Generator, *, position: int = 0) -> None:
        if isinstance(seed, np.random.Generator):
            key = int(seed.integers(0, _MAX_KEY, dtype=np.uint64, endpoint=True))
        else:
            key = check_int(seed, "seed", lo=0, hi=_MAX_KEY)
        self._key = key
        self._pos = check_int(position, "position", lo=0, hi=_MAX_POS)
        self._lock = threading.Lock()

    @property
    def key(self) -> int:
        """The 64-bit key."""
        return self._key

    @property
    def position(self) -> int:
        """The stream word the next call starts at."""
        return self._pos

    @property
    def state(self) -> dict[str, int]:
        """``{"key": ..., "position": ...}``: JSON-ready; :meth:`from_state` resumes the stream from it."""
        return {"key": self._key, "position": self._pos}

    @classmethod
    def from_state(cls, state: dict[str, int]) -> Philox:
        """The stream a :attr:`state` describes, resumed where it was."""
        if not isinstance(state, dict) or set(state) != {"key", "position"}:
            raise ValueError(f"a Philox state is a dict with keys 'key' and 'position', got {state!r}")
        return cls(state["key"], position=state["position"])

    def take(self, n: int) -> int:
        """Reserve the next ``n`` words: their first word's index; the position moves to the next multiple of 4."""
        n = check_int(n, "n", lo=0)
        with self._lock:
            start = self._pos
            end = start + n
            if end > _MAX_POS + 1:
                raise ValueError(f"the Philox stream is exhausted (2**66 words; at word {start}, {n} more asked)")
            self._pos = min(-(-end // 4) * 4, _MAX_POS + 1)
        return start

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` 32-bit words (uint32), as ``fpsim.round`` would take them."""
        return philox_words(self._key, self.take(n), n)

    def __repr__(self) -> str:
        return f"fpsim.random.Philox(key={self._key}, position={self._pos})"
