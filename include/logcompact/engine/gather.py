"""A partition's surviving records gathered into output blocks by one compiled copy (numba).

Pass 2 of a compaction keeps a tenth of a typical input block. Filtering each input batch with Arrow, joining the
pieces into a block's worth and joining them again in the writer's block copied every survivor three times and cost
some ten Arrow calls an input block. Here the survivors of each input batch are copied once, row by row, straight
into the buffers of the output block being filled, up to the room the writer's block has left (`SectionBuilder.room`),
so a gathered block joins the writer's block whole, neither cut nor copied again. The same loop sizes each row as
`layout.row_sizes` does and checks that the survivors' offsets increase.

Headers (a list of structs per record) are rare: a batch holding any is filtered by Arrow for that column alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
import pyarrow as pa

from logcompact.format.layout import FIXED_ROW_BYTES, HEADERS_TYPE, SECTION_SCHEMA, header_row_bytes, key_hash_words
from logcompact.format.memcopy import copy_bytes

# `gather_rows`' answers: the rows are all gathered, the block is full, or the survivor at the row returned does not come
# after the last one gathered.
DONE, FULL, OUT_OF_ORDER = 0, 1, 2
# `gather_rows`' state, an int64 array: rows gathered, their key bytes, value bytes and size (`row_sizes`), the last
# offset gathered, the room (rows, bytes) the block has, and whether the first row is taken whatever its size.
_ROWS, _KEY_BYTES, _VALUE_BYTES, _SIZE, _LAST, _ROOM_ROWS, _ROOM_BYTES, _TAKE_ONE = range(8)


def validity(column: pa.Array, every: np.ndarray) -> np.ndarray:
    """Which rows of the column are not null, as booleans: `every` (all true, as long as the column) when none is."""
    nulls = column.null_count
    if nulls == 0:
        return every
    if nulls == len(column):
        return np.zeros(len(column), dtype=np.bool_)
    return np.asarray(column.is_valid())


def binary_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary column's value offsets (one more than its rows, from its slice) and its data, without copying."""
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32)[column.offset : column.offset + len(column) + 1] if len(column) else np.zeros(1, np.int32)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None and buffers[2].size else np.zeros(0, np.uint8)
    return offsets, data


def int64_values(column: pa.Array) -> np.ndarray:
    """An int64 column's values without copying; null rows hold whatever their slots hold."""
    if column.null_count == len(column):
        return np.zeros(len(column), dtype=np.int64)
    return np.frombuffer(column.buffers()[1], dtype=np.int64)[column.offset : column.offset + len(column)]


class BatchColumns(NamedTuple):
    """A batch's columns as numpy views (no copy), what the gather reads; `headers` is None when every row's are null."""

    offsets: np.ndarray
    timestamps: np.ndarray
    keyed: np.ndarray
    key_offsets: np.ndarray
    key_data: np.ndarray
    hashed: np.ndarray
    hashes: np.ndarray
    valued: np.ndarray
    value_offsets: np.ndarray
    value_data: np.ndarray
    horizons: np.ndarray
    stamped: np.ndarray
    headers: pa.Array | None
    header_bytes: np.ndarray

    @classmethod
    def of(cls, batch: pa.RecordBatch, offsets: np.ndarray) -> BatchColumns:
        """The columns of `batch` (SECTION_SCHEMA's) and its rows' `offsets`, each Array taken once by its place: every
        Arrow call here is a microsecond or more (`batch.columns` ten, `to_numpy` two to three), and pass 2 does this for
        every block it reads."""
        timestamps, key, key_hash, value, headers, horizon = (batch.column(place) for place in _PLACES)
        every = np.ones(batch.num_rows, dtype=np.bool_)  # shared by the columns without nulls: only read
        key_offsets, key_data = binary_parts(key)
        value_offsets, value_data = binary_parts(value)
        with_headers = headers.null_count < len(headers)
        return cls(
            offsets,
            int64_values(timestamps),
            validity(key, every),
            key_offsets,
            key_data,
            validity(key_hash, every),
            key_hash_words(key_hash),
            validity(value, every),
            value_offsets,
            value_data,
            int64_values(horizon),
            validity(horizon, every),
            headers if with_headers else None,
            header_row_bytes(headers) if with_headers else _NO_HEADER_BYTES,
        )


# The places of the columns `BatchColumns.of` reads in a batch of SECTION_SCHEMA's columns.
_PLACES = tuple(SECTION_SCHEMA.get_field_index(name) for name in ("timestamp", "key", "key_hash", "value", "headers", "delete_horizon"))
_NO_HEADER_BYTES = np.zeros(0, dtype=np.int64)


