"""The sections of a plan's input files as Arrow columns, every field of them: what a plan's documents are encoded
from (all but the key sketches), its hidden offsets found in and its effect estimated from, read in one query without
building a section object (`Snapshot.input_sections`), or taken from files in hand (`from_files`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import get_type_hints

import numpy as np
import pyarrow as pa

from logcompact.catalog import schema as s
from logcompact.catalog.model import CatalogSection, DataFile
from logcompact.exceptions import CorruptDataError
from logcompact.format.layout import COMPRESSIONS, SectionInfo

_ARROW_TYPES = {str: pa.string(), int: pa.int64(), bytes: pa.binary()}
_INFO_TYPES = get_type_hints(SectionInfo)
_PLACED_STRUCT = pa.struct(
    [
        pa.field("info", pa.struct([pa.field(name, _ARROW_TYPES[kind]) for name, kind in _INFO_TYPES.items()])),
        pa.field("first_offset", pa.int64()),
    ]
)
# The sections columns read, in `schema.SECTION_ROW` order from file_id to key_sketch: integers but the last.
READ_COLUMNS = s.SECTION_ROW[: s.SECTION_ROW.index("key_sketch") + 1]
_INTEGERS = len(READ_COLUMNS) - 1


@dataclass(frozen=True, eq=False)
class InputSections:
    """Input files, an entry each (`keys`, `levels`), and their sections as `table`, a row each in file order and,
    within a file, in the order the catalog loads them (byte offset, first row): `file`, the entry of the section's
    file (int32), its `first_offset`, then the fields of its SectionInfo (strings plain, not dictionaries)."""

    keys: list[str]
    levels: np.ndarray
    table: pa.Table

    def __len__(self) -> int:
        return self.table.num_rows

    def integers(self, name: str) -> np.ndarray:
        """An integer column as a numpy array."""
        return self.table.column(name).to_numpy()

    def records_by_file(self) -> dict[str, int]:
        """Per file, the records of its sections here."""
        counts = np.bincount(self.integers("file"), self.integers("record_count"), minlength=len(self.keys))
        return dict(zip(self.keys, counts.astype(np.int64).tolist()))

    @classmethod
    def from_rows(cls, keys: Sequence[str], file_rows: Sequence[tuple[int, str, int]], section_rows: Sequence[Sequence], names: dict[int, str]) -> InputSections:
        """From the files rows (file_id, key, level) of the live files among `keys` and the sections rows (`READ_COLUMNS`)
        of their sections, fetched in (file_id, byte offset, first row) order: the files in the order of `keys`, each
        section's CRC unbound from its row (`schema.section_crc_binding`), the integers converted at once."""
        place = {key: n for n, key in enumerate(keys)}
        found = sorted(file_rows, key=lambda row: place[row[1]])
        entry = {file_id: n for n, (file_id, _, _) in enumerate(found)}
        count, width = len(section_rows), _INTEGERS
        try:
            values = np.fromiter(chain.from_iterable(row[:width] for row in section_rows), np.int64, count * width).reshape(count, width)
        except (TypeError, ValueError, OverflowError):
            raise _first_unreadable(section_rows) from None
        files = np.fromiter((entry[file_id] for file_id in values[:, 0].tolist()), np.int64, count)
        order = np.argsort(files, kind="stable")  # the rows of each file in the order they were fetched
        values, files = values[order], files[order]
        column = {name: values[:, n] for n, name in enumerate(READ_COLUMNS[:width])}
        sketches = pa.array([bytes(row[width] or b"") for row in section_rows], pa.binary()).take(pa.array(order))
        crcs = np.asarray(s.section_crc_bindings(*(column[name] for name in READ_COLUMNS[1:9])), np.int64) ^ column["crc32"]
        topic_names = sorted(set(names.values()))
        rank = np.full(max(names, default=0) + 1, -1, np.int64)
        for topic_id, name in names.items():
            rank[topic_id] = topic_names.index(name)
        fields = {
            "topic": pa.array(topic_names, pa.string()).take(pa.array(rank[column["topic_id"]])),
            "partition": column["partition"], "record_count": column["record_count"],
            "last_delta": column["last_offset"] - column["first_offset"],
            "min_timestamp": column["min_timestamp"], "max_timestamp": column["max_timestamp"], "tombstones": column["tombstones"],
            "uncompressed_bytes": column["uncompressed_bytes"],
            "compression": pa.array(list(COMPRESSIONS), pa.string()).take(pa.array(column["compression"])),
            "crc32": crcs, "byte_offset": column["byte_offset"], "byte_length": column["byte_length"],
            "clean_below_delta": column["clean_below_delta"], "key_sketch": sketches, "first_row": column["first_row"],
        }
        table = pa.table(
            {"file": pa.array(files.astype(np.int32)), "first_offset": pa.array(column["first_offset"]), **{name: fields[name] for name in SectionInfo._fields}}
        )
        return cls([row[1] for row in found], np.array([row[2] for row in found], np.int64), table)

    @classmethod
    def from_files(cls, files: Sequence[DataFile]) -> InputSections:
        """The sections of files in hand, converted to Arrow at once."""
        counts = [len(f.sections) for f in files]
        placed: list[CatalogSection] = [section for f in files for section in f.sections]
        info, first_offsets = pa.array(placed, _PLACED_STRUCT).flatten()
        fields = dict(zip(_INFO_TYPES, info.flatten()))
        table = pa.table(
            {"file": pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts)), "first_offset": first_offsets, **fields}
        )
        return cls([f.key for f in files], np.array([f.level for f in files], np.int64), table)


def _first_unreadable(rows: Sequence[Sequence]) -> CorruptDataError:
    """The first sections row whose integer fields (all but the key sketch) are not all 64-bit integers (SQLite keeps
    whatever a column is set to), named."""
    for row in rows:
        if not all(isinstance(value, int) and -(1 << 63) <= value < (1 << 63) for value in row[:_INTEGERS]):
            return CorruptDataError(
                f"catalog row of section topic_id {row[1]!r}, partition {row[2]!r} of file_id {row[0]!r} is damaged: its fields "
                f"{tuple(row)!r:.200} are not all 64-bit integers; restore the catalog database from a backup"
            )
    return CorruptDataError("catalog sections rows are damaged: not all 64-bit integers; restore the catalog database from a backup")
