"""A small HyperLogLog of a section's keys, written with the section, so planners can estimate duplicates.

128 registers of one byte (about 9% standard error), built by one compiled pass over the key hashes the file
already holds; sketches of several sections merge by taking the larger register.

Packed form (in files and the catalog): a small section sets few registers, so its sketch is stored as
(register, rank) byte pairs when that is shorter than the 128 registers themselves.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numba
import numpy as np

PRECISION = 7
REGISTERS = 1 << PRECISION
_ALPHA = 0.7213 / (1 + 1.079 / REGISTERS)


def register_ranks(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per 64-bit hash word: its register (the first PRECISION bits) and rank (leading zeros of the rest, + 1)."""
    index = (words >> np.uint64(64 - PRECISION)).astype(np.intp)
    rest = (words << np.uint64(PRECISION)) | np.uint64(1 << (PRECISION - 1))  # a set bit bounds the rank
    _mantissa, exponent = np.frexp(rest.astype(np.float64))
    return index, np.maximum(65 - exponent, 1).astype(np.uint8)


def sketch_words(words: np.ndarray) -> np.ndarray:
    """Registers for 64-bit hash words."""
    return _group_registers(np.zeros(len(words), dtype=np.int64), words, 1)[0]


def encode_many(groups: np.ndarray, words: np.ndarray, count: int) -> list[bytes]:
    """Packed sketches of `count` groups at once (a file's sections): `groups[i]` is the group of `words[i]`. One
    compiled pass over the words however many groups, packed as `encode_rows` packs; b"" for a group without words."""
    if not len(words):
        return [b""] * count
    if len(groups) != len(words) or groups.min() < 0 or groups.max() >= count:
        raise ValueError(f"sketch groups must be one a word, from 0 to {count - 1}")  # the loop writes where they say
    return encode_rows(_group_registers(groups, words, count))


def compile_sketcher() -> None:
    """Compile (or load from numba's cache) the loops now, not in the first flush: for hash words as a writer takes
    them, a column of the hashes' read-only buffer, and as a copy (a file with keyless records)."""
    hashes = np.frombuffer(np.arange(8, dtype=np.uint64).tobytes(), dtype=np.uint64).reshape(-1, 2)
    for words in (hashes[:, 1], hashes[:, 1].copy()):
        encode_many(np.zeros(len(words), dtype=np.int64), words, 1)
        sketch_words(words)


@numba.njit(cache=True, nogil=True)
def _group_registers(groups, words, count):
    """Each group's registers: `register_ranks` of each word, the highest rank kept per register. The rank is taken by
    `frexp` of the word as a float, as `register_ranks` takes it, so both give the same registers bit for bit."""
    registers = np.zeros((count, REGISTERS), dtype=np.uint8)
    for i in range(words.shape[0]):
        word = np.uint64(words[i])
        index = np.intp(word >> np.uint64(64 - PRECISION))
        rest = (word << np.uint64(PRECISION)) | np.uint64(1 << (PRECISION - 1))
        rank = max(65 - math.frexp(float(rest))[1], 1)
        group = groups[i]
        if rank > registers[group, index]:
            registers[group, index] = rank
    return registers


def estimated_duplicates(records: int, packed: Collection[bytes]) -> int:
    """Of `records` held by sections with these packed sketches, how many a deduplication would remove: the
    records beyond the distinct keys of the merged sketches (0 when no section has keys)."""
    packed = [p for p in packed if p]
    if not packed:
        return 0
    return max(0, records - round(estimate(merge_packed(packed))))


def merge_packed(packed: Collection[bytes]) -> np.ndarray:
    """The registers of many packed sketches merged, in two vectorized steps however many there are: the full
    ones by a maximum over their rows, the (register, rank) pairs by a maximum at their registers."""
    registers = np.zeros(REGISTERS, dtype=np.uint8)
    full = b"".join(p for p in packed if len(p) == REGISTERS)
    if full:
        registers[:] = np.frombuffer(full, dtype=np.uint8).reshape(-1, REGISTERS).max(axis=0)
    pairs = b"".join(p for p in packed if len(p) != REGISTERS)
    if pairs:
        pair = np.frombuffer(pairs, dtype=np.uint8).reshape(-1, 2)
        np.maximum.at(registers, pair[:, 0], pair[:, 1])
    return registers


def merge_by_group(groups: np.ndarray, packed: Sequence[bytes], count: int) -> list[bytes]:
    """Packed sketches of `count` groups, each the merge of the `packed[i]` whose `groups[i]` it is (b"" for a
    group without keys): a commit's thousand partitions' sketches in the same two vectorized steps as
    `merge_packed`, not a merge per partition."""
    return [encode(row) for row in registers_by_group(groups, packed, count)]


