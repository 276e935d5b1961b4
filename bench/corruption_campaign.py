"""Corruption campaign: damaged data files and catalog rows under a compaction, then every partition consumed.

    .venv/bin/python bench/corruption_campaign.py                  # every targeted case on an L0 and an L1 file, 40 flips
    .venv/bin/python bench/corruption_campaign.py --flips 200 --seed 7 --partitions 100

The store: one compacted topic (`ledger`, 40 partitions by default) written by the CLI as 2 L1 files (each
the copy of 3 L0 files) and 3 more L0 files, every file holding every partition in a few blocks, keys reused
(8 a partition), 5% tombstones. `compact --until-idle --min-files 3` then runs two plans: the 3 L0 files
copied into an L1 file, and the 3 L1 files deduplicated into L2 (both passes).

Each case damages a fresh copy of that store, then runs `compact --until-idle --min-files 3` as a process and
`logcompact uncleanable list` and `consume` of every partition through the CLI's main() in one process:

* file parts, on an L0 file (read by the copy) and an L1 file (read by both passes of the deduplication),
  one byte flipped: the header, the schema message, the lengths in a block prefix (index, payload), its index
  CRC and its payload CRC, the index message, the payload message (all in the file's middle block), the
  footer, the trailer;
* whole files: truncated to 60%, replaced by another data file of its level (swap), deleted;
* catalog rows (catalog.db, sqlite3), on the section of the file's middle partition: byte_offset + 8,
  byte_length - 8, first_row + 1, record_count - 1 and + 1, first_offset + 1, last_offset + 1, crc32 flipped;
  and the file's size + 1;
* random flips (--flips, seeded): one byte of a random live data file xored with a random value.

Counted per case, and totalled per class of case:
* tracebacks: "Traceback" on any command's stderr (or a command process that died);
* multi-line errors: a failed command whose stderr says more than one line (logged warnings aside);
* corrupt rows: a consumed record that differs from the one produced at its offset (key, value, timestamp), or
  sits where none was produced, or a row of a new output file (committed or not) that does;
* silent losses: consume exited 0 but a key's latest value is missing;
* plan failures: compaction exited non-zero (a whole plan refused);
* set aside: partitions `logcompact uncleanable list` lists (one JSON line each; before that command exists,
  the partitions the compaction's stats list as uncleanable);
* unreadable: partitions whose consume failed with a clear error (damage left where it was);
* uncompacted: partitions that still show a key twice (the others were compacted).
Target (issue 11): 0 tracebacks, 0 corrupt rows, 0 silent losses; the damaged partition set aside, the rest
compacted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from logcompact.exceptions import LogcompactError
from logcompact.format.reader import read_footer, read_section
from logcompact.store import LocalStore
from tests.support.campaign import (
    Cli,
    Done,
    Sent,
    TopicSpec,
    acknowledged_offsets,
    check_partition,
    consumed_records,
    produce_input,
)

MIN_FILES = 3
RECORDS_PER_PARTITION = 30  # per L0 file: a file of 40 partitions is about 3 blocks
KEYS_PER_PARTITION = 8
# Layout constants of docs/format.md, restated so the damage is aimed without the product's own parser.
FILE_HEADER = struct.Struct("<8sHHI")
BLOCK_PREFIX = struct.Struct("<IIII")
TRAILER = struct.Struct("<QIHH8s")


# -- the store -----------------------------------------------------------------------------------------------


@dataclass
class BaseStore:
    directory: Path
    spec: TopicSpec
    produced: dict[int, dict[int, Sent]]  # partition -> offset -> record
    now: int
    l0_keys: list[str]
    l1_keys: list[str]


def build_store(directory: Path, partitions: int, seed: int) -> BaseStore:
    rng = random.Random(seed)
    spec = TopicSpec("ledger", partitions, {"cleanup.policy": "compact"})
    cli = Cli(directory / "store", directory / "tmp")
    now = time.time_ns() // 1_000_000
    _must(cli.run(*spec.create_args(), now=now))
    produced: dict[int, dict[int, Sent]] = {p: {} for p in range(partitions)}
    sequence = 0

    def produce() -> None:
        nonlocal sequence
        records = []
        for partition in range(partitions):
            for _ in range(RECORDS_PER_PARTITION):
                sequence += 1
                value = None if rng.random() < 0.05 else f"v{sequence}-" + "x" * rng.randint(20, 200)
                records.append(Sent(partition, f"p{partition}-k{rng.randrange(KEYS_PER_PARTITION)}", value, now))
        done = _must(cli.run("produce", spec.name, now=now, stdin=produce_input(records)))
        for record, offset in zip(records, acknowledged_offsets(done, records), strict=True):
            produced[record.partition][offset] = record

    for _ in range(2):
        for _ in range(MIN_FILES):
            produce()
        _must(cli.run("compact", "--until-idle", "--min-files", str(MIN_FILES), now=now))
    for _ in range(MIN_FILES):
        produce()
    live = [json.loads(line) for line in _must(cli.run("files", now=now)).stdout.splitlines()]
    levels = Counter(f["level"] for f in live)
    if levels != Counter({0: MIN_FILES, 1: 2}):
        raise SystemExit(f"the campaign's store should hold {MIN_FILES} L0 and 2 L1 files, it holds {dict(levels)}")
    return BaseStore(
        directory, spec, produced, now,
        sorted(f["key"] for f in live if f["level"] == 0), sorted(f["key"] for f in live if f["level"] == 1),
    )


def _must(done: Done) -> Done:
    if done.returncode != 0:
        raise SystemExit(f"building the campaign's store: {' '.join(done.args)} failed: {done.first_error_line()}")
    return done


# -- the damage ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    kind: str  # file part, whole file, catalog row, random flip
    name: str
    damage: Callable[[Path], None]  # applied to the store directory of a fresh copy


@dataclass
class Layout:
    """Where a segment file's parts are, read from its bytes as docs/format.md specifies."""

    schema: tuple[int, int]
    blocks: list[tuple[int, int, int]]  # (prefix position, index length, payload length)
    footer: tuple[int, int]
    size: int


