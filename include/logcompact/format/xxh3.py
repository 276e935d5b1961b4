"""XXH3-128 (seed 0, the default secret) of every value of an Arrow binary array in one compiled loop: the files' key
hashes (`format.key_hashes`) without a Python call per key. Equal to `xxhash.xxh3_128_digest` (the canonical,
big-endian form) for keys of up to 240 bytes, the short and mid-size paths of the algorithm; longer keys, rare, are
hashed by the xxhash package.
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa
import xxhash

# The default secret's first 136 bytes (XXH3_SECRET_SIZE_MIN): all that keys of up to 240 bytes read.
_SECRET = np.frombuffer(bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3"
), dtype=np.uint8)
_MAX_SHORT_KEY = 240  # XXH3_MIDSIZE_MAX: longer keys take the long (striped) path
_U = np.uint64
_M32 = _U(0xFFFFFFFF)
_P32_2 = _U(0x85EBCA77)
_P64_1, _P64_2, _P64_3, _P64_4 = _U(0x9E3779B185EBCA87), _U(0xC2B2AE3D27D4EB4F), _U(0x165667B19E3779F9), _U(0x85EBCA77C2B2AE63)
_MIX, _MX2 = _U(0x165667919E3779F9), _U(0x9FB21C651E98DF25)


def key_hash_array(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The 16-byte XXH3-128 digest of each key (null for a null key), as pa.binary(16)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    count = len(keys)
    _, offsets, data = keys.buffers()
    bounds = np.zeros(count + 1, dtype=np.int64) if offsets is None else np.frombuffer(offsets, dtype=np.int32)[keys.offset : keys.offset + count + 1].astype(np.int64)
    values = np.zeros(0, dtype=np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
    digests = _digests(values, bounds)
    lengths = bounds[1:] - bounds[:-1]
    for row in np.flatnonzero(lengths > _MAX_SHORT_KEY).tolist():
        digests[row] = np.frombuffer(xxhash.xxh3_128_digest(values[bounds[row] : bounds[row + 1]].tobytes()), dtype=np.uint8)
    validity = keys.buffers()[0] if keys.null_count else None
    if validity is not None and keys.offset:  # a sliced array's bitmap starts mid-byte: made again from its mask
        validity = pa.py_buffer(np.packbits(np.asarray(keys.is_valid()), bitorder="little"))
    return pa.Array.from_buffers(pa.binary(16), count, [validity, pa.py_buffer(digests)], null_count=keys.null_count)


def compile_hasher() -> None:
    """Compile (or load from numba's cache) the loop now, not in the first flush."""
    key_hash_array(pa.array([b"k" * length for length in (0, 2, 5, 12, 40, 200)]))


@numba.njit(cache=True, nogil=True, inline="always")
def _read_little_endian(data, at, width):
    value = _U(0)
    for index in range(width):
        value |= _U(data[at + index]) << _U(8 * index)
    return value


@numba.njit(cache=True, nogil=True, inline="always")
def _read64(data, at):
    return _read_little_endian(data, at, 8)


@numba.njit(cache=True, nogil=True, inline="always")
def _read32(data, at):
    return _read_little_endian(data, at, 4)


@numba.njit(cache=True, nogil=True, inline="always")
def _multiply(a, b):
    """The 128-bit product of two 64-bit numbers: (low, high)."""
    a_low, a_high, b_low, b_high = a & _M32, a >> _U(32), b & _M32, b >> _U(32)
    low_low, high_low, low_high = a_low * b_low, a_high * b_low, a_low * b_high
    cross = (low_low >> _U(32)) + (high_low & _M32) + low_high
    return (cross << _U(32)) | (low_low & _M32), (high_low >> _U(32)) + (cross >> _U(32)) + a_high * b_high


@numba.njit(cache=True, nogil=True, inline="always")
def _fold(a, b):
    low, high = _multiply(a, b)
    return low ^ high


@numba.njit(cache=True, nogil=True, inline="always")
def _avalanche(h):
    h ^= h >> _U(37)
    h *= _MIX
    return h ^ (h >> _U(32))


@numba.njit(cache=True, nogil=True, inline="always")
def _avalanche64(h):
    h ^= h >> _U(33)
    h *= _P64_2
    h ^= h >> _U(29)
    h *= _P64_3
    return h ^ (h >> _U(32))


@numba.njit(cache=True, nogil=True, inline="always")
def _swap64(v):
    out = _U(0)
    for index in range(8):
        out = (out << _U(8)) | ((v >> _U(8 * index)) & _U(0xFF))
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _mix16(data, at, secret_at):
    return _fold(_read64(data, at) ^ _read64(_SECRET, secret_at), _read64(data, at + 8) ^ _read64(_SECRET, secret_at + 8))


@numba.njit(cache=True, nogil=True, inline="always")
def _mix32(low, high, data, first, second, secret_at):
    low += _mix16(data, first, secret_at)
    low ^= _read64(data, second) + _read64(data, second + 8)
    high += _mix16(data, second, secret_at + 16)
    high ^= _read64(data, first) + _read64(data, first + 8)
    return low, high


@numba.njit(cache=True, nogil=True, inline="always")
def _finish(low, high, length):
    out_low = _avalanche(low + high)
    out_high = _U(0) - _avalanche(low * _P64_1 + high * _P64_4 + _U(length) * _P64_2)
    return out_low, out_high


@numba.njit(cache=True, nogil=True)
def _hash(data, at, length):
    """XXH3-128 of data[at:at + length] (length <= 240), seed 0: (low, high)."""
    if length == 0:
        return _avalanche64(_read64(_SECRET, 64) ^ _read64(_SECRET, 72)), _avalanche64(_read64(_SECRET, 80) ^ _read64(_SECRET, 88))
    if length <= 3:
        c1, c2, c3 = _U(data[at]), _U(data[at + (length >> 1)]), _U(data[at + length - 1])
        combined_low = (c1 << _U(16)) | (c2 << _U(24)) | c3 | (_U(length) << _U(8))
        swapped = ((combined_low & _U(0xFF)) << _U(24)) | ((combined_low & _U(0xFF00)) << _U(8)) | ((combined_low >> _U(8)) & _U(0xFF00)) | (combined_low >> _U(24))
        combined_high = ((swapped << _U(13)) | (swapped >> _U(19))) & _M32
        low = combined_low ^ (_read32(_SECRET, 0) ^ _read32(_SECRET, 4))
        high = combined_high ^ (_read32(_SECRET, 8) ^ _read32(_SECRET, 12))
        return _avalanche64(low), _avalanche64(high)
    if length <= 8:
        word = _read32(data, at) + (_read32(data, at + length - 4) << _U(32))
        keyed = word ^ (_read64(_SECRET, 16) ^ _read64(_SECRET, 24))
        low, high = _multiply(keyed, _P64_1 + (_U(length) << _U(2)))
        high += low << _U(1)
        low ^= high >> _U(3)
        low ^= low >> _U(35)
        low *= _MX2
        low ^= low >> _U(28)
        return low, _avalanche(high)
    if length <= 16:
        flip_low = _read64(_SECRET, 32) ^ _read64(_SECRET, 40)
        flip_high = _read64(_SECRET, 48) ^ _read64(_SECRET, 56)
        first, last = _read64(data, at), _read64(data, at + length - 8)
        low, high = _multiply(first ^ last ^ flip_low, _P64_1)
        low += _U(length - 1) << _U(54)
        last ^= flip_high
        high += last + (last & _M32) * (_P32_2 - _U(1))
        low ^= _swap64(high)
        out_low, out_high = _multiply(low, _P64_2)
        out_high += high * _P64_2
        return _avalanche(out_low), _avalanche(out_high)
    low, high = _U(length) * _P64_1, _U(0)
    if length <= 128:
        if length > 32:
            if length > 64:
                if length > 96:
                    low, high = _mix32(low, high, data, at + 48, at + length - 64, 96)
                low, high = _mix32(low, high, data, at + 32, at + length - 48, 64)
            low, high = _mix32(low, high, data, at + 16, at + length - 32, 32)
        low, high = _mix32(low, high, data, at, at + length - 16, 0)
        return _finish(low, high, length)
    for round_ in range(4):
        low, high = _mix32(low, high, data, at + 32 * round_, at + 32 * round_ + 16, 32 * round_)
    low, high = _avalanche(low), _avalanche(high)
    for round_ in range(4, length // 32):
        low, high = _mix32(low, high, data, at + 32 * round_, at + 32 * round_ + 16, 3 + 32 * (round_ - 4))
    low, high = _mix32(low, high, data, at + length - 16, at + length - 32, 136 - 17 - 16)
    return _finish(low, high, length)


@numba.njit(cache=True, nogil=True)
def _digests(values, bounds):
    """Each value's digest, canonical (high then low, big-endian); left zero for values over 240 bytes."""
    count = len(bounds) - 1
    out = np.zeros((count, 16), dtype=np.uint8)
    for row in range(count):
        length = bounds[row + 1] - bounds[row]
        if length > _MAX_SHORT_KEY:
            continue
        low, high = _hash(values, bounds[row], length)
        for index in range(8):
            out[row, index] = np.uint8((high >> _U(56 - 8 * index)) & _U(0xFF))
            out[row, 8 + index] = np.uint8((low >> _U(56 - 8 * index)) & _U(0xFF))
    return out
