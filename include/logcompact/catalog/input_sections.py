"""The sections of a plan's input files as Arrow columns, every field of them: what a plan's documents are encoded
from (all but the key sketches), its hidden offsets found in and its effect estimated from, read in one query without
building a section object (`Snapshot.input_sections`), or taken from files in hand (`from_files`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    def from_columns(
        cls, keys: Sequence[str], file_rows: Sequence[tuple[int, str, int]], column: dict[str, np.ndarray], sketch_lengths: np.ndarray,
        sketches: bytes, names: dict[int, str],
    ) -> InputSections:
        """From the files rows (file_id, key, level) of the live files among `keys` and the integer columns
        (`READ_COLUMNS` but the key sketch) of sections of those files and maybe others, in any order, with their key
        sketches one after the other (`sketch_lengths` bytes each): the files in the order of `keys`, each file's
        sections in the catalog's order (byte offset, first row), each section's CRC unbound from its row
        (`schema.section_crc_bindings`)."""
        place = {key: n for n, key in enumerate(keys)}
        found = sorted(file_rows, key=lambda row: place[row[1]])
        if int(sketch_lengths.sum()) != len(sketches):
            raise CorruptDataError(
                f"catalog rows of sections hold key sketches of {int(sketch_lengths.sum()):,} bytes but {len(sketches):,} were read; "
                "restore the catalog database from a backup"
            )
        ids = np.array([row[0] for row in found], np.int64)
        by_id = np.argsort(ids)
        taken = np.flatnonzero(np.isin(column["file_id"], ids))  # sections of other files (every live file read) dropped
        entries = by_id[np.searchsorted(ids[by_id], column["file_id"][taken])]
        order = taken[np.lexsort((column["first_row"][taken], column["byte_offset"][taken], entries))]
        files = np.sort(entries)  # the entries in `order`'s order: it sorts by them first
        column = {name: values[order] for name, values in column.items()}
        offsets = np.concatenate(([0], np.cumsum(sketch_lengths, dtype=np.int64)))
        read_sketches = pa.Array.from_buffers(pa.large_binary(), len(sketch_lengths), [None, pa.py_buffer(offsets), pa.py_buffer(sketches)])
        sketches_taken = read_sketches.take(pa.array(order)).cast(pa.binary())
        crcs = s.section_crc_bindings(*(column[name] for name in READ_COLUMNS[1:9])) ^ column["crc32"]
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
            "clean_below_delta": column["clean_below_delta"], "key_sketch": sketches_taken, "first_row": column["first_row"],
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