def layout(data: bytes) -> Layout:
    _magic, _version, _compression, schema_length = FILE_HEADER.unpack_from(data, 0)
    footer_position, footer_length, *_ = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    blocks, at = [], FILE_HEADER.size + schema_length
    while at < footer_position:
        index_length, _, payload_length, _ = BLOCK_PREFIX.unpack_from(data, at)
        blocks.append((at, index_length, payload_length))
        at += BLOCK_PREFIX.size + index_length + payload_length
    return Layout((FILE_HEADER.size, schema_length), blocks, (footer_position, footer_length), len(data))


def flip(path: Path, position: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def file_part_cases(level: str, key: str, base: Path) -> list[Case]:
    parts = layout((base / key).read_bytes())
    block, index_length, payload_length = parts.blocks[len(parts.blocks) // 2]
    index_at = block + BLOCK_PREFIX.size
    positions = {
        "header (format version)": (8, 0x01),
        "schema message": (parts.schema[0] + parts.schema[1] // 2, 0xFF),
        "block prefix: index length": (block + 1, 0x01),
        "block prefix: payload length": (block + 9, 0x01),
        "block prefix: index CRC": (block + 4, 0xFF),
        "block prefix: payload CRC": (block + 12, 0xFF),
        "index message": (index_at + index_length // 2, 0xFF),
        "payload message": (index_at + index_length + payload_length // 2, 0xFF),
        "footer": (parts.footer[0] + parts.footer[1] // 2, 0xFF),
        "trailer (footer position)": (parts.size - TRAILER.size, 0x08),
    }
    return [
        Case("file part", f"{level} {name}", lambda store, at=at, mask=mask: flip(store / key, at, mask))
        for name, (at, mask) in positions.items()
    ]


def whole_file_cases(level: str, key: str, other: str) -> list[Case]:
    def truncate(store: Path) -> None:
        path = store / key
        path.write_bytes(path.read_bytes()[: path.stat().st_size * 6 // 10])

    return [
        Case("whole file", f"{level} truncated to 60%", truncate),
        Case("whole file", f"{level} swapped for another {level} file", lambda store: shutil.copyfile(store / other, store / key)),
        Case("whole file", f"{level} deleted", lambda store: (store / key).unlink()),
    ]


def catalog_cases(level: str, key: str, partitions: int) -> list[Case]:
    middle = partitions // 2

    def edit(statement: str) -> Callable[[Path], None]:
        def apply(store: Path) -> None:
            with closing(sqlite3.connect(store / "catalog.db")) as catalog, catalog:
                file_id = catalog.execute("SELECT file_id FROM files WHERE key = ?", (key,)).fetchone()[0]
                changed = catalog.execute(statement, {"file": file_id, "partition": middle}).rowcount
                if changed != 1:
                    raise SystemExit(f"catalog edit {statement!r} changed {changed} rows, not 1")

        return apply

    section = "UPDATE sections SET {} WHERE file_id = :file AND partition = :partition"
    edits = {
        "byte_offset + 8": section.format("byte_offset = byte_offset + 8"),
        "byte_length - 8": section.format("byte_length = byte_length - 8"),
        "first_row + 1": section.format("first_row = first_row + 1"),
        "record_count - 1": section.format("record_count = record_count - 1"),
        "record_count + 1": section.format("record_count = record_count + 1"),
        "first_offset + 1": section.format("first_offset = first_offset + 1"),
        "last_offset + 1": section.format("last_offset = last_offset + 1"),
        "crc32 flipped": section.format("crc32 = (crc32 | 1) - (crc32 & 1)"),  # SQLite has no XOR
        "file size + 1": "UPDATE files SET size = size + 1 WHERE file_id = :file",
    }
    return [Case("catalog row", f"{level} {name}", edit(statement)) for name, statement in edits.items()]


def random_flip_cases(base: BaseStore, flips: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    keys = base.l0_keys + base.l1_keys
    cases = []
    for _ in range(flips):
        key = rng.choice(keys)
        position = rng.randrange((base.directory / "store" / key).stat().st_size)
        mask = rng.randrange(1, 256)
        level = "L0" if key in base.l0_keys else "L1"
        cases.append(Case("random flip", f"{level} byte {position} ^ {mask:#04x}",
                          lambda store, key=key, position=position, mask=mask: flip(store / key, position, mask)))
    return cases


def targeted_cases(base: BaseStore, levels: tuple[str, ...] = ("L0", "L1")) -> list[Case]:
    store = base.directory / "store"
    files = {"L0": base.l0_keys, "L1": base.l1_keys}
    cases = []
    for level in levels:
        key, other = files[level][1 % len(files[level])], files[level][0]
        cases += file_part_cases(level, key, store) + whole_file_cases(level, key, other)
        cases += catalog_cases(level, key, base.spec.partitions)
    return cases


# -- one case ------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: Case
    tracebacks: int = 0
    multiline_errors: int = 0
    corrupt_rows: int = 0
    silent_losses: int = 0
    plan_failures: int = 0
    set_aside: int = 0
    unreadable: int = 0
    uncompacted: int = 0
    first_error: str = ""
    examples: list[str] = field(default_factory=list)


COUNTS = ("tracebacks", "multiline_errors", "corrupt_rows", "silent_losses", "plan_failures", "set_aside", "unreadable", "uncompacted")


def run_case(base: BaseStore, case: Case, directory: Path) -> CaseResult:
    shutil.copytree(base.directory / "store", directory / "store")
    case.damage(directory / "store")
    cli = Cli(directory / "store", directory / "tmp")
    result = CaseResult(case)
    now = base.now + 60_000
    compaction = cli.run("compact", "--until-idle", "--min-files", str(MIN_FILES), now=now)
    pairs = [(base.spec.name, p) for p in range(base.spec.partitions)]
    listed, *consumed = cli.run_many([["uncleanable", "list"], *(["consume", t, "--partition", str(p)] for t, p in pairs)], now)

    listing_missing = listed.returncode == 2 and "No such command" in listed.stderr
    commands = [compaction, *([] if listing_missing else [listed]), *consumed]
    if listing_missing:
        # Before `logcompact uncleanable` exists: the partitions the compaction's stats list as set aside.
        result.set_aside = sum(len(json.loads(line).get("uncleanable", [])) for line in compaction.stdout.splitlines())
    elif listed.returncode == 0:  # a line per partition, then one with the count
        result.set_aside = sum("partition" in json.loads(line) for line in listed.stdout.splitlines() if line.strip())
    for done in commands:
        _count_errors(result, done)
    if compaction.returncode != 0:
        result.plan_failures = 1
    result.first_error = next((d.first_error_line() for d in commands if d.returncode != 0), "")

    for (topic, partition), done in zip(pairs, consumed):
        if done.returncode != 0:
            result.unreadable += 1
            continue
        check = check_partition(base.spec, base.produced[partition], consumed_records(done), now)
        result.corrupt_rows += check.changed
        result.silent_losses += check.lost
        result.uncompacted += check.duplicate_keys > 0
        result.examples += [f"{topic}/{partition}: {e}" for e in check.examples]
    _check_outputs(base, directory / "store", result)
    return result


def _count_errors(result: CaseResult, done: Done) -> None:
    if done.traceback or done.returncode < 0:
        result.tracebacks += 1
    elif done.returncode != 0 and len(done.error_lines()) > 1:
        result.multiline_errors += 1


def _check_outputs(base: BaseStore, store_dir: Path, result: CaseResult) -> None:
    """Every row of every new data file, committed or not, against the records produced: the values are unique,
    so each row names its record, and a section's rows must keep one distance between offset and delta."""
    before = {p.relative_to(base.directory / "store") for p in (base.directory / "store" / "data").rglob("*.seg")}
    store = LocalStore(store_dir)
    by_value = {r.value: (offset, r) for partition in base.produced.values() for offset, r in partition.items() if r.value}
    for path in sorted((store_dir / "data").rglob("*.seg")):
        key = path.relative_to(store_dir)
        if key in before:
            continue
        try:
            footer = read_footer(store, key.as_posix())
            sections = [read_section(store, key.as_posix(), info) for info in footer.sections]
        except LogcompactError as exc:
            result.corrupt_rows += 1
            result.examples.append(f"output {key} cannot be read back: {exc}")
            continue
        for section in sections:
            table = section.table(["offset_delta", "key", "value", "timestamp"]).to_pylist()
            first_offsets = set()
            for row in table:
                value = row["value"].decode(errors="replace") if row["value"] is not None else None
                found = by_value.get(value)
                key_text = row["key"].decode(errors="replace") if row["key"] is not None else None
                if value is None:
                    continue  # a tombstone has no unique value: its key and offset are checked by consume
                if found is None or (found[1].key, found[1].timestamp) != (key_text, row["timestamp"]):
                    result.corrupt_rows += 1
                    result.examples.append(f"output {key}: row {row} was never produced")
                    continue
                first_offsets.add(found[0] - row["offset_delta"])
            if len(first_offsets) > 1:
                result.corrupt_rows += 1
                result.examples.append(f"output {key}: section {section.info.topic}/{section.info.partition} moves records between offsets")


# -- the campaign --------------------------------------------------------------------------------------------


def run_corruption_campaign(directory: Path, partitions: int, flips: int, seed: int, levels: tuple[str, ...] = ("L0", "L1"),
                            echo: Callable[[str], None] = print) -> list[CaseResult]:
    base = build_store(directory / "base", partitions, seed)
    cases = targeted_cases(base, levels) + random_flip_cases(base, flips, seed)
    results = []
    for number, case in enumerate(cases):
        result = run_case(base, case, directory / f"case{number:03d}")
        shutil.rmtree(directory / f"case{number:03d}")
        results.append(result)
        counts = " ".join(f"{name.replace('_', ' ')} {getattr(result, name)}" for name in COUNTS if getattr(result, name))
        echo(f"{case.kind:11} | {case.name:44} | {counts or 'clean'}" + (f" | {result.first_error[:160]}" if result.first_error else ""))
        for example in result.examples[:3]:
            echo(f"    {example[:200]}")
    return results


def totals(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    """Per class of case, in the order the cases ran, then the total."""
    table: dict[str, dict[str, int]] = {}
    for kind in [*dict.fromkeys(r.case.kind for r in results), "total"]:
        chosen = [r for r in results if kind in ("total", r.case.kind)]
        table[kind] = {"cases": len(chosen), **{name: sum(getattr(r, name) for r in chosen) for name in COUNTS}}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=40, help="partitions of the topic (every file holds each)")
    parser.add_argument("--flips", type=int, default=40, help="random byte flips over data files")
    parser.add_argument("--seed", type=int, default=None, help="seed of the store and the flips (printed)")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (kept); a temporary directory otherwise")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"corruption campaign: {args.partitions} partitions, {args.flips} random flips, seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="corruption-campaign-") as scratch:
        results = run_corruption_campaign(args.dir or Path(scratch), args.partitions, args.flips, seed,
                                          echo=lambda line: print(line, flush=True))
    print()
    print(f"{'class':12} {'cases':>5} " + " ".join(f"{name.replace('_', ' '):>16}" for name in COUNTS))
    for kind, row in totals(results).items():
        print(f"{kind:12} {row['cases']:>5} " + " ".join(f"{row[name]:>16}" for name in COUNTS))


if __name__ == "__main__":
    main()
