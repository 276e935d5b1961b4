"""Writer processes for the concurrent-commit test: appending agents and copying compactors.

They run in separate processes (spawned), each with its own store client and catalog connections, and all
start at one instant. Each gets the store URI and the catalog URL (None: a local store's embedded SQLite).
"""

from __future__ import annotations

import random
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import Catalog, CatalogSection, DataFile
from logcompact.consume import read_sections
from logcompact.exceptions import CommitConflictError
from logcompact.format import section_table, write_segment
from logcompact.ingest import Agent, Record
from logcompact.store import open_store

TOPIC = "t"
PARTITIONS = 3


def _wait_until(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def append(store_uri: str, catalog_url: str | None, writer: int, commits: int, start_at: float) -> dict[str, tuple[int, int]]:
    """Commit `commits` L0 files of 1 to 3 records; returns each produced value's (partition, offset)."""
    rng = random.Random(writer)
    catalog = Catalog(open_store(store_uri), catalog_url)
    placed: dict[str, tuple[int, int]] = {}
    _wait_until(start_at)
    with Agent(catalog, background=False) as agent:
        for commit in range(commits):
            records = [
                Record(rng.randrange(PARTITIONS), b"k", f"w{writer}-c{commit}-r{n}".encode(), 1)
                for n in range(rng.randint(1, 3))
            ]
            future = agent.produce(TOPIC, records)
            agent.flush()
            for record, offset in zip(records, future.result()):
                placed[record.value.decode()] = (record.partition, offset)
    return placed


def compact(
    store_uri: str, catalog_url: str | None, writer: int, rounds: int, start_at: float, give_up_s: float = 120
) -> dict[str, int]:
    """`rounds` times, replace two live L0 files by one L1 file holding the same records.

    Returns how many of those commits landed and how many met a conflict (another compactor was first).
    """
    rng = random.Random(1000 + writer)
    store = open_store(store_uri)
    catalog = Catalog(store, catalog_url)
    outcome = {"committed": 0, "conflicts": 0}
    _wait_until(start_at)
    give_up_at = time.time() + give_up_s
    while outcome["committed"] + outcome["conflicts"] < rounds and time.time() < give_up_at:
        snapshot = catalog.snapshot()
        l0 = sorted(f.key for f in snapshot.file_summaries(0))
        if len(l0) < 2:
            time.sleep(0.01)
            continue
        inputs = list(snapshot.get_files(rng.sample(l0, 2)).values())
        sections = []
        for partition in range(PARTITIONS):
            mine = sorted(
                ((f.key, s) for f in inputs for s in f.sections if s.partition == partition), key=lambda pair: pair[1].first_offset
            )
            tables = list(read_sections(store, mine))
            if not tables:
                continue
            merged = pa.concat_tables(tables)
            first = merged.column("offset")[0].as_py()
            deltas = pc.subtract(merged.column("offset"), first).cast(pa.uint32())
            columns = [merged.column(name).to_pylist() for name in ("key", "value")]
            sections.append((partition, first, section_table(deltas, merged.column("timestamp"), *columns)))
        blob, infos = write_segment([(TOPIC, p, table) for p, _, table in sections])
        key = f"data/l1/{uuid.uuid4().hex}.seg"
        store.put(key, blob)
        placed = tuple(CatalogSection(info, first) for info, (_, first, _) in zip(infos, sections))
        output = DataFile(key, 1, len(blob), int(time.time() * 1000), placed)
        try:
            catalog.replace_files([f.key for f in inputs], [output], 1, expected_version=snapshot.version)
            outcome["committed"] += 1
        except CommitConflictError:
            store.delete(key)  # never referenced by any manifest version
            outcome["conflicts"] += 1
    return outcome
