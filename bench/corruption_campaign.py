"""Corruption campaign: damaged data files and catalog rows under a compaction, a store paired with a catalog that
is not its own, then every partition consumed.

    .venv/bin/python bench/corruption_campaign.py                  # every targeted case on an L0 and an L1 file, 40 flips: 107 cases, 12 to 20 minutes
    .venv/bin/python bench/corruption_campaign.py --flips 200 --seed 7 --partitions 100
    .venv/bin/python bench/corruption_campaign.py --partitions 8 --flips 0 --only "catalog check" --name relabelled --dir /tmp/c

The store: one compacted topic (`ledger`, 40 partitions by default) written by the CLI as 2 L1 files (each
the copy of 3 L0 files) and 3 more L0 files, every file holding every partition in a few blocks, keys reused
(8 a partition), 5% tombstones. `compact --until-idle --min-files 3` then runs two plans: the 3 L0 files
copied into an L1 file, and the 3 L1 files deduplicated into L2 (both passes). The wrong-catalog cases also
build another cluster with the same topic and partitions (an L1 and an L0 file of its own).

Each file-part, whole-file, catalog-row and random-flip case damages a fresh copy of that store, then runs
`compact --until-idle --min-files 3` as a process and `logcompact uncleanable list` and `consume` of every
partition through the CLI's main() in one process:

* file parts, on an L0 file (read by the copy) and an L1 file (read by both passes of the deduplication),
  one byte flipped: the header, the schema message, the lengths in a block prefix (index, payload), its index
  CRC and its payload CRC, the index message, the payload message (all in the file's middle block), the
  footer, the trailer;
* whole files: truncated to 60%, replaced by another data file of its level (swap), deleted;
* catalog rows (catalog.db, sqlite3), on the section of the file's middle partition: byte_offset + 8,
  byte_length - 8, first_row + 1, record_count - 1 and + 1, first_offset + 1, last_offset + 1, crc32 flipped;
  and the file's size + 1;
* random flips (--flips, seeded): one byte of a random live data file xored with a random value.

Each catalog-check and wrong-catalog case does what an operator would on a fresh copy, then runs,
each command pointed at the case's catalog: `consume` of every partition, `produce` (two records a partition),
`compact --until-idle --min-files 3`, `gc --grace-ms 0 --now` past every object's time, `uncleanable list` and
`consume` of every partition again:

* catalog checks, rows that were once read as truth: `partitions.next_offset` of the middle partition lowered to
  1 (produce must refuse with one line, committing nothing, and consume of that partition refuse);
  `catalog_info.version` - 2, with the store's cluster.json kept or deleted (every reader and writer refuses,
  nothing is written); `topics.config` not JSON (produce, compact and consume refuse); a removed `files.key`
  with '..' out of the kept versions (gc exits 1, deletes nothing outside the store, collects the other removed
  files); the one section of a file of the middle partition alone relabelled as the next partition (consume of
  that partition and produce refuse), and alike with another such file after it (consume of the middle partition
  refuses too: its gap is no compaction's hole); the middle partition's section shifted by half its length over the
  section before it, of the second L0 file over the first's, of the first L0 file over an L1 file's (outside
  the L0 plan), of the second L1 file over the first's; on the second L0 and L1 file, the middle
  partition's section relabelled as the next partition's and that one as it (both hold the same offsets: every
  check of offsets passes, and the rows' crc32, bound to their partitions, no longer match the file: consume of
  both partitions must refuse, right after the damage and at the end); on the newest L0 and L1 file,
  `record_count = 0` (for the shifts and these, consume right after the damage must refuse; compaction and the
  final consume must not lose or change a record); on the second L0 and L1 file, the middle partition's section
  alone retired at an append's version (consume of that partition must refuse right after the damage and at the
  end, and no object be lost);
* wrong catalogs: `--catalog` or `LOGCOMPACT_CATALOG` naming another cluster's catalog, another cluster's
  catalog.db copied over the store's, an older catalog.db restored (copied before a produce and a compaction),
  the store's cluster.json deleted with another cluster's catalog.db copied over, or named by `--catalog`, or
  with `--catalog` naming a cluster just created with no data: every command refuses with
  one line, nothing is written to or deleted from the store (its marker included) or either catalog.

Counted per case, and totalled per class of case:
* tracebacks: "Traceback" on any command's stderr (or a command process that died);
* multi-line errors: a failed command whose stderr says more than one line (logged warnings aside);
* objects lost: objects the store held before the commands that are gone or changed, byte for byte, though
  the store's own undamaged catalog does not call them garbage at gc's clock (a data file it has no row for or
  removed before its oldest kept version, a plan document of a plan holding no lease); the store's marker
  deleted;
* wrong reads (silent wrong reads): a consume that exited 0 shows a record that was not produced at that
  offset of that partition (another partition's, another cluster's), an offset twice or out of order, or a key's
  older value or deleted key as its latest; or a produce acknowledged an offset already given out;
* silent losses: consume exited 0 but a key's latest value is missing;
* leaked seals: rows of the catalog's `plan_seals` whose plan holds no lease, after the commands;
* unmet: what a catalog-check or wrong-catalog case expects and did not happen (a refusal, nothing written, gc collecting the rest),
  and a store marker naming another cluster than the store's;
* corrupt rows: a consumed record that differs from the one produced at its offset (key, value, timestamp), or
  sits where none was produced, or a row of a new output file (committed or not) that does, or that sits
  under another partition than the record's;
* plan failures: compaction exited non-zero (a whole plan refused);
* set aside: partitions `logcompact uncleanable list` lists (one JSON line each; before that command exists,
  the partitions the compaction's stats list as uncleanable);
* unreadable: partitions whose (final) consume failed with a clear error (damage left where it was);
* uncompacted: partitions that still show a key twice (the others were compacted).
Targets, printed last with what was found: 0 tracebacks, 0 corrupt rows, 0 silent losses, the
damaged partition set aside and the rest compacted; 0 lost (objects lost and silent losses), 0
silent wrong reads (wrong reads), 0 tracebacks, 0 leaked seals; and 0 unmet expectations, 0 multi-line errors.
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
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

# The lab (lab/: throw-away servers, the campaigns' harness, the reference model) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.campaign import (
    CATALOG_FILES,
    Cli,
    Done,
    Sent,
    TopicSpec,
    acknowledged_offsets,
    catalog_dump,
    check_partition,
    consumed_records,
    leaked_seals,
    produce_input,
    store_objects,
)
from logcompact.catalog import DEFAULT_KEEP_VERSIONS
from logcompact.exceptions import LogcompactError
from logcompact.format.reader import read_footer, read_section
from logcompact.store import LocalStore

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
    l0_keys: list[str]  # in the order they were written (the catalog's file_id): the cases pick the same file every run
    l1_keys: list[str]


def build_store(directory: Path, partitions: int, seed: int, rounds: int = 2, trailing: int = MIN_FILES, tag: str = "v") -> BaseStore:
    """`rounds` times MIN_FILES produces and a compaction (an L1 file each), then `trailing` produces (L0 files);
    every value starts with `tag` and a sequence number, so a value names its record (and its cluster)."""
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
                value = None if rng.random() < 0.05 else f"{tag}{sequence}-" + "x" * rng.randint(20, 200)
                records.append(Sent(partition, f"p{partition}-k{rng.randrange(KEYS_PER_PARTITION)}", value, now))
        done = _must(cli.run("produce", spec.name, now=now, stdin=produce_input(records)))
        for record, offset in zip(records, acknowledged_offsets(done, records), strict=True):
            produced[record.partition][offset] = record

    for _ in range(rounds):
        for _ in range(MIN_FILES):
            produce()
        _must(cli.run("compact", "--until-idle", "--min-files", str(MIN_FILES), now=now))
    for _ in range(trailing):
        produce()
    live = [json.loads(line) for line in _must(cli.run("files", now=now)).stdout.splitlines()]
    levels = Counter(f["level"] for f in live)
    if levels != Counter({0: trailing, 1: rounds}):
        raise SystemExit(f"the campaign's store should hold {trailing} L0 and {rounds} L1 files, it holds {dict(levels)}")
    with closing(sqlite3.connect(f"file:{directory / 'store' / 'catalog.db'}?mode=ro", uri=True)) as catalog:
        written = {key: number for number, (key,) in enumerate(catalog.execute("SELECT key FROM files ORDER BY file_id"))}
    return BaseStore(
        directory, spec, produced, now,
        sorted((f["key"] for f in live if f["level"] == 0), key=written.__getitem__),
        sorted((f["key"] for f in live if f["level"] == 1), key=written.__getitem__),
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


# -- the catalog's rows and the wrong catalog ----------------------------------------------------------------

MARKER_KEY = "cluster.json"  # the store's cluster marker (docs/catalog.md), restated as the store holds it
OUTSIDE = "outside.seg"  # beside the case's store: what a removed row's key with '..' points at


@dataclass
class ClusterCase:
    """A catalog-check or wrong-catalog case: the store damaged or paired with a wrong catalog, then `produce`, `compact --until-idle`,
    `gc --grace-ms 0` at a clock past every object's time, `uncleanable list` and `consume` of every partition, each
    pointed at the catalog `pointed` names; `expect` says what the commands must have done."""

    kind: str  # catalog check, wrong catalog
    name: str
    damage: Callable[[CaseRun], None]
    expect: Callable[[CaseRun], list[str]]  # the unmet expectations, one line each
    pointed: str = "own"  # the store's catalog.db; "--catalog" or "LOGCOMPACT_CATALOG": the other cluster's, at other/
    prepare: Callable[[CaseRun], None] | None = None  # work on the store's own catalog before the damage, which it knows
    other: bool = False  # the case needs a copy of the other cluster at other/


@dataclass
class CaseRun:
    """A catalog-check or wrong-catalog case as it runs: its directory (the store at store/, the other cluster at other/), the records
    produced (the base store's and the case's own, at the offsets acknowledged), what each command did."""

    base: BaseStore
    case: ClusterCase
    directory: Path
    cli: Cli
    produced: dict[int, dict[int, Sent]]
    now: int
    number: int
    done: dict[str, Done] = field(default_factory=dict)  # produce, compact, gc, uncleanable list
    early: dict[int, Done] = field(default_factory=dict)  # consume by partition, right after the damage
    consumed: dict[int, Done] = field(default_factory=dict)  # consume by partition, at the end
    reused: list[str] = field(default_factory=list)  # offsets a produce acknowledged that were already given out
    sent: dict[str, Sent] = field(default_factory=dict)  # every record the case's produces sent, by value (acknowledged or not)
    objects_before: dict[str, bytes] = field(default_factory=dict)  # the store's objects once damaged, byte for byte
    dumps_before: dict[Path, list[str]] = field(default_factory=dict)  # every catalog in the case, once damaged
    states: dict[str, tuple] = field(default_factory=dict)  # the pointed catalog's version, files and next offsets
    extra: dict[str, list[str]] = field(default_factory=dict)  # what a damage leaves for its expectation

    @property
    def store(self) -> Path:
        return self.directory / "store"

    @property
    def other(self) -> Path:
        return self.directory / "other"

    @property
    def catalog(self) -> Path:
        """The catalog database the commands use."""
        return self.store / "catalog.db" if self.case.pointed == "own" else self.other / "catalog.db"

    def pointing(self) -> tuple[list[str], dict[str, str]]:
        """The global options and the environment that point a command at the case's catalog."""
        url = f"sqlite:///{self.other / 'catalog.db'}"
        if self.case.pointed == "--catalog":
            return ["--catalog", url], {}
        if self.case.pointed == "LOGCOMPACT_CATALOG":
            return [], {"LOGCOMPACT_CATALOG": url}
        return [], {}

    def produce(self, tag: str, args: list[str] | None = None, env: dict[str, str] | None = None,
                partitions: Iterable[int] | None = None, fresh_keys: bool = False) -> Done:
        """Two records a partition (every one, or `partitions`), of the partition's keys or of keys of their own;
        those acknowledged join the model at their offsets, unless an offset was already given out (then it is
        noted in `reused`)."""
        rng = random.Random(f"{self.number}-{tag}")
        spec = self.base.spec
        records = [Sent(p, f"p{p}-{tag}{self.number}-{i}" if fresh_keys else f"p{p}-k{rng.randrange(KEYS_PER_PARTITION)}",
                        f"{tag}{self.number}-{p}-{i}", self.now)
                   for p in (range(spec.partitions) if partitions is None else partitions) for i in range(2)]
        self.sent.update((record.value, record) for record in records if record.value)
        done = self.cli.run(*(args or []), "produce", spec.name, now=self.now, stdin=produce_input(records), env=env)
        for record, offset in zip(records, acknowledged_offsets(done, records) or []):
            held = self.produced[record.partition].get(offset)
            if held is not None:
                self.reused.append(f"produce acknowledged {record.value} at {spec.name}/{record.partition} offset {offset}, "
                                   f"already given to {held.value}")
            else:
                self.produced[record.partition][offset] = record
        return done


