"""Synthetic compacted-topic logs written straight to segment files (fast enough for millions of records)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import xxhash

from logcompact.catalog import CatalogSection, DataFile
from logcompact.format import write_segment
from logcompact.format.layout import HEADERS_TYPE, SECTION_SCHEMA
from logcompact.store import ObjectStore

NOW = 1_700_000_000_000


def write_compacted_log(
    store: ObjectStore,
    topic: str,
    distinct_keys: int,
    per_key: int,
    value_bytes: int,
    partitions: int,
    files: int,
    level: int = 1,
    seed: int = 7,
) -> tuple[list[DataFile], int]:
    """`distinct_keys * per_key` records in random key order over `files` files; a key stays in one
    partition, as Kafka partitions by key. Returns the files (offsets placed) and the key and value bytes."""
    rng = np.random.default_rng(seed)
    key_bytes = [b"%036d" % k for k in range(distinct_keys)]
    keys = pa.array(key_bytes, pa.binary())
    hashes = pa.array([xxhash.xxh3_128_digest(k) for k in key_bytes], pa.binary(16))
    pool = pa.array([os.urandom(value_bytes) for _ in range(4096)], pa.binary())
    order = rng.permutation(np.repeat(np.arange(distinct_keys, dtype=np.int64), per_key))
    next_offset = np.zeros(partitions, dtype=np.int64)
    written, payload = [], 0
    for number, chunk in enumerate(np.array_split(order, files)):
        sections, placed = [], []
        for partition in range(partitions):
            ids = chunk[chunk % partitions == partition]
            n = len(ids)
            if not n:
                continue
            index = pa.array(ids)
            table = pa.Table.from_arrays(
                [
                    pa.array(np.arange(n, dtype=np.uint32)),
                    pa.array(NOW + next_offset[partition] + np.arange(n), pa.int64()),
                    keys.take(index),
                    hashes.take(index),
                    pool.take(pa.array(rng.integers(0, len(pool), n))),
                    pa.nulls(n, HEADERS_TYPE),
                    pa.nulls(n, pa.int64()),
                ],
                schema=SECTION_SCHEMA,
            )
            sections.append((topic, partition, table))
            placed.append(int(next_offset[partition]))
            next_offset[partition] += n
            payload += n * (36 + value_bytes)
        blob, infos = write_segment(sections, "lz4")
        key = f"data/l{level}/synthetic-{topic}-{number:03d}.seg"
        store.put(key, blob)
        sections_placed = tuple(CatalogSection(info, first) for info, first in zip(infos, placed))
        written.append(DataFile(key, level, len(blob), NOW, sections_placed))
    return written, payload