class GatheredBlock(NamedTuple):
    offsets: np.ndarray
    columns: list[pa.Array]  # SECTION_SCHEMA's columns after offset_delta
    size: int  # the rows' bytes as `row_sizes` sums them


class BlockGatherer:
    """The output block being filled with survivors: row buffers kept for the job, data buffers new for each block
    (they become the block's Arrow buffers without a copy)."""

    def __init__(self, capacity_rows: int) -> None:
        self._capacity = capacity_rows
        self._allocated = False
        self.state = np.zeros(8, dtype=np.int64)
        self.state[_LAST] = -1
        self._header_pieces: list[pa.Array | int] = []

    def _allocate(self) -> None:
        n = self._capacity
        self._offsets = np.empty(n, np.int64)
        self._timestamps = np.empty(n, np.int64)
        self._keyed = np.empty(n, np.bool_)
        self._key_offsets = np.zeros(n + 1, np.int32)
        self._hashed = np.empty(n, np.bool_)
        self._hashes = np.empty((n, 2), np.uint64)
        self._valued = np.empty(n, np.bool_)
        self._value_offsets = np.zeros(n + 1, np.int32)
        self._horizons = np.empty(n, np.int64)
        self._stamped = np.empty(n, np.bool_)
        self._allocated = True

    @property
    def rows(self) -> int:
        return int(self.state[_ROWS])

    def begin(self, last_offset: int) -> None:
        """A new output section: the survivors gathered must come after `last_offset` (-1: any)."""
        self.reset()
        self.state[_LAST] = last_offset

    def reset(self) -> None:
        """Drop what is gathered (a partition taken back)."""
        self.state[_ROWS] = self.state[_KEY_BYTES] = self.state[_VALUE_BYTES] = self.state[_SIZE] = 0
        self._header_pieces = []

    def gather(self, rows: BatchColumns, keep: np.ndarray, start: int, end: int, room_rows: int, room_bytes: int,
               take_one: bool) -> tuple[int, int]:
        """Copy the kept rows of `start` to `end` into the block, as long as they fit the room the writer's block has
        (`room_rows`, `room_bytes`; `take_one`: the first row whatever its size). Returns the row where it stopped and
        why (DONE, FULL, OUT_OF_ORDER)."""
        if not self._allocated:
            self._allocate()
        state = self.state
        if state[_ROWS] == 0:
            self._key_data = np.empty(max(room_bytes, 1), np.uint8)
            self._value_data = np.empty(max(room_bytes, 1), np.uint8)
        state[_ROOM_ROWS] = min(room_rows, self._capacity)
        state[_ROOM_BYTES] = room_bytes
        state[_TAKE_ONE] = take_one
        before, first = int(state[_ROWS]), start
        while True:
            stopped, status = gather_rows(
                start, end, keep, rows.offsets, rows.timestamps, rows.keyed, rows.key_offsets, rows.key_data, rows.hashed,
                rows.hashes, rows.valued, rows.value_offsets, rows.value_data, rows.horizons, rows.stamped, rows.header_bytes,
                self._offsets, self._timestamps, self._keyed, self._key_offsets, self._key_data, self._hashed, self._hashes,
                self._valued, self._value_offsets, self._value_data, self._horizons, self._stamped, state,
            )
            if status != _GROW:
                break
            # One row larger than the room (taken alone): its data buffers grow to hold it.
            self._key_data = _grown(self._key_data, int(state[_KEY_BYTES]) + int(rows.key_offsets[stopped + 1] - rows.key_offsets[stopped]))
            self._value_data = _grown(self._value_data, int(state[_VALUE_BYTES]) + int(rows.value_offsets[stopped + 1] - rows.value_offsets[stopped]))
            start = stopped
        taken = int(state[_ROWS]) - before
        if taken:
            if rows.headers is None:
                self._header_pieces.append(taken)
            else:
                piece = rows.headers.slice(first, stopped - first).filter(pa.array(keep[first:stopped]))
                self._header_pieces.append(piece)
        return stopped, status

    def take(self) -> GatheredBlock:
        """The rows gathered, as Arrow columns over the buffers they were copied into; the gatherer starts a new block."""
        n = int(self.state[_ROWS])
        state = self.state
        columns = [
            pa.array(self._timestamps[:n].copy(), pa.int64()),
            _binary(self._keyed, self._key_offsets, self._key_data, n, int(state[_KEY_BYTES])),
            pa.Array.from_buffers(pa.binary(16), n, [_bitmap(self._hashed, n), pa.py_buffer(self._hashes[:n].copy())]),
            _binary(self._valued, self._value_offsets, self._value_data, n, int(state[_VALUE_BYTES])),
            self._headers(n),
            pa.Array.from_buffers(pa.int64(), n, [_bitmap(self._stamped, n), pa.py_buffer(self._horizons[:n].copy())]),
        ]
        block = GatheredBlock(self._offsets[:n].copy(), columns, int(state[_SIZE]))
        self.reset()
        return block

    def _headers(self, n: int) -> pa.Array:
        pieces = self._header_pieces
        if all(isinstance(piece, int) for piece in pieces):
            return pa.nulls(n, HEADERS_TYPE)
        return pa.concat_arrays([pa.nulls(piece, HEADERS_TYPE) if isinstance(piece, int) else piece for piece in pieces])