def _sql(database: Path, *statements: tuple[str, tuple]) -> list[int]:
    """Statements in one transaction behind the product's back; the rows each changed."""
    with closing(sqlite3.connect(database)) as connection, connection:
        return [connection.execute(statement, parameters).rowcount for statement, parameters in statements]


def _query(database: Path, statement: str, parameters: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        return connection.execute(statement, parameters).fetchall()


def _edit(database: Path, *statements: tuple[str, tuple]) -> None:
    changed = _sql(database, *statements)
    if 0 in changed:
        raise SystemExit(f"catalog edit {statements} changed {changed} rows")


def _state(database: Path) -> tuple:
    """What a write changes: the version, the files, the next offsets."""
    if not database.exists():
        return ()
    return (_query(database, "SELECT version FROM catalog_info"), _query(database, "SELECT count(*) FROM files"),
            _query(database, "SELECT topic_id, partition, next_offset FROM partitions ORDER BY 1, 2"))


def copy_catalog(source: Path, target: Path) -> None:
    """Copy a catalog.db as an operator copies files: the database and its WAL, over whatever is there."""
    for name in CATALOG_FILES:
        (target.parent / name).unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    for name in CATALOG_FILES:
        if (source.parent / name).exists():
            shutil.copyfile(source.parent / name, target.parent / name)


def _section_row(database: Path, key: str, partition: int) -> tuple[int, int, int]:
    """(file_id, first_offset, last_offset) of a file's section of a partition."""
    ((file_id, first, last),) = _query(
        database, "SELECT s.file_id, s.first_offset, s.last_offset FROM sections s JOIN files f ON f.file_id = s.file_id "
        "WHERE f.key = ? AND s.partition = ?", (key, partition))
    return file_id, first, last


# What a case expects of its commands: each returns the unmet expectations.


def _refused(run: CaseRun, *names: str) -> list[str]:
    return [f"{name} exited 0, it must refuse" for name in names if run.done[name].returncode == 0]


def _consumes_refused(run: CaseRun, partitions: Iterable[int], early: bool = False) -> list[str]:
    """Consumes of these partitions, at the end (or right after the damage), that did not refuse."""
    consumed = run.early if early else run.consumed
    read = [p for p in partitions if consumed[p].returncode == 0]
    when = "right after the damage" if early else "at the end"
    return [f"consume {when} of {len(read)} partition(s) ({', '.join(map(str, read[:5]))}) exited 0, it must refuse"] if read else []


def _all_refused(run: CaseRun) -> list[str]:
    return (_refused(run, "produce", "compact", "gc", "uncleanable list") + _consumes_refused(run, run.early, early=True)
            + _consumes_refused(run, run.consumed))


def _nothing_written(run: CaseRun) -> list[str]:
    """Every object of the store as it was (the marker too), every catalog of the case as it was."""
    after = store_objects(run.store)
    changed = sorted(key for key in run.objects_before.keys() | after.keys() if run.objects_before.get(key) != after.get(key))
    unmet = [f"{len(changed)} object(s) of the store written, changed or deleted (first {changed[0]})"] if changed else []
    for database, dump in run.dumps_before.items():
        if catalog_dump(database) != dump:
            unmet.append(f"catalog {database.relative_to(run.directory)} was written to")
    return unmet


def _refused_everything(run: CaseRun) -> list[str]:
    return _all_refused(run) + _nothing_written(run)


def _produce_committed_nothing(run: CaseRun) -> list[str]:
    before, after = run.states["damaged"], run.states["produced"]
    return [] if before == after else [f"the refused produce changed the catalog: {before} -> {after}"]


def catalog_check_cases(base: BaseStore, levels: tuple[str, ...] = ("L0", "L1")) -> list[ClusterCase]:
    """Catalog rows that were once read as truth: each must be refused in one line, never hand out an offset twice,
    hide data, show a record twice or under another partition."""
    partitions = base.spec.partitions
    middle, neighbour = partitions // 2, (partitions // 2 + 1) % partitions
    files = {"L0": base.l0_keys, "L1": base.l1_keys}

    def lower_next_offset(run: CaseRun) -> None:
        _edit(run.store / "catalog.db", ("UPDATE partitions SET next_offset = 1 WHERE partition = ?", (middle,)))

    def lower_version(unmark: bool) -> Callable[[CaseRun], None]:
        def damage(run: CaseRun) -> None:
            _edit(run.store / "catalog.db", ("UPDATE catalog_info SET version = version - 2", ()))
            if unmark:
                (run.store / MARKER_KEY).unlink()  # only the commit log can tell

        return damage

    def break_config(run: CaseRun) -> None:
        _edit(run.store / "catalog.db", ("UPDATE topics SET config = '{broken'", ()))

    def dot_dot_key(run: CaseRun) -> None:
        removed = [key for (key,) in _query(run.store / "catalog.db", "SELECT key FROM files WHERE removed_version IS NOT NULL ORDER BY key")]
        _edit(run.store / "catalog.db", ("UPDATE files SET key = ? WHERE key = ?", (f"data/l0/../../../{OUTSIDE}", removed[0])))
        (run.directory / OUTSIDE).write_bytes(b"not the store's: gc must leave it")
        run.extra["rest"] = removed[1:]

    def out_of_kept_versions(run: CaseRun) -> None:
        """After 100 more commits (that changed nothing: their commit log entries alone): the files the compactions
        removed are out of the kept versions, garbage of this catalog for gc to collect. (Their removed_version
        lowered instead would no longer be a compaction's: the mark of a damaged row, whose file gc keeps.)"""
        ((version,),) = _query(run.store / "catalog.db", "SELECT version FROM catalog_info")
        later = [(number, f"kept-{run.number}-{number}", run.now, "append") for number in range(version + 1, version + 1 + DEFAULT_KEEP_VERSIONS)]
        with closing(sqlite3.connect(run.store / "catalog.db")) as connection, connection:
            connection.executemany("INSERT INTO versions (version, commit_id, created_ms, operation) VALUES (?, ?, ?, ?)", later)
            connection.execute("UPDATE catalog_info SET version = ?", (later[-1][0],))

    def dot_dot_expected(run: CaseRun) -> list[str]:
        gc = run.done["gc"]
        unmet = [] if gc.returncode == 1 else [f"gc exited {gc.returncode}, not 1"]
        if not (run.directory / OUTSIDE).exists() or (run.directory / OUTSIDE).read_bytes() != b"not the store's: gc must leave it":
            unmet.append(f"gc deleted or changed {OUTSIDE}, outside the store")
        kept = [key for key in run.extra["rest"] if (run.store / key).exists()]
        return unmet + ([f"gc did not collect the other {len(kept)} removed file(s), first {kept[0]}"] if kept else [])

    def shift(key: str) -> Callable[[CaseRun], None]:
        def damage(run: CaseRun) -> None:
            file_id, first, last = _section_row(run.store / "catalog.db", key, middle)
            half = (last - first + 1) // 2
            delta = -half if first >= half else half  # over the section before it, or after it
            _edit(run.store / "catalog.db", ("UPDATE sections SET first_offset = first_offset + ?, last_offset = last_offset + ? "
                                             "WHERE file_id = ? AND partition = ?", (delta, delta, file_id, middle)))

        return damage

    def relabel(key: str) -> Callable[[CaseRun], None]:
        def damage(run: CaseRun) -> None:
            file_id, _, _ = _section_row(run.store / "catalog.db", key, middle)
            where = "WHERE file_id = ? AND partition = ?"
            _edit(run.store / "catalog.db", (f"UPDATE sections SET partition = -1 {where}", (file_id, middle)),
                  (f"UPDATE sections SET partition = ? {where}", (middle, file_id, neighbour)),
                  (f"UPDATE sections SET partition = ? {where}", (neighbour, file_id, -1)))

        return damage

    def one_partition_file(run: CaseRun) -> None:
        """An L0 file of the middle partition alone, of keys of its own."""
        _must(run.produce("m", partitions=[middle], fresh_keys=True))

    def relabel_alone(run: CaseRun) -> None:
        """That file's only section relabelled as the neighbour's: a row change the primary key allows. Its
        records leave the model: the damage itself hides them from their partition (keys of their own, so the
        partition shows nothing else wrong)."""
        ((file_id,),) = _query(run.store / "catalog.db", "SELECT max(file_id) FROM files")
        _edit(run.store / "catalog.db", ("UPDATE sections SET partition = ? WHERE file_id = ? AND partition = ?", (neighbour, file_id, middle)))
        run.produced[middle] = {o: r for o, r in run.produced[middle].items() if not (r.key or "").startswith(f"p{middle}-m")}

    def two_partition_files(run: CaseRun) -> None:
        """Two L0 files of the middle partition alone, of keys of their own."""
        for tag in ("m", "a"):  # ("n" is the commands' produce)
            _must(run.produce(tag, partitions=[middle], fresh_keys=True))

    def relabel_alone_before(run: CaseRun) -> None:
        """The first of those files' only section relabelled as the neighbour's: the second follows the gap it leaves
        in the compacted partition, where compactions leave gaps too (none recorded there). Its records leave the
        model, as `relabel_alone`'s."""
        ((file_id,),) = _query(run.store / "catalog.db", "SELECT max(file_id) FROM files WHERE file_id < (SELECT max(file_id) FROM files)")
        _edit(run.store / "catalog.db", ("UPDATE sections SET partition = ? WHERE file_id = ? AND partition = ?", (neighbour, file_id, middle)))
        run.produced[middle] = {o: r for o, r in run.produced[middle].items() if not (r.key or "").startswith(f"p{middle}-m")}

    def retire_alone(key: str) -> Callable[[CaseRun], None]:
        """The file's section of the middle partition marked retired at the newest version (an append's, not a
        compaction's), its file left live: the damage hides its records."""
        def damage(run: CaseRun) -> None:
            file_id, _, _ = _section_row(run.store / "catalog.db", key, middle)
            _edit(run.store / "catalog.db", ("UPDATE sections SET removed_version = (SELECT version FROM catalog_info) "
                                             "WHERE file_id = ? AND partition = ?", (file_id, middle)))

        return damage

    def no_records(key: str) -> Callable[[CaseRun], None]:
        def damage(run: CaseRun) -> None:
            file_id, _, _ = _section_row(run.store / "catalog.db", key, middle)
            _edit(run.store / "catalog.db", ("UPDATE sections SET record_count = 0 WHERE file_id = ? AND partition = ?", (file_id, middle)))

        return damage

    kind = "catalog check"
    cases = [
        ClusterCase(kind, f"partitions.next_offset of {middle} lowered to 1", lower_next_offset,
                    lambda run: _refused(run, "produce") + _produce_committed_nothing(run) + _consumes_refused(run, [middle], early=True)),
        ClusterCase(kind, "catalog_info.version - 2", lower_version(unmark=False), _refused_everything),
        ClusterCase(kind, "catalog_info.version - 2, cluster.json deleted", lower_version(unmark=True), _refused_everything),
        ClusterCase(kind, "topics.config not JSON", break_config,
                    lambda run: _refused(run, "produce", "compact") + _consumes_refused(run, run.early, early=True)),
        ClusterCase(kind, "a removed files.key with '..', out of kept versions", dot_dot_key, dot_dot_expected, prepare=out_of_kept_versions),
        ClusterCase(kind, f"section of a file of {middle} alone relabelled {neighbour}", relabel_alone,
                    lambda run: _consumes_refused(run, [neighbour], early=True) + _refused(run, "produce") + _produce_committed_nothing(run),
                    prepare=one_partition_file),
        # The partition is compacted: the gap the row leaves is no compaction's hole, so the middle partition's
        # consume refuses too, right after the damage and at the end (the compaction sets it aside).
        ClusterCase(kind, f"section of a file of {middle} alone, another after it, relabelled {neighbour}", relabel_alone_before,
                    lambda run: _consumes_refused(run, [middle, neighbour], early=True) + _consumes_refused(run, [middle])
                    + _refused(run, "produce") + _produce_committed_nothing(run),
                    prepare=two_partition_files),
    ]
    # Shifted by half its length over the section before it: of a file in the same plan, or (the first L0 file's,
    # over the second L1 file's) outside the plan, which only the partition's other rows can tell.
    shifts = {"L0": [(files["L0"][1], "the L0 section before it"), (files["L0"][0], "an L1 section, outside the plan")],
              "L1": [(files["L1"][1], "the L1 section before it")]}
    for level in levels:
        key = files[level][1 % len(files[level])]
        cases += [
            ClusterCase(kind, f"{level} section of {middle} shifted over {over}", shift(shifted), lambda run: _consumes_refused(run, [middle], early=True))
            for shifted, over in shifts[level]
        ]
        cases += [
            # Both sections hold the same offsets (every batch gives each partition as many records): the rows pass
            # every check of offsets; each row's crc32, bound to its partition, no longer matches the file, so both
            # partitions' consumes refuse (and the compaction sets both aside: they still refuse at the end).
            ClusterCase(kind, f"{level} sections of {middle} and {neighbour} relabelled as each other", relabel(key),
                        lambda run: _consumes_refused(run, [middle, neighbour], early=True) + _consumes_refused(run, [middle, neighbour])),
            # The partition is compacted (its holes are compaction's): the row retired by no compaction is refused by
            # name, right after the damage and at the end (the compaction sets the partition aside, keeping the file).
            ClusterCase(kind, f"{level} section of {middle} alone retired", retire_alone(key),
                        lambda run: _consumes_refused(run, [middle], early=True) + _consumes_refused(run, [middle])),
            # On the level's newest file, whose records hold keys' latest values: records lost there show.
            ClusterCase(kind, f"{level} section of {middle} in its newest file: record_count = 0", no_records(files[level][-1]),
                        lambda run: _consumes_refused(run, [middle], early=True)),
        ]
    return cases


def wrong_catalog_cases(base: BaseStore) -> list[ClusterCase]:
    """A store paired with a catalog that is not its own, as an operator pairs them by mistake: every command
    must refuse in one line and write or delete nothing, in the store or in either catalog."""

    def swap(run: CaseRun) -> None:
        copy_catalog(run.other / "catalog.db", run.store / "catalog.db")

    def unmark(then: Callable[[CaseRun], None] | None = None) -> Callable[[CaseRun], None]:
        def damage(run: CaseRun) -> None:
            (run.store / MARKER_KEY).unlink()
            if then:
                then(run)

        return damage

    def new_cluster(run: CaseRun) -> None:
        """A cluster just created beside the store: the topic, no data."""
        created = Cli(run.other, run.directory / "other-tmp").run(*base.spec.create_args(), now=run.now)
        _must(created)

    def back_up_then_write(run: CaseRun) -> None:
        """A copy of catalog.db, then a produce and a compaction it does not know."""
        copy_catalog(run.store / "catalog.db", run.directory / "backup" / "catalog.db")
        _must(run.produce("r"))
        _must(run.cli.run("compact", "--until-idle", "--min-files", str(MIN_FILES), now=run.now))

    def restore(run: CaseRun) -> None:
        copy_catalog(run.directory / "backup" / "catalog.db", run.store / "catalog.db")

    kind = "wrong catalog"
    return [
        ClusterCase(kind, "--catalog names another cluster's catalog", lambda run: None, _refused_everything, pointed="--catalog", other=True),
        ClusterCase(kind, "LOGCOMPACT_CATALOG names another cluster's catalog", lambda run: None, _refused_everything,
                    pointed="LOGCOMPACT_CATALOG", other=True),
        ClusterCase(kind, "another cluster's catalog.db copied over", swap, _refused_everything, other=True),
        ClusterCase(kind, "older catalog.db restored (before a produce, a compaction)", restore, _refused_everything, prepare=back_up_then_write),
        ClusterCase(kind, "cluster.json deleted, another's catalog.db copied over", unmark(swap), _refused_everything, other=True),
        ClusterCase(kind, "cluster.json deleted, --catalog names another's", unmark(), _refused_everything, pointed="--catalog", other=True),
        ClusterCase(kind, "cluster.json deleted, --catalog names a new empty cluster's", unmark(new_cluster), _refused_everything,
                    pointed="--catalog"),
    ]


# -- one case ------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: Case | ClusterCase
    tracebacks: int = 0
    multiline_errors: int = 0
    objects_lost: int = 0  # objects of the store deleted or changed that were not garbage of the store's own catalog
    wrong_reads: int = 0  # consumed records not produced there, shown twice or out of order, resurrected; offsets given twice
    silent_losses: int = 0
    leaked_seals: int = 0
    unmet: int = 0  # expectations of a catalog-check or wrong-catalog case not met (a refusal that did not happen, a write where none may be)
    corrupt_rows: int = 0
    plan_failures: int = 0
    set_aside: int = 0
    unreadable: int = 0
    uncompacted: int = 0
    output_rows: int = 0  # of corrupt_rows: rows of new data files never produced there
    first_error: str = ""
    examples: list[str] = field(default_factory=list)


COUNTS = ("tracebacks", "multiline_errors", "objects_lost", "wrong_reads", "silent_losses", "leaked_seals", "unmet", "corrupt_rows",
          "plan_failures", "set_aside", "unreadable", "uncompacted")


def run_case(base: BaseStore, case: Case, directory: Path) -> CaseResult:
    shutil.copytree(base.directory / "store", directory / "store")
    case.damage(directory / "store")
    cli = Cli(directory / "store", directory / "tmp")
    result = CaseResult(case)
    now = base.now + 60_000
    before = store_objects(directory / "store")
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
    failed = [d for d in commands if d.traceback] or [d for d in commands if d.returncode != 0]  # a traceback first
    result.first_error = failed[0].first_error_line() if failed else ""
    _check_consumed(result, base.spec, base.produced, dict(zip((p for _, p in pairs), consumed)), now)
    _check_outputs(base.produced, set(before), directory / "store", result)
    _check_objects(result, base.directory / "store" / "catalog.db", before, directory / "store", now)
    result.leaked_seals = leaked_seals(directory / "store" / "catalog.db")
    return result


def run_cluster_case(base: BaseStore, other: BaseStore | None, case: ClusterCase, directory: Path, number: int) -> CaseResult:
    shutil.copytree(base.directory / "store", directory / "store")
    if case.other:
        assert other is not None
        shutil.copytree(other.directory / "store", directory / "other")
    run = CaseRun(base, case, directory, Cli(directory / "store", directory / "tmp"),
                  {p: dict(records) for p, records in base.produced.items()}, base.now + 60_000, number)
    if case.prepare:
        case.prepare(run)
    # The store's own catalog before the damage: what may be collected as garbage is what it says is garbage.
    true_catalog = directory / "true" / "catalog.db"
    true_catalog.parent.mkdir()
    with closing(sqlite3.connect(run.store / "catalog.db")) as source, closing(sqlite3.connect(true_catalog)) as copy:
        source.backup(copy)
    case.damage(run)
    run.objects_before = store_objects(run.store)
    run.dumps_before = {db: catalog_dump(db) for db in (run.store / "catalog.db", run.other / "catalog.db") if db.exists()}
    args, env = run.pointing()

    partitions = range(base.spec.partitions)
    consume = [[*args, "consume", base.spec.name, "--partition", str(p)] for p in partitions]
    run.early = dict(zip(partitions, run.cli.run_many(consume, run.now, env=env)))
    produced_early = {p: dict(records) for p, records in run.produced.items()}
    run.states["damaged"] = _state(run.catalog)
    run.done["produce"] = run.produce("n", args, env)
    run.states["produced"] = _state(run.catalog)
    run.done["compact"] = run.cli.run(*args, "compact", "--until-idle", "--min-files", str(MIN_FILES), now=run.now, env=env)
    later = max(run.now, time.time_ns() // 1_000_000) + 2 * 3_600_000  # past every object's time
    run.done["gc"] = run.cli.run(*args, "gc", "--grace-ms", "0", "--now", str(later), now=later, env=env)
    listed, *consumed = run.cli.run_many([[*args, "uncleanable", "list"], *consume], run.now, env=env)
    run.done["uncleanable list"] = listed
    run.consumed = dict(zip(partitions, consumed))

    result = CaseResult(case)
    commands = [*run.early.values(), *run.done.values(), *consumed]
    for done in commands:
        _count_errors(result, done)
    result.plan_failures = int(run.done["compact"].returncode != 0)
    if listed.returncode == 0:
        result.set_aside = sum("partition" in json.loads(line) for line in listed.stdout.splitlines() if line.strip())
    failed = [d for d in commands if d.traceback] or [d for d in commands if d.returncode != 0]  # a traceback first
    result.first_error = failed[0].first_error_line() if failed else ""
    _check_consumed(result, base.spec, produced_early, run.early, run.now, unreadable=False)
    _check_consumed(result, base.spec, run.produced, run.consumed, run.now)
    result.wrong_reads += len(run.reused)
    result.examples += run.reused
    _check_outputs(run.produced, set(run.objects_before), run.store, result, run.sent)
    _check_objects(result, true_catalog, run.objects_before, run.store, later)
    if run.catalog.exists():
        result.leaked_seals = leaked_seals(run.catalog)
    unmet = case.expect(run)
    result.unmet = len(unmet)
    result.examples = unmet + result.examples
    return result


def _count_errors(result: CaseResult, done: Done) -> None:
    if done.traceback or done.returncode < 0:
        result.tracebacks += 1
    elif done.returncode != 0 and len(done.error_lines()) > 1:
        result.multiline_errors += 1


def _check_consumed(result: CaseResult, spec: TopicSpec, produced: dict[int, dict[int, Sent]], consumed: dict[int, Done], now: int,
                    unreadable: bool = True) -> None:
    """What each consume that exited 0 printed, against the records produced at each offset of that partition;
    those that failed are counted unreadable (if `unreadable`)."""
    for partition, done in consumed.items():
        if done.returncode != 0:
            result.unreadable += unreadable
            continue
        check = check_partition(spec, produced[partition], consumed_records(done), now)
        result.corrupt_rows += check.changed
        result.wrong_reads += check.changed + check.repeated + check.resurrected
        result.silent_losses += check.lost
        result.uncompacted += check.duplicate_keys > 0
        result.examples += [f"{spec.name}/{partition}: {e}" for e in check.examples]


def _check_objects(result: CaseResult, true_catalog: Path, before: dict[str, bytes], store_dir: Path, now: int) -> None:
    """Every object the store held before the commands is still there, byte for byte, unless the store's own
    catalog (`true_catalog`, undamaged) says it is garbage at `now`: a data file it has no row for, or removed before
    its oldest kept version; a plan document of a plan holding no lease. The marker may be rewritten, never for
    another cluster."""
    ((version, cluster_id),) = _query(true_catalog, "SELECT version, cluster_id FROM catalog_info")
    oldest = max(1, version - DEFAULT_KEEP_VERSIONS + 1)
    rows = {key: (removed, removed_ms) for key, removed, removed_ms in _query(true_catalog, "SELECT key, removed_version, removed_ms FROM files")}
    in_flight = {plan for (plan,) in _query(true_catalog, "SELECT DISTINCT plan_id FROM leases WHERE expires_ms > ?", (now,))}

    def garbage(key: str) -> bool:
        if key.startswith("data/"):
            removed, removed_ms = rows.get(key, (0, 0))
            return removed is not None and removed <= oldest and removed_ms < now
        return key.startswith("plans/") and key.split("/")[1] not in in_flight

    after = store_objects(store_dir)
    lost = sorted(key for key, data in before.items() if key != MARKER_KEY and not garbage(key) and after.get(key) != data)
    result.objects_lost += len(lost)
    result.examples += [f"object {key} {'deleted' if key not in after else 'changed'}" for key in lost[:3]]
    if MARKER_KEY in before and MARKER_KEY not in after:
        result.objects_lost += 1
        result.examples.append(f"the store's {MARKER_KEY} deleted")
    if MARKER_KEY in after:
        marked = json.loads(after[MARKER_KEY]).get("cluster_id")
        if marked != cluster_id:
            result.unmet += 1
            result.examples.append(f"the store's {MARKER_KEY} names cluster {marked}, not its own {cluster_id}")


def _check_outputs(produced: dict[int, dict[int, Sent]], before: set[str], store_dir: Path, result: CaseResult,
                   sent: dict[str, Sent] | None = None) -> None:
    """Every row of every new data file, committed or not, against the records produced: the values are unique,
    so each row names its record, which must be of the section's partition, and a section's rows must keep one
    distance between offset and delta. A record `sent` but never acknowledged (its produce refused, the L0 file
    it wrote left for gc) has no offset: only its key, timestamp and partition are checked."""
    store = LocalStore(store_dir)
    by_value: dict[str, tuple[int | None, Sent]] = {value: (None, record) for value, record in (sent or {}).items()}
    by_value.update({r.value: (offset, r) for partition in produced.values() for offset, r in partition.items() if r.value})
    for path in sorted((store_dir / "data").rglob("*.seg")):
        key = path.relative_to(store_dir).as_posix()
        if key in before:
            continue
        try:
            footer = read_footer(store, key)
            sections = [read_section(store, key, info) for info in footer.sections]
        except LogcompactError as exc:
            result.corrupt_rows += 1
            result.output_rows += 1
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
                if found is None or (found[1].key, found[1].timestamp, found[1].partition) != (key_text, row["timestamp"], section.info.partition):
                    result.corrupt_rows += 1
                    result.output_rows += 1
                    result.examples.append(f"output {key}: row {row} of partition {section.info.partition} was never produced there")
                    continue
                if found[0] is not None:
                    first_offsets.add(found[0] - row["offset_delta"])
            if len(first_offsets) > 1:
                result.corrupt_rows += 1
                result.output_rows += 1
                result.examples.append(f"output {key}: section {section.info.topic}/{section.info.partition} moves records between offsets")


# -- the campaign --------------------------------------------------------------------------------------------


def all_cases(base: BaseStore, flips: int, seed: int, levels: tuple[str, ...] = ("L0", "L1")) -> list[Case | ClusterCase]:
    return [*targeted_cases(base, levels), *catalog_check_cases(base, levels), *wrong_catalog_cases(base), *random_flip_cases(base, flips, seed)]


def run_corruption_campaign(directory: Path, partitions: int, flips: int, seed: int, levels: tuple[str, ...] = ("L0", "L1"),
                            echo: Callable[[str], None] = print, select: Callable[[Case | ClusterCase], bool] | None = None,
                            base: BaseStore | None = None, keep: bool = False) -> list[CaseResult]:
    """Every case (or those `select` keeps) on a fresh copy of the base store (built here unless given), the other
    cluster built when a case needs it; each case's directory removed after it unless `keep`."""
    base = base or build_store(directory / "base", partitions, seed)
    cases = [case for case in all_cases(base, flips, seed, levels) if select is None or select(case)]
    other = None
    if any(isinstance(case, ClusterCase) and case.other for case in cases):
        # Another cluster with the same topic and partitions, an L1 and an L0 file of its own.
        other = build_store(directory / "other", base.spec.partitions, seed + 1, rounds=1, trailing=1, tag="o")
    results = []
    for number, case in enumerate(cases):
        where = directory / f"case{number:03d}"
        where.mkdir(parents=True)
        result = run_cluster_case(base, other, case, where, number) if isinstance(case, ClusterCase) else run_case(base, case, where)
        if not keep:
            shutil.rmtree(where)
        results.append(result)
        counts = " ".join(f"{name.replace('_', ' ')} {getattr(result, name)}" for name in COUNTS if getattr(result, name))
        echo(f"{case.kind:13} | {case.name:60} | {counts or 'clean'}" + (f" | {result.first_error[:160]}" if result.first_error else ""))
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


def targets(results: list[CaseResult]) -> dict[str, int]:
    """The targets, each to be 0: lost (objects of the store, latest values a consume that exited 0 did not
    show), silent wrong reads (records a consume that exited 0 showed where they were not produced, twice or
    resurrected; offsets given out twice), tracebacks, leaked seals."""
    return {
        "lost": sum(r.objects_lost + r.silent_losses for r in results),
        "silent wrong reads": sum(r.wrong_reads for r in results),
        "tracebacks": sum(r.tracebacks for r in results),
        "leaked seals": sum(r.leaked_seals for r in results),
    }


def _target_line(what: str, found: dict[str, int]) -> str:
    return (f"targets ({what}): " + ", ".join(f"0 {name}" for name in found) + " | found: "
            + ", ".join(f"{value} {name}" for name, value in found.items()) + (" | met" if not any(found.values()) else " | NOT met"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=40, help="partitions of the topic (every file holds each)")
    parser.add_argument("--flips", type=int, default=40, help="random byte flips over data files")
    parser.add_argument("--seed", type=int, default=None, help="seed of the store and the flips (printed)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the stores go, every case's kept after it (caseNNN/); a temporary directory otherwise")
    parser.add_argument("--only", action="append", default=None, metavar="CLASS",
                        help="run only the cases of this class (file part, whole file, catalog row, catalog check, wrong catalog, "
                             "random flip); repeatable")
    parser.add_argument("--name", action="append", default=None, metavar="TEXT", help="run only the cases whose name holds TEXT; repeatable")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"corruption campaign: {args.partitions} partitions, {args.flips} random flips, seed {seed}", flush=True)

    def select(case: Case | ClusterCase) -> bool:
        return (not args.only or case.kind in args.only) and (not args.name or any(text in case.name for text in args.name))

    with tempfile.TemporaryDirectory(prefix="corruption-campaign-") as scratch:
        results = run_corruption_campaign(args.dir or Path(scratch), args.partitions, args.flips, seed,
                                          echo=lambda line: print(line, flush=True), select=select, keep=args.dir is not None)
    print()
    widths = {name: max(6, len(name)) for name in COUNTS}
    print(f"{'class':13} {'cases':>5} " + " ".join(f"{name.replace('_', ' '):>{widths[name]}}" for name in COUNTS))
    for kind, row in totals(results).items():
        print(f"{kind:13} {row['cases']:>5} " + " ".join(f"{row[name]:>{widths[name]}}" for name in COUNTS))
    total = totals(results)["total"]
    print(_target_line("damaged data", {name.replace("_", " "): total[name] for name in ("tracebacks", "corrupt_rows", "silent_losses")}))
    print(_target_line("catalog checks and wrong catalogs", targets(results)))
    print(f"and: {total['unmet']} unmet expectations, {total['multiline_errors']} multi-line errors (both to be 0)")


if __name__ == "__main__":
    main()