def registers_by_group(groups: np.ndarray, packed: Sequence[bytes], count: int) -> np.ndarray:
    """`merge_by_group`'s registers, a row per group (all zero for a group without keys)."""
    registers = np.zeros((count, REGISTERS), dtype=np.uint8)
    lengths = np.fromiter(map(len, packed), dtype=np.int64, count=len(packed))
    full = lengths == REGISTERS
    if full.any():
        rows = np.frombuffer(b"".join(p for p, whole in zip(packed, full.tolist()) if whole), dtype=np.uint8).reshape(-1, REGISTERS)
        np.maximum.at(registers, groups[full], rows)
    paired = ~full & (lengths > 0)
    if paired.any():
        pairs = np.frombuffer(b"".join(p for p, pair in zip(packed, paired.tolist()) if pair), dtype=np.uint8).reshape(-1, 2)
        owners = np.repeat(groups[paired].astype(np.int64), lengths[paired] // 2)
        np.maximum.at(registers.reshape(-1), owners * REGISTERS + pairs[:, 0], pairs[:, 1])
    return registers


def estimate(registers: np.ndarray) -> float:
    """Distinct keys estimated from registers (HyperLogLog with the small-range correction)."""
    raw = _ALPHA * REGISTERS**2 / float(np.sum(np.power(2.0, -registers.astype(np.float64))))
    zeros = int(np.count_nonzero(registers == 0))
    if raw <= 2.5 * REGISTERS and zeros:
        return REGISTERS * float(np.log(REGISTERS / zeros))
    return raw


def estimate_rows(registers: np.ndarray) -> np.ndarray:
    """`estimate` of each row of a (sketches, REGISTERS) array, in one vectorized step: the same floats, bit for bit."""
    raw = _ALPHA * REGISTERS**2 / np.sum(np.power(2.0, -registers.astype(np.float64)), axis=1)
    zeros = np.count_nonzero(registers == 0, axis=1)
    small = (raw <= 2.5 * REGISTERS) & (zeros > 0)
    raw[small] = REGISTERS * np.log(REGISTERS / zeros[small])
    return raw


def encode(registers: np.ndarray) -> bytes:
    """The packed form: (register, rank) pairs when shorter, else the registers; b"" when none is set."""
    used = np.flatnonzero(registers)
    if not len(used):
        return b""
    if 2 * len(used) < REGISTERS:
        pairs = np.empty((len(used), 2), dtype=np.uint8)
        pairs[:, 0], pairs[:, 1] = used, registers[used]
        return pairs.tobytes()
    return registers.astype(np.uint8).tobytes()


def decode(packed: bytes) -> np.ndarray:
    registers = np.zeros(REGISTERS, dtype=np.uint8)
    if len(packed) == REGISTERS:
        registers[:] = np.frombuffer(packed, dtype=np.uint8)
    elif packed:
        pairs = np.frombuffer(packed, dtype=np.uint8).reshape(-1, 2)
        registers[pairs[:, 0]] = pairs[:, 1]
    return registers


def encode_rows(registers: np.ndarray) -> list[bytes]:
    """`encode` of each row of a (sketches, REGISTERS) array of uint8, in vectorized steps but the final slicing."""
    packed = [b""] * len(registers)
    cells = np.flatnonzero(registers != 0)  # row by row, registers in order, as `encode` lists them (of booleans: 4x faster)
    used = np.bincount(cells >> PRECISION, minlength=len(registers))
    full = 2 * used >= REGISTERS
    if full.any():
        cells = cells[~full[cells >> PRECISION]]
    if len(cells):
        pairs = np.empty((len(cells), 2), dtype=np.uint8)
        pairs[:, 0], pairs[:, 1] = cells & (REGISTERS - 1), registers.reshape(-1)[cells]
        blob = pairs.tobytes()
        paired = np.flatnonzero(~full & (used > 0))
        ends = 2 * np.cumsum(used[paired])
        pieces = map(blob.__getitem__, map(slice, (ends - 2 * used[paired]).tolist(), ends.tolist()))
        if len(paired) == len(registers):  # every sketch short (a file's sections of a few records each)
            return list(pieces)
        for row, piece in zip(paired.tolist(), pieces):
            packed[row] = piece
    rows = np.flatnonzero(full)
    if len(rows):
        blob = np.ascontiguousarray(registers[rows], dtype=np.uint8).tobytes()
        for number, row in enumerate(rows.tolist()):
            packed[row] = blob[number * REGISTERS : (number + 1) * REGISTERS]
    return packed


def decode_rows(packed: Sequence[bytes]) -> np.ndarray:
    """`decode` of many packed sketches: a (sketches, REGISTERS) array of uint8."""
    registers = np.zeros((len(packed), REGISTERS), dtype=np.uint8)
    if len(packed):
        registers[:] = registers_by_group(np.arange(len(packed)), packed, len(packed))
    return registers
