"""A small HyperLogLog of a section's keys, written with the section, so planners can estimate duplicates.

128 registers of one byte (about 9% standard error), built vectorized from the key hashes the file
already holds; sketches of several sections merge by taking the larger register.
"""

from __future__ import annotations

import base64

import numpy as np

PRECISION = 7
REGISTERS = 1 << PRECISION
_ALPHA = 0.7213 / (1 + 1.079 / REGISTERS)


def sketch_words(words: np.ndarray) -> np.ndarray:
    """Registers for 64-bit hash words: the first PRECISION bits pick a register, the rest give a rank."""
    registers = np.zeros(REGISTERS, dtype=np.uint8)
    if len(words):
        index = (words >> np.uint64(64 - PRECISION)).astype(np.intp)
        rest = (words << np.uint64(PRECISION)) | np.uint64(1 << (PRECISION - 1))  # a set bit bounds the rank
        _mantissa, exponent = np.frexp(rest.astype(np.float64))
        rank = np.maximum(65 - exponent, 1).astype(np.uint8)  # leading zeros of `rest`, plus one
        np.maximum.at(registers, index, rank)
    return registers


def merge(*sketches: np.ndarray) -> np.ndarray:
    return np.maximum.reduce(sketches) if sketches else np.zeros(REGISTERS, dtype=np.uint8)


def estimate(registers: np.ndarray) -> float:
    """Distinct keys estimated from registers (HyperLogLog with the small-range correction)."""
    raw = _ALPHA * REGISTERS**2 / float(np.sum(np.power(2.0, -registers.astype(np.float64))))
    zeros = int(np.count_nonzero(registers == 0))
    if raw <= 2.5 * REGISTERS and zeros:
        return REGISTERS * float(np.log(REGISTERS / zeros))
    return raw


def encode(registers: np.ndarray) -> str:
    return base64.b64encode(registers.tobytes()).decode()


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.uint8)