def _grown(data: np.ndarray, size: int) -> np.ndarray:
    if size <= len(data):
        return data
    grown = np.empty(max(size, 2 * len(data)), np.uint8)
    grown[: len(data)] = data
    return grown


def _bitmap(valid: np.ndarray, n: int) -> pa.Buffer | None:
    """Arrow's validity bitmap of the first `n` rows; None when none is null."""
    if valid[:n].all():
        return None
    return pa.py_buffer(np.packbits(valid[:n], bitorder="little"))


def _binary(valid: np.ndarray, offsets: np.ndarray, data: np.ndarray, n: int, length: int) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), n, [_bitmap(valid, n), pa.py_buffer(offsets[: n + 1].copy()), pa.py_buffer(data[:length])])


_GROW = 3  # internal: a row does not fit the data buffers (only a row taken alone, larger than the room)


@numba.njit(cache=True, nogil=True)
def gather_rows(
    start, end, keep, offsets, timestamps, keyed, key_offsets, key_data, hashed, hashes, valued, value_offsets, value_data,
    horizons, stamped, header_bytes, out_offsets, out_timestamps, out_keyed, out_key_offsets, out_key_data, out_hashed,
    out_hashes, out_valued, out_value_offsets, out_value_data, out_horizons, out_stamped, state,
):
    """Copy the kept rows from `start` to `end` after the rows gathered (`state`), until one does not fit the room."""
    rows = state[_ROWS]
    key_bytes = state[_KEY_BYTES]
    value_bytes = state[_VALUE_BYTES]
    size = state[_SIZE]
    last = state[_LAST]
    with_headers = header_bytes.shape[0] > 0
    status = DONE
    i = start
    while i < end:
        if not keep[i]:
            i += 1
            continue
        # A null's range is not its bytes (`row_sizes` counts none): nothing of it is copied.
        key_length = key_offsets[i + 1] - key_offsets[i] if keyed[i] else 0
        value_length = value_offsets[i + 1] - value_offsets[i] if valued[i] else 0
        if (key_length < 0 or value_length < 0 or key_offsets[i] + key_length > key_data.shape[0]
                or value_offsets[i] + value_length > value_data.shape[0]):
            raise ValueError("a row's key or value runs past its column's data")  # memcpy would read past it
        row_size = FIXED_ROW_BYTES + key_length + value_length
        if with_headers:
            row_size += header_bytes[i]
        if rows >= state[_ROOM_ROWS] or size + row_size > state[_ROOM_BYTES]:
            if not (rows == 0 and state[_TAKE_ONE]):
                status = FULL
                break
            if key_length > out_key_data.shape[0] or value_length > out_value_data.shape[0]:
                status = _GROW
                break
        if offsets[i] <= last:
            status = OUT_OF_ORDER
            break
        last = offsets[i]
        out_offsets[rows] = last
        out_timestamps[rows] = timestamps[i]
        out_keyed[rows] = keyed[i]
        if key_bytes + key_length > out_key_data.shape[0] or value_bytes + value_length > out_value_data.shape[0]:
            raise ValueError("a row's key or value runs past the block being gathered")  # memcpy would write past it
        if key_length:
            copy_bytes(out_key_data, key_bytes, key_data, key_offsets[i], key_length)
        key_bytes += key_length
        out_key_offsets[rows + 1] = key_bytes
        out_hashed[rows] = hashed[i]
        out_hashes[rows, 0] = hashes[i, 0]
        out_hashes[rows, 1] = hashes[i, 1]
        out_valued[rows] = valued[i]
        if value_length:
            copy_bytes(out_value_data, value_bytes, value_data, value_offsets[i], value_length)
        value_bytes += value_length
        out_value_offsets[rows + 1] = value_bytes
        out_horizons[rows] = horizons[i] if stamped[i] else 0
        out_stamped[rows] = stamped[i]
        rows += 1
        size += row_size
        i += 1
    state[_ROWS] = rows
    state[_KEY_BYTES] = key_bytes
    state[_VALUE_BYTES] = value_bytes
    state[_SIZE] = size
    state[_LAST] = last
    return i, status
