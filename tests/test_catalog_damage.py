"""Damage and outages: secrets never printed, damaged catalog rows and objects as one-line errors of one
type per cause, the catalog database going away under a reader or a commit, and a run's plans that fail apart.

* every catalog URL a command is given, parsed or not, is printed with its password masked: a planted password is
  looked for in every output of the bad-input suite's catalog cases and of a generated set of bad URLs;
* a section row whose record count is 0, whose offsets were shifted over another section's, or whose partition was
  relabelled is a CorruptDataError naming the row, never an IndexError or records shown twice; an object replaced
  by a directory is no object (ObjectNotFoundError) on every read path of a local store;
* a section row's crc32 is bound to its locating fields: two rows of one file swapped by partition (same offsets),
  a row shifted onto offsets outside a compaction's plan, a row changed in any one of those fields, are refused
  where their blocks are read (consume in one line; a compaction sets the partition aside, copying nothing of it);
  a schema-3 catalog (raw CRCs) is refused until `logcompact cluster upgrade-catalog` binds them, on each database;
* a snapshot whose database goes away (a real PostgreSQL database closed to connections, a SQLite file replaced
  by garbage) raises CatalogUnavailableError naming the catalog, its password masked;
* `commit_plans` commits every plan it can and raises the others' failures together, whatever their type;
* a compaction whose database goes away during its commit exits 1 with the commit's error, logs that it could not
  release its plan, records the plan as abandoned in the store, and `release_abandoned` frees its files once the
  database is back (without it, the next compaction would find every file leased for the lease's hour and do
  nothing, with exit 0: what the campaign saw).
"""

from __future__ import annotations

import json
import logging
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from lab.servers.postgres import PostgresServer
from logcompact.catalog import Catalog, NewFile, appends, schema
from logcompact.catalog import files as catalog_files
from logcompact.catalog.database import catalog_errors, redact_url
from logcompact.catalog.groups import CommittedOffset, GroupRow, StoredMember
from logcompact.catalog.model import CatalogUpgrade
from logcompact.consume import latest_values, read_records
from logcompact.exceptions import (
    CatalogSchemaError,
    CatalogUnavailableError,
    CommitConflictError,
    CorruptDataError,
    IngestError,
    InvalidPlanError,
    ObjectNotFoundError,
    PlansNotCommittedError,
    StoreError,
)
from logcompact.format import read_section
from logcompact.format.layout import SectionInfo
from logcompact.ingest import PRODUCE_SCHEMA, Agent, Record
from logcompact.jobs import commit_plans, prepare_plans, release_abandoned, run_group, run_here
from logcompact.jobs.explain import explain_run
from logcompact.kafka.records import GZIP, ZSTD
from logcompact.keys import abandoned_key, group_key
from logcompact.planner import PlannerConfig
from logcompact.plans import read_header
from logcompact.plans.documents import abandoned_plans
from logcompact.store import LocalStore
from logcompact.units import wall_clock_ms
from tests.helpers import BOUND, NOW, assert_summaries_kept, create_topic, damage_section, produce_l0_files, section_column_rows
from tests.support.cli_cases import CATALOG, CATALOG_COMMANDS, GOOD_LINE, Outcome, run_in_process, run_process

PLANTED = "s3cr3tPLANTED"
CONFIG = PlannerConfig(min_files=(4, 4, 4, 4))


# -- 1. secrets never printed -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:5432/db",
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:port/db",  # a port that is not a number: does not parse
        f"postgresql+psycopg://u:{PLANTED}@[::1/db",  # an unclosed IPv6 address
        f"postgresql+psycopg://u:{PLANTED}@[::1]:5432/db",
        f"postgresql+psycopg://u:x@{PLANTED}@127.0.0.1/db",  # an unquoted '@' in the password
        f"postgresql+psycopg://u:{PLANTED}@host/db@x",
        f"postgresql+psycopg://u:ab/{PLANTED}@127.0.0.1/db",  # an unquoted '/'
        f"postgresql+psycopg://u:{PLANTED}",  # no host: what follows the colon may be a password
        f"postgresql+psycopg://:{PLANTED}@127.0.0.1/db",
        f"postgresql+psycopg://u@x:{PLANTED}@127.0.0.1/db",
        f"postgresql+psycopg://u:p%40{PLANTED}@127.0.0.1/db",
        f"postgresql+psycopg://u@127.0.0.1/db?password={PLANTED}",
        f"postgresql+psycopg://u@127.0.0.1/db?sslmode=require&PASSWORD={PLANTED}",
        f"mysql://u:{PLANTED}@h/d",
        f"sqlite://u:{PLANTED}@/x.db",
        f"host=127.0.0.1 password={PLANTED} dbname=x",
    ],
)
def test_redact_url_masks_the_password_of_any_url(url: str) -> None:
    shown = redact_url(url)
    assert PLANTED not in shown and "***" in shown
    assert redact_url(shown) == shown  # masking a masked URL changes nothing


def test_redact_url_leaves_a_url_without_password_as_it_is() -> None:
    for url in ("sqlite:////var/lib/logcompact/catalog.db", "postgresql+psycopg://u@127.0.0.1:5432/db", "postgresql+psycopg://h/db"):
        assert redact_url(url) == url
    assert redact_url(make_url(f"postgresql+psycopg://u:{PLANTED}@h/db")) == "postgresql+psycopg://u:***@h/db"


def _planted_urls(postgres_port: int, empty_database: str) -> list[str]:
    """Bad catalog URLs with the planted password, each failing in its own place: the URL's parse, its driver, the
    connection, the database, the cluster."""
    return [
        "not-a-url",
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:1/catalog",  # refused
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:port/db",
        f"postgresql+psycopg://u:{PLANTED}@[::1/db",
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:99999/db",
        f"postgresql+psycopg://u:{PLANTED}",
        f"postgresql+psycopg://u:{PLANTED}@no-such-host.invalid/db",
        f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:1/db?sslmode=bogus",
        f"postgresql+psycopg://u@127.0.0.1:1/db?password={PLANTED}",  # SQLAlchemy's rendering keeps it
        f"postgresql+psycopg://u:x@{PLANTED}@127.0.0.1:1/db",  # an unquoted '@': the driver names the "host"
        f"postgresql://u:{PLANTED}@127.0.0.1:1/db",  # psycopg2, the dialect's default driver
        f"postgresql+psycopg2://u:{PLANTED}@127.0.0.1:1/db",
        f"mysql://u:{PLANTED}@127.0.0.1/db",
        f"sqlite://u:{PLANTED}@",
        f"postgresql+psycopg://postgres:{PLANTED}@127.0.0.1:{postgres_port}/no_such_database",  # the server answers
        f"postgresql+psycopg://postgres:{PLANTED}@127.0.0.1:{postgres_port}/{empty_database}",  # no cluster (topic create makes one)
    ]


@pytest.fixture(scope="module")
def bad_input_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small cluster (`store/`) and the bad-input suite's other paths: a plain file, an empty directory."""
    work = tmp_path_factory.mktemp("planted")
    base = ["--store", f"file://{work}/store", "--now", str(NOW)]
    for argv, stdin in [
        (["topic", "create", "accounts", "--partitions", "2", "--config", "cleanup.policy=compact"], b""),
        (["produce", "accounts"], GOOD_LINE),
    ]:
        done = run_in_process(base + argv, stdin)
        assert done.code == 0, done.stderr
    (work / "a-file").write_text("not a store, a catalog or a plan\n")
    (work / "empty").mkdir()
    return work


def _plant(text: str) -> str:
    """A URL of the bad-input suite with the planted password in it (its own, or one added); not a SQLite file's."""
    if "://" not in text or text.startswith("sqlite:///"):
        return text
    scheme, _, rest = text.partition("://")
    netloc_end = min([rest.index(c) for c in "/?" if c in rest] or [len(rest)])
    netloc = rest[:netloc_end]
    if "@" in netloc:
        user = netloc.split("@", 1)[0].split(":", 1)[0]
        netloc = f"{user}:{PLANTED}@{netloc.split('@', 1)[1]}"
    else:
        netloc = f"u:{PLANTED}@{netloc}"
    return f"{scheme}://{netloc}{rest[netloc_end:]}"


def _leaks(outcome: Outcome) -> list[str]:
    problems = []
    if PLANTED in outcome.stdout or PLANTED in outcome.stderr:
        problems.append("the password is printed")
    if "Traceback" in outcome.stderr:
        problems.append("a traceback")
    return problems


def test_no_output_of_a_bad_catalog_holds_its_password(
    bad_input_work: Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command of the bad-input suite's damaged-catalog table, given each planted URL through --catalog and
    through LOGCOMPACT_CATALOG (a few with -v, a few as real processes), and the suite's own catalog cases with the
    password planted in their URLs: the password is in no stdout or stderr, and nothing is a traceback."""
    for name in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG", "LOGCOMPACT_NOW_MS"):
        monkeypatch.delenv(name, raising=False)
    work = bad_input_work
    base = ["--store", f"file://{work}/store", "--now", str(NOW)]
    runs: list[tuple[str, list[str], dict[str, str], bool]] = []  # (name, argv, env, as a process)
    commands = [*CATALOG_COMMANDS, ["status"], ["uncleanable", "list"]]
    empty = postgres.create_database()
    urls = _planted_urls(postgres.port, make_url(empty).database or "")
    for url in urls:
        for command in commands:
            runs.append((f"--catalog {url} {command[0]}", [*base, "--catalog", url, *command], {}, False))
            runs.append((f"env {url} {command[0]}", [*base, *command], {"LOGCOMPACT_CATALOG": url}, False))
        runs.append((f"-v {url}", [*base, "-v", "--catalog", url, "compact", "--all"], {}, False))
    for url in urls[1:4]:
        runs.append((f"process {url}", [*base, "--catalog", url, "files"], {}, True))
    for case in CATALOG:
        argv = [_plant(arg.replace("{work}", str(work))) for arg in case.argv]
        env = {name: _plant(value) for name, value in case.env.items()}
        runs.append((f"bad-input case {case.name}", [*base, *argv], env, case.process))
    planted = sum(PLANTED in " ".join([*argv, *env.values()]) for _, argv, env, _ in runs)
    assert planted >= 0.9 * len(runs), (planted, len(runs))
    missed = []
    exits = set()
    for name, argv, env, as_process in runs:
        stdin = GOOD_LINE if "produce" in argv else b""
        outcome = (run_process if as_process else run_in_process)(argv, stdin, env)
        exits.add(outcome.code)
        problems = _leaks(outcome)
        if problems:
            missed.append(f"{name}: {'; '.join(problems)}: {outcome.stderr.strip().splitlines()[-1:]}")
    postgres.drop_database(empty)
    print(f"\nplanted password: {len(runs)} runs, exit codes {sorted(exits)}, {len(missed)} leaks")
    assert not missed, "\n".join(missed)


def test_no_output_of_a_catalog_without_a_cluster_holds_a_query_password(
    bad_input_work: Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOGCOMPACT_CATALOG", raising=False)
    empty = postgres.create_database()
    url = f"{empty}?password={PLANTED}"
    try:
        outcome = run_in_process(["--store", f"file://{bad_input_work}/store", "--catalog", url, "files"])
    finally:
        postgres.drop_database(empty)
    assert outcome.code == 1 and "no logcompact cluster in" in outcome.stderr
    assert not _leaks(outcome), outcome.stderr


# -- 2. damaged rows and objects -------------------------------------------------------------------------------------


def _produce(catalog: Catalog, topic: str, records: list[Record]) -> None:
    with Agent(catalog, background=False, clock=lambda: NOW) as agent:
        agent.produce(topic, records)
        agent.flush()


@pytest.fixture
def two_partitions(tmp_path: Path) -> Catalog:
    """A SQLite cluster made by the CLI's library: topic `t` of 2 partitions, three files of 4 records per
    partition (offsets 0-3, 4-7, 8-11 in each), then a file of partition 0 alone (offsets 12-14)."""
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=3, records=8, keys=6, partitions=2)
    _produce(catalog, "t", [Record(0, b"k%d" % i, b"alone", NOW) for i in range(3)])
    return catalog


def _key_at(catalog: Catalog, partition: int, first_offset: int) -> str:
    """The file holding the section of `t`'s partition that starts at `first_offset`."""
    return next(key for key, section in catalog.snapshot().sections_of("t", partition) if section.first_offset == first_offset)


def _cli(catalog: Catalog, *argv: str) -> Outcome:
    return run_in_process(["--store", catalog.store.uri, "--now", str(NOW), *argv])


def _one_line_error(outcome: Outcome, *says: str) -> None:
    assert outcome.code == 1 and not outcome.stdout, outcome
    assert "Traceback" not in outcome.stderr and len(outcome.stderr.splitlines()) == 1, outcome.stderr
    assert outcome.stderr.startswith("logcompact: error: "), outcome.stderr
    for fragment in says:
        assert fragment in outcome.stderr, (fragment, outcome.stderr)


def test_a_section_row_of_no_records_is_corrupt_data_not_an_index_error(two_partitions: Catalog) -> None:
    catalog = two_partitions
    key = damage_section(catalog, _key_at(catalog, 0, 4), 0, record_count=0)
    for read in (
        lambda: list(read_records(catalog.store, catalog.snapshot(), "t", 0)),
        lambda: latest_values(catalog.store, catalog.snapshot(), "t", 0),
        lambda: catalog.snapshot().sections_of("t", 0),
    ):
        with pytest.raises(CorruptDataError, match=f"section t/0 of {key} \\(offsets 4 to 7, 0 record\\(s\\)\\) is damaged") as raised:
            read()
        assert raised.value.key == key
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "0"), key, "restore the catalog database from a backup")
    assert [r.offset for r in read_records(catalog.store, catalog.snapshot(), "t", 1)] == list(range(12))  # the other is fine


@pytest.mark.parametrize("column", ["first_offset", "uncompressed_bytes"])
def test_a_section_row_holding_no_integer_is_corrupt_data_for_a_planning_pass(two_partitions: Catalog, column: str) -> None:
    """A planning pass reads the sections' columns of files without a pack (PostgreSQL's appends) as the database
    aggregates them (`Snapshot.section_columns`): a value SQLite kept as text is named, not parsed as a number or
    passed over."""
    catalog = two_partitions
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE files SET sections_packed = NULL")
        connection.exec_driver_sql(f"UPDATE sections SET {column} = 'many' WHERE partition = 1")
    with pytest.raises(CorruptDataError, match=f"sections.{column} that is not a 64-bit integer .*restore the catalog database from a backup"):
        catalog.snapshot().section_columns()
    _one_line_error(_cli(catalog, "plan", "--mode", "full"), "not a 64-bit integer")


def test_a_files_row_holding_no_integer_is_corrupt_data_for_a_planning_pass(two_partitions: Catalog) -> None:
    """A planning pass reads the files' columns row by row: a size SQLite kept as text is named, not parsed."""
    catalog = two_partitions
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE files SET size = 'many' WHERE file_id = (SELECT min(file_id) FROM files)")
    with pytest.raises(CorruptDataError, match="files.size that is not a 64-bit integer; restore the catalog database from a backup"):
        catalog.snapshot().section_columns()
    _one_line_error(_cli(catalog, "plan", "--mode", "full"), "not a 64-bit integer")


def _planned_sections(catalog: Catalog) -> list[tuple]:
    """What a planning pass reads of every live file's sections (`Snapshot.section_columns`)."""
    return section_column_rows(catalog.snapshot().section_columns())


@pytest.mark.parametrize("damage", ["cut short", "a text", "a number"])
def test_a_damaged_pack_is_said_and_the_pass_plans_from_the_rows(two_partitions: Catalog, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A planning pass reads each file's sections from its row's pack (`files.sections_packed`), which only stands in
    for its sections rows: a pack not holding whole sections, or holding no bytes at all (SQLite keeps what it is
    given), is named by its file in the log, and the pass plans from the rows, never from other sections' values."""
    catalog = two_partitions
    expected = _planned_sections(catalog)
    value = {"cut short": "substr(sections_packed, 1, 44)", "a text": "'many'", "a number": "7"}[damage]
    with catalog.engine.begin() as connection:
        file_id = connection.exec_driver_sql("SELECT min(file_id) FROM files").scalar_one()  # two sections: 80 bytes
        connection.exec_driver_sql(f"UPDATE files SET sections_packed = {value} WHERE file_id = {file_id}")
    assert _planned_sections(catalog) == expected
    says = {"cut short": "holds 44 bytes in sections_packed, not whole sections of 40", "a text": "holds str 'many' in sections_packed",
            "a number": "holds int '7' in sections_packed"}[damage]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"planning from the catalog's sections rows: the files row of file_id {file_id} {says}"
                      f"{', not packed sections' if damage != 'cut short' else ''}; restore the catalog database from a backup"], warned
    planned = _cli(catalog, "plan", "--mode", "full")
    assert planned.code == 0 and planned.stdout and "Traceback" not in planned.stderr, planned


def test_packs_traded_between_files_are_not_trusted(two_partitions: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """Two files' packs swapped (each file's sections then hold the other's offsets): as many sections, each of the same
    topic and partitions, the same offsets in all; the sum of the rows' hash still differs from the packs', so the pass
    plans from the rows and says so."""
    catalog = two_partitions
    expected = _planned_sections(catalog)
    with catalog.engine.begin() as connection:
        first, second = connection.exec_driver_sql("SELECT file_id FROM files ORDER BY file_id LIMIT 2").scalars().all()
        connection.exec_driver_sql(
            f"UPDATE files SET sections_packed = (SELECT sections_packed FROM files AS other WHERE other.file_id = {first + second} - files.file_id) "
            f"WHERE file_id IN ({first}, {second})"
        )
    assert _planned_sections(catalog) == expected
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("the catalog's sections rows of live files disagree with the sections packed"), warned


@pytest.mark.parametrize("damage", ["shifted over its neighbour", "shifted past the next offset", "more records than offsets",
                                    "ends before it starts"])
def test_a_shifted_section_row_is_corrupt_data_not_records_shown_twice(two_partitions: Catalog, damage: str) -> None:
    catalog = two_partitions
    values = {
        "shifted over its neighbour": {"first_offset": 2, "last_offset": 5},  # 4-7 moved over 0-3
        "shifted past the next offset": {"first_offset": 14, "last_offset": 17},  # beyond what was given out (15)
        "more records than offsets": {"record_count": 5},
        "ends before it starts": {"first_offset": 7, "last_offset": 4},
    }[damage]
    key = damage_section(catalog, _key_at(catalog, 0, 4), 0, **values)
    with pytest.raises(CorruptDataError, match=f"catalog row of section t/0 of {key}"):
        catalog.snapshot().sections_of("t", 0)
    with pytest.raises(CorruptDataError, match="restore the catalog database from a backup"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "0"), key, "is damaged")


def test_a_relabelled_section_row_is_corrupt_data_not_records_under_another_partition(two_partitions: Catalog) -> None:
    """The last file holds partition 0 alone: relabelled as partition 1, its offsets 12-14 lie past partition 1's
    next offset (12); relabelled back over partition 1's own offsets, they would show offsets twice."""
    catalog = two_partitions
    key = damage_section(catalog, _key_at(catalog, 0, 12), 0, partition=1)
    with pytest.raises(CorruptDataError, match=f"section t/1 of {key} .* ends past the partition's next offset 12"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 1))
    damage_section(catalog, key, 1, first_offset=8, last_offset=10)
    with pytest.raises(CorruptDataError, match=f"section t/1 of {key} \\(offsets 8 to 10, 3 record\\(s\\)\\) is damaged: it overlaps"):
        latest_values(catalog.store, catalog.snapshot(), "t", 1)
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "1"), key, "so an offset would be shown twice")


def test_an_offset_in_two_overlapping_sections_is_corrupt_data(tmp_path: Path) -> None:
    """A shifted row over a compacted section with holes may hold no more records than the offsets they span
    together, and pass the rows' check; the merge by offset finds the offsets held twice."""
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", cleanup_policy="compact")
    _produce(catalog, "t", [Record(0, b"k%d" % i, b"first", NOW) for i in range(10)])
    _produce(catalog, "t", [Record(0, b"k%d" % i, b"second", NOW) for i in range(1, 10, 2)])
    prepared = prepare_plans(catalog, "full", NOW, PlannerConfig())
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    ((swept, section),) = catalog.snapshot().sections_of("t", 0)
    assert (section.first_offset, section.last_offset, section.info.record_count) == (0, 14, 10)  # holes at 1, 3, 5, 7, 9
    _produce(catalog, "t", [Record(0, b"n%d" % i, b"new", NOW) for i in range(3)])  # offsets 15 to 17
    # Shifted with its crc32 bound again (else its first block's CRC refuses it first, as the next test shows).
    key = damage_section(catalog, _key_at(catalog, 0, 15), 0, rebind=True, first_offset=2, last_offset=4)
    with pytest.raises(CorruptDataError, match=f"place offset 2 in {swept} \\(offsets 0 to 14\\) and {key} \\(offsets 2 to 4\\)"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "0"), "an offset is never in two live sections")
    # As a damaged database holds it, the shift is refused where the row's first block is read.
    damage_section(catalog, key, 0, rebind=True, first_offset=15, last_offset=17)
    assert [r.offset for r in read_records(catalog.store, catalog.snapshot(), "t", 0)][-3:] == [15, 16, 17]
    damage_section(catalog, key, 0, first_offset=2, last_offset=4)
    with pytest.raises(CorruptDataError, match=f"{key}: section t/0 at byte \\d+: .* the catalog's row of the section was changed"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))


def test_sections_whose_ranges_overlap_legitimately_still_read(two_partitions: Catalog) -> None:
    """The rows' check passes a partition whose sections' ranges overlap without sharing an offset."""
    from logcompact.catalog.snapshot import check_partition_sections

    catalog = two_partitions
    (key, first), (other, second), *_ = catalog.snapshot().sections_of("t", 0)
    spanning = first._replace(info=first.info._replace(last_delta=7, record_count=4))  # 0-7 with a hole at 4-7
    check_partition_sections("t", 0, [(key, spanning), (other, second)], next_offset=15)
    with pytest.raises(CorruptDataError, match="9 records in offsets 0 to 7"):
        check_partition_sections("t", 0, [(key, spanning._replace(info=spanning.info._replace(record_count=5))), (other, second)])


def _cli_of(catalog: Catalog, *argv: str, stdin: bytes = b"", now: int = NOW) -> Outcome:
    """The CLI pointed at `catalog`'s store and database (SQLite or PostgreSQL)."""
    return run_in_process(["--store", catalog.store.uri, "--catalog", catalog.url, "--now", str(now), *argv], stdin)


def _state(catalog: Catalog) -> tuple:
    """What an append changes: the version, the files, the partitions' rows."""
    part = schema.partitions.c
    with catalog.engine.connect() as connection:
        files = connection.execute(select(schema.files.c.key).order_by(schema.files.c.file_id)).scalars().all()
        rows = connection.execute(select(schema.partitions).order_by(part.topic_id, part.partition)).all()
    return catalog.latest_version(), files, rows


def test_an_append_refuses_offsets_a_section_row_relabelled_from_another_partition_claims(catalog: Catalog) -> None:
    """On each database: the newest file holds partition 0 alone, offsets 12 to 14; its row relabelled as partition
    1's claims offsets partition 1 has not given out yet (its next offset is 12). A produce to partition 1 alone is
    refused in one line naming that row, committing nothing (it handed offsets 12 and 13 out again, a second record
    at each); an L1 row shifted onto the next offsets is refused alike. The rows put back, the produce goes on."""
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=3, records=8, keys=6, partitions=2)  # offsets 0 to 11 of each partition
    _produce(catalog, "t", [Record(0, b"k%d" % i, b"alone", NOW) for i in range(3)])  # partition 0's 12 to 14
    relabelled = _key_at(catalog, 0, 12)
    damage_section(catalog, relabelled, 0, partition=1)
    before = _state(catalog)
    with pytest.raises(IngestError, match=f"catalog row of section t/1 of {relabelled} \\(offsets 12 to 14, 3 record\\(s\\)\\) is "
                                          "damaged: it claims offsets from the partition's next offset 12 on"):
        _produce(catalog, "t", [Record(1, b"new", b"again", NOW)])
    outcome = _cli_of(catalog, "produce", "t", stdin=b'{"partition": 1, "key": "new", "value": "again"}\n')
    assert outcome.code == 1 and "Traceback" not in outcome.stderr and len(outcome.stderr.splitlines()) == 1, outcome
    assert relabelled in outcome.stderr and "nothing was written" in outcome.stderr, outcome.stderr
    assert _state(catalog) == before
    damage_section(catalog, relabelled, 1, partition=0)  # put back
    _produce(catalog, "t", [Record(1, b"new", b"once", NOW)])
    assert catalog.next_offsets("t") == [15, 13]

    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)  # the five L0 files copied to one L1 file
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    (l1,) = catalog.snapshot().files(level=1)
    damage_section(catalog, l1.key, 1, first_offset=10, last_offset=13)  # 0 to 12, shifted onto the next offset
    before = _state(catalog)
    with pytest.raises(IngestError, match=f"section t/1 of {l1.key} \\(offsets 10 to 13, .* next offset 13 on"):
        _produce(catalog, "t", [Record(1, b"new", b"again", NOW)])
    assert _state(catalog) == before
    _produce(catalog, "t", [Record(0, b"new", b"fine", NOW)])  # partition 0 is not claimed
    assert catalog.next_offsets("t") == [16, 13]


def _file_row(catalog: Catalog, key: str) -> dict:
    with catalog.engine.connect() as connection:
        return dict(connection.execute(select(schema.files).where(schema.files.c.key == key)).one()._mapping)


def _values(catalog: Catalog, partition: int = 0, now: int = NOW) -> list[str]:
    outcome = _cli_of(catalog, "consume", "t", "--partition", str(partition), now=now)
    assert outcome.code == 0, outcome
    return [json.loads(line)["value"] for line in outcome.stdout.splitlines()]


HIDING = ("files row deleted", "files row marked removed", "section retired alone", "section moved to another topic")


def _hide(catalog: Catalog, key: str, damage: str, now: int = NOW) -> tuple[dict, dict]:
    """Damage the rows of `key`'s file so that its section of t/0 is in no read of the partition (moved: to topic u);
    the files row and the section row as they were."""
    row = _file_row(catalog, key)
    sec, files = schema.sections.c, schema.files.c
    in_file = (sec.file_id == row["file_id"], sec.partition == 0)
    with catalog.engine.begin() as connection:
        section = dict(connection.execute(select(schema.sections).where(*in_file)).one()._mapping)
        if damage == "files row deleted":
            connection.execute(schema.files.delete().where(files.key == key))
        elif damage == "files row marked removed":
            connection.execute(update(schema.files).where(files.key == key).values(removed_version=catalog.latest_version(), removed_ms=now))
        elif damage == "section retired alone":
            connection.execute(update(schema.sections).where(*in_file).values(removed_version=catalog.latest_version()))
        else:
            connection.execute(update(schema.sections).where(*in_file).values(topic_id=catalog.snapshot().topic_ids["u"]))
    return row, section


def _hiding_says(damage: str, key: str, hidden: int) -> str:
    """What a reader and a compaction say of offset `hidden` of t/0, hidden by `damage` to `key`'s rows: a section
    retired alone is named as the damaged row; the other damages leave a hole in a partition never compacted."""
    if damage == "section retired alone":
        return (f"catalog row of section t/0 of {key} (offsets {hidden} to {hidden}, 1 record(s)) is damaged: it is marked retired "
                "at version")
    return f"catalog rows of partition t/0 hide offsets {hidden} to {hidden}: no live section holds them, yet the partition was never compacted"


@pytest.mark.parametrize("damage", HIDING)
@pytest.mark.parametrize("hidden", [0, 1])
def test_a_row_damaged_so_that_it_hides_records_of_a_partition_never_compacted_is_refused(catalog: Catalog, damage: str, hidden: int) -> None:
    """On each database: three files of partition 0 (offsets 0, 1, 2), the first's or the second's rows damaged in a
    way that leaves its section out of every read of the partition. Consume exited 0 without that record; now it is
    refused in one line naming the offsets hidden, by the library's readers too; a compaction sets the partition
    aside as uncleanable before it leases anything, and changes no file. Put back, the rows read whole."""
    create_topic(catalog, "t", partitions=1, cleanup_policy="compact")
    create_topic(catalog, "u", partitions=1, cleanup_policy="compact")
    for value in (b"1", b"2", b"3"):
        _produce(catalog, "t", [Record(0, b"k" + value, value, NOW)])
    key = _key_at(catalog, 0, hidden)
    row, section = _hide(catalog, key, damage)
    sec, files = schema.sections.c, schema.files.c
    says = _hiding_says(damage, key, hidden)
    _one_line_error(_cli_of(catalog, "consume", "t", "--partition", "0"), says, "restore the catalog database from a backup")
    for read in (lambda: list(read_records(catalog.store, catalog.snapshot(), "t", 0)), lambda: latest_values(catalog.store, catalog.snapshot(), "t", 0)):
        with pytest.raises(CorruptDataError, match=re.escape(says)):
            read()
    assert [r.value for r in read_records(catalog.store, catalog.snapshot(), "t", 0, from_offset=hidden + 1)] == [b"1", b"2", b"3"][hidden + 1:]
    # Compacted, the partition would hold its records without them, and gc would collect their file.
    before = _state(catalog)
    outcome = _cli_of(catalog, "compact", "--full")
    assert outcome.code == 0 and "Traceback" not in outcome.stderr, outcome
    marks = {(m.topic, m.partition): m for m in catalog.uncleanable()}
    assert says in marks[("t", 0)].reason and "restore the catalog database from a backup" in marks[("t", 0)].reason
    assert marks[("t", 0)].file_key == (key if damage == "section retired alone" else ""), marks
    assert (("t", 0) in catalog.held_uncleanable(NOW)) and not catalog.leased_plans(NOW)
    if damage != "section moved to another topic":  # (u/0 then holds t's record: its read fails, and u/0 is set aside)
        assert _state(catalog) == before and list(marks) == [("t", 0)]
    with catalog.engine.begin() as connection:  # put back, as a restored catalog holds them
        connection.execute(schema.files.delete().where(files.file_id == row["file_id"]))
        connection.execute(schema.files.insert().values(**row))
        connection.execute(schema.sections.delete().where(sec.file_id == row["file_id"]))
        connection.execute(schema.sections.insert().values(**section))
    assert _values(catalog) == ["1", "2", "3"]


def test_a_partition_whose_every_record_a_compaction_dropped_reads_on_and_compacts(catalog: Catalog) -> None:
    """On each database: keyless records of a topic made compacted, all dropped by `compact --full`, which wrote no
    section above L0; a keyed record produced after. The partition read as never compacted: its consume was refused
    as hiding offsets 0 to 1, and the next compaction set it aside as uncleanable. Now the compaction that dropped
    them gave the partition its (empty) summary row: consume reads the record and the next compaction compacts it."""
    now = wall_clock_ms()
    created = _cli_of(catalog, "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=delete", now=now)
    assert created.code == 0, created
    keyless = b'{"partition": 0, "value": "1"}\n{"partition": 0, "value": "2"}\n'
    assert _cli_of(catalog, "produce", "t", stdin=keyless, now=now).code == 0
    assert _cli_of(catalog, "topic", "alter", "t", "--config", "cleanup.policy=compact", now=now).code == 0
    dropped = _cli_of(catalog, "compact", "--full", now=now)
    assert dropped.code == 0 and json.loads(dropped.stdout)["records_out"] == 0, dropped
    assert catalog.snapshot().summaries_above_l0([("t", 0)]) == {("t", 0): None} and not catalog.snapshot().never_compacted(["t"])
    _produce_lines(catalog, now, (0, "a", "3"))
    assert _values(catalog, now=now) == ["3"]
    compacted = _cli_of(catalog, "compact", "--full", now=now)
    assert compacted.code == 0 and json.loads(compacted.stdout)["committed"], compacted
    assert catalog.uncleanable() == [] and _values(catalog, now=now) == ["3"]


def test_a_section_retired_alone_in_a_compacted_partition_is_refused_by_name_and_its_file_kept(catalog: Catalog) -> None:
    """On each database: t/0 and t/1 compacted once, then three files of both; the second file's section of t/0
    retired alone at an append's version (no compaction retired it). Holes are a compacted partition's own, so consume
    of t/0 exited 0 without offset 2, and `compact --full` dropped it and gc collected its file. Now readers refuse in
    one line naming the damaged row; a plan the user gives is refused; a compaction sets t/0 aside, and t/1 with it
    (compacting t/1 would remove the file), leases nothing, and gc keeps the object. Put back, every record reads."""
    now = wall_clock_ms()
    later = now + 2 * 3_600_000  # past the grace of every object
    assert _cli_of(catalog, "topic", "create", "t", "--partitions", "2", "--config", "cleanup.policy=compact", now=now).code == 0
    _produce_lines(catalog, now, (0, "k1", "1"), (1, "a", "1"))
    assert _cli_of(catalog, "compact", "--full", now=now).code == 0 and not catalog.snapshot().never_compacted(["t"])
    for value in ("2", "3", "4"):
        _produce_lines(catalog, now, (0, "k" + value, value), (1, "a", value))
    key = _key_at(catalog, 0, 2)
    sec = schema.sections.c
    in_file = (sec.file_id == _file_row(catalog, key)["file_id"], sec.partition == 0)
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.sections).where(*in_file).values(removed_version=catalog.latest_version()))
    stored = (catalog.store.root / key).read_bytes()
    says = _hiding_says("section retired alone", key, 2)

    _one_line_error(_cli_of(catalog, "consume", "t", "--partition", "0", now=now), says, "restore the catalog database from a backup")
    with pytest.raises(CorruptDataError, match=re.escape(says)):
        latest_values(catalog.store, catalog.snapshot(), "t", 0)
    assert [r.value for r in read_records(catalog.store, catalog.snapshot(), "t", 0, from_offset=3)] == [b"4"]
    planned = _cli_of(catalog, "plan", "--mode", "full", now=later)
    assert planned.code == 0 and planned.stdout, planned
    _one_line_error(_cli_of(catalog, "compact", "--plan", "-", stdin=planned.stdout.encode(), now=later), says, "nothing was leased")

    before = _state(catalog)
    compacted = _cli_of(catalog, "compact", "--full", now=later)
    assert compacted.code == 0 and "Traceback" not in compacted.stderr, compacted
    marked = {(m["topic"], m["partition"]): m for m in _uncleanable_list(catalog, later)[:-1]}
    assert sorted(marked) == [("t", 0), ("t", 1)] and {m["file_key"] for m in marked.values()} == {key}, marked
    assert marked[("t", 0)]["reason"].startswith(says), marked
    assert f"set aside with t/0: file {key} holds offsets 2 to 2 of it" in marked[("t", 1)]["reason"], marked
    assert _state(catalog) == before and not catalog.leased_plans(later)
    collected = _cli_of(catalog, "gc", "--grace-ms", "0", now=later + 1)
    assert "Traceback" not in collected.stderr and key not in json.loads(collected.stdout)["deleted_files"], collected
    assert (catalog.store.root / key).read_bytes() == stored
    with catalog.engine.begin() as connection:  # put back, as a restored catalog holds it
        connection.execute(update(schema.sections).where(*in_file).values(removed_version=None))
    assert _values(catalog, now=later + 1) == ["1", "2", "3", "4"] and _values(catalog, partition=1, now=later + 1) == ["1", "2", "3", "4"]


def _compacted_with_holes(catalog: Catalog, now: int) -> None:
    """t/0 compacted twice (keys overwritten, then a tombstone, the last record, removed), then three files of it:
    an L2 section at offset 1 (offset 0 dropped), offset 2 dropped, L0 sections at offsets 3, 4 and 5."""
    for name in ("t", "u"):
        created = _cli_of(catalog, "topic", "create", name, "--partitions", "2", "--config", "cleanup.policy=compact", "--config",
                          "delete.retention.ms=0", now=now)
        assert created.code == 0, created
    _produce_lines(catalog, now, (0, "a", "1"), (0, "b", "2"))
    _produce_lines(catalog, now, (0, "a", None))
    for _ in range(2):  # the second removes the tombstone the first stamped
        assert _cli_of(catalog, "compact", "--full", now=now).code == 0
    for value in ("3", "4", "5"):
        _produce_lines(catalog, now, (0, "k" + value, value))
    assert [(s.first_offset, s.last_offset) for _, s in catalog.snapshot().sections_of("t", 0)] == [(1, 1), (3, 3), (4, 4), (5, 5)]


MOVED = {"an L0 section between two others": 4, "the compacted section below them": 1}


@pytest.mark.parametrize("moved", MOVED)
@pytest.mark.parametrize("to", ["t/1", "u/0"])
def test_a_section_row_moved_out_of_a_compacted_partition_is_refused_and_its_file_kept(catalog: Catalog, moved: str, to: str) -> None:
    """On each database: t/0 compacted twice, holding offsets 1, 3, 4 and 5, every other one dropped by a compaction;
    then one of its section rows moved to another partition or topic. Undamaged, consume reads every record and the
    holes are taken for what they are. Holes are normal in a compacted partition, so consume of t/0 exited 0 without
    the moved record, and a compaction could span the gap. Now the offsets a compaction dropped are recorded
    (`offset_holes`): consume is refused in one line naming the offset hidden; a plan spanning it is refused, and
    `compact --full` sets t/0 aside; gc keeps the object. Put back, every record reads again."""
    now = wall_clock_ms()
    later = now + 2 * 3_600_000  # past the grace of every object
    _compacted_with_holes(catalog, now)
    assert _values(catalog, now=now) == ["2", "3", "4", "5"]
    assert_summaries_kept(catalog)
    hidden = MOVED[moved]
    key = _key_at(catalog, 0, hidden)
    sec = schema.sections.c
    in_file = (sec.file_id == _file_row(catalog, key)["file_id"], sec.topic_id == catalog.snapshot().topic_ids["t"], sec.partition == 0)
    topic, partition = to.split("/")
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.sections).where(*in_file).values(topic_id=catalog.snapshot().topic_ids[topic], partition=int(partition)))
    stored = (catalog.store.root / key).read_bytes()
    says = f"catalog rows of partition t/0 hide offsets {hidden} to {hidden}: no live section holds them, yet no compaction dropped them"

    _one_line_error(_cli_of(catalog, "consume", "t", "--partition", "0", now=now), says, "restore the catalog database from a backup")
    with pytest.raises(CorruptDataError, match=re.escape(says)):
        latest_values(catalog.store, catalog.snapshot(), "t", 0)
    if hidden == 4:  # a plan of t/0 spans the gap: its outputs would hide it from readers for good
        planned = _cli_of(catalog, "plan", "--mode", "full", now=later)
        assert planned.code == 0 and planned.stdout, planned
        _one_line_error(_cli_of(catalog, "compact", "--plan", "-", stdin=planned.stdout.encode(), now=later), says, "nothing was leased")
    compacted = _cli_of(catalog, "compact", "--full", now=later)
    assert compacted.code == 0 and "Traceback" not in compacted.stderr, compacted
    marked = {(m.topic, m.partition): m for m in catalog.uncleanable()}
    if hidden == 4:
        assert marked[("t", 0)].reason.startswith(says), marked
    collected = _cli_of(catalog, "gc", "--grace-ms", "0", now=later + 1)
    assert "Traceback" not in collected.stderr and key not in json.loads(collected.stdout)["deleted_files"], collected
    assert (catalog.store.root / key).read_bytes() == stored
    _one_line_error(_cli_of(catalog, "consume", "t", "--partition", "0", now=later + 1), says)
    with catalog.engine.begin() as connection:  # put back, as a restored catalog holds it
        connection.execute(update(schema.sections).where(sec.file_id == _file_row(catalog, key)["file_id"], sec.topic_id == catalog.snapshot().topic_ids[topic],
                                                         sec.partition == int(partition)).values(topic_id=catalog.snapshot().topic_ids["t"], partition=0))
    assert _values(catalog, now=later + 1) == ["2", "3", "4", "5"]


def _produce_lines(catalog: Catalog, now: int, *lines: tuple[int, str, str | None]) -> None:
    """One file of t holding the (partition, key, value) records."""
    stdin = b"".join(json.dumps({"partition": p, "key": k, "value": v}).encode() + b"\n" for p, k, v in lines)
    assert _cli_of(catalog, "produce", "t", stdin=stdin, now=now).code == 0


def _uncleanable_list(catalog: Catalog, now: int) -> list[dict]:
    outcome = _cli_of(catalog, "uncleanable", "list", now=now)
    assert outcome.code == 0, outcome
    return [json.loads(line) for line in outcome.stdout.splitlines()]


@pytest.mark.parametrize("damage", HIDING)
def test_a_partition_whose_rows_hide_offsets_is_set_aside_and_the_other_partitions_compact(
    catalog: Catalog, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On each database: t/0 in three files of its own (offsets 0, 1, 2), the second's rows damaged so that offset 1
    is hidden, t/1 in three files of one key. `compact --full` refused the whole run, so one damaged partition
    stopped all compaction; now it marks t/0 uncleanable (before leasing anything: a dry run only leaves it out),
    logs it, compacts t/1 and exits 0, as a run whose commit sets a partition aside does; a plan the user gives
    (`compact --plan`) is still refused in one line. gc then keeps the damaged
    file's object, and consume of t/0 is still refused in one line."""
    now = wall_clock_ms()
    later = now + 2 * 3_600_000  # past the grace of every object
    for name in ("t", "u"):
        assert _cli_of(catalog, "topic", "create", name, "--partitions", "2", "--config", "cleanup.policy=compact", now=now).code == 0
    for value in ("1", "2", "3"):
        _produce_lines(catalog, now, (0, "k" + value, value))
        _produce_lines(catalog, now, (1, "a", value))
    key = _key_at(catalog, 0, 1)
    _hide(catalog, key, damage, now)
    stored = (catalog.store.root / key).read_bytes()
    says = _hiding_says(damage, key, 1)

    planned = _cli_of(catalog, "plan", "--mode", "full", now=later)  # a plan the user runs is refused, as they chose it
    assert planned.code == 0 and planned.stdout, planned
    refused = _cli_of(catalog, "compact", "--plan", "-", stdin=planned.stdout.encode(), now=later)
    _one_line_error(refused, says, "compacting it would drop them", "nothing was leased")
    dry = prepare_plans(catalog, "full", later, dry_run=True)
    assert [(m.topic, m.partition) for m in dry.set_aside][:1] == [("t", 0)] and says in dry.set_aside[0].reason, dry
    assert len(dry.estimates) == 1 and not dry.plan_ids and catalog.uncleanable() == [] and not catalog.leased_plans(later)
    explained = explain_run("full", catalog.planning_snapshot(later), dry, later, PlannerConfig(), None, dry_run=True)
    assert f"dry run, would set aside as uncleanable (not planned): {dry.set_aside[0].reason}" in explained, explained

    caplog.clear()
    compacted = _cli_of(catalog, "compact", "--full", now=later)
    assert compacted.code == 0 and "Traceback" not in compacted.stderr, compacted
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # A section moved changed its row under its file's pack (`files.sections_packed`): planned from the rows, and said.
    unpacked = [message for message in warned if message.startswith("the catalog's sections rows of live files disagree")]
    warned = [message for message in warned if message not in unpacked]
    assert bool(unpacked) == (damage == "section moved to another topic"), unpacked
    # (moved to u/0 at offset 1, t/0's record also hides offset 0 of u/0, which is set aside as well)
    assert len(warned) == 1 + (damage == "section moved to another topic") and warned[0].startswith(f"set aside as uncleanable: {says}"), warned
    assert [json.loads(line)["committed"] for line in compacted.stdout.splitlines()] == [True], compacted.stdout
    assert _values(catalog, partition=1, now=later) == ["3"]
    listed = _uncleanable_list(catalog, later)
    marked = {(m["topic"], m["partition"]): m for m in listed[:-1]}
    assert says in marked[("t", 0)]["reason"] and marked[("t", 0)]["held"], listed
    assert marked[("t", 0)]["file_key"] == (key if damage == "section retired alone" else ""), listed
    assert ("t", 1) not in marked and listed[-1]["uncleanable_partitions_count"] == len(marked), listed

    collected = _cli_of(catalog, "gc", "--grace-ms", "0", now=later + 1)
    assert "Traceback" not in collected.stderr and len(collected.stderr.splitlines()) == collected.code, collected
    assert key not in json.loads(collected.stdout)["deleted_files"]
    assert (catalog.store.root / key).read_bytes() == stored
    _one_line_error(_cli_of(catalog, "consume", "t", "--partition", "0", now=later + 1), says)


def test_a_file_holding_hidden_records_stays_live_whole_when_its_partition_is_set_aside(catalog: Catalog) -> None:
    """On each database: three files each of t/0 and t/1, the second's section of t/0 retired alone (offset 1
    hidden). Compacting t/1 would remove that file, and gc would collect offset 1 with it: t/1 is set aside with
    t/0, its reason naming the file, nothing is leased or committed, and gc keeps the object."""
    now = wall_clock_ms()
    later = now + 2 * 3_600_000
    assert _cli_of(catalog, "topic", "create", "t", "--partitions", "2", "--config", "cleanup.policy=compact", now=now).code == 0
    for value in ("1", "2", "3"):
        _produce_lines(catalog, now, (0, "k" + value, value), (1, "a", value))
    key = _key_at(catalog, 0, 1)
    _hide(catalog, key, "section retired alone", now)
    before = _state(catalog)

    compacted = _cli_of(catalog, "compact", "--full", now=later)
    assert compacted.code == 0 and not compacted.stdout and "Traceback" not in compacted.stderr, compacted
    marked = {(m["topic"], m["partition"]): m for m in _uncleanable_list(catalog, later)[:-1]}
    assert sorted(marked) == [("t", 0), ("t", 1)] and {m["file_key"] for m in marked.values()} == {key}, marked
    assert marked[("t", 0)]["reason"].startswith(_hiding_says("section retired alone", key, 1)), marked
    assert f"set aside with t/0: file {key} holds offsets 1 to 1 of it" in marked[("t", 1)]["reason"], marked
    assert _state(catalog) == before and not catalog.leased_plans(later)
    collected = _cli_of(catalog, "gc", "--grace-ms", "0", now=later + 1)
    assert "Traceback" not in collected.stderr and key not in json.loads(collected.stdout)["deleted_files"], collected
    assert (catalog.store.root / key).exists() and _values(catalog, partition=1, now=later + 1) == ["1", "2", "3"]


@pytest.mark.parametrize("damage", ["files row deleted", "files row marked removed", "files row renamed to a collected file's key"])
def test_gc_never_deletes_the_object_of_a_file_whose_catalog_rows_lost_it(catalog: Catalog, damage: str) -> None:
    """On each database, issue 40's repro: two produces, the first file's files row damaged, a third produce, then
    `compact --full` and `gc --grace-ms 0` past every object's time. gc deleted the file's object (no row named it, or its row said
    removed): its records gone for good. Now gc keeps it and every object the catalog has no row for, exits 1 in one
    line naming the damaged row, and collects the rest; the row put back, every record reads again."""
    now = wall_clock_ms()
    later = now + 2 * 3_600_000  # past the grace of every object
    assert _cli_of(catalog, "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=compact", now=now).code == 0
    for key, value in (("a", "1"), ("b", "2")):
        assert _cli_of(catalog, "produce", "t", stdin=b'{"partition": 0, "key": "%s", "value": "%s"}\n' % (key.encode(), value.encode()), now=now).code == 0
    files = schema.files.c
    with catalog.engine.connect() as connection:  # a's file
        first = connection.execute(select(files.key).where(files.level == 0).order_by(files.file_id).limit(1)).scalar_one()
    row = _file_row(catalog, first)
    with catalog.engine.begin() as connection:
        if damage == "files row deleted":
            connection.execute(schema.files.delete().where(files.key == first))
        elif damage == "files row marked removed":
            # at the cluster's creation, out of the kept versions: as if removed long ago
            connection.execute(update(schema.files).where(files.key == first).values(removed_version=1, removed_ms=now))
        else:
            # the key of a file collected long ago: no object has it now
            connection.execute(update(schema.files).where(files.key == first).values(key=f"data/l0/{now - 86_400_000}-{'0' * 32}.seg"))
    stored = (catalog.store.root / first).read_bytes()

    assert _cli_of(catalog, "produce", "t", stdin=b'{"partition": 0, "key": "c", "value": "3"}\n', now=later).code == 0
    # Offset 0 is hidden (`Plan.hidden_offsets`): the partition is set aside as uncleanable; or the renamed row's
    # object is not in the store: refused.
    compacted = _cli_of(catalog, "compact", "--full", now=later)
    if damage == "files row renamed to a collected file's key":
        assert compacted.code == 1 and len(compacted.stderr.splitlines()) == 1, compacted
    else:
        assert compacted.code == 0 and [(m.topic, m.partition) for m in catalog.uncleanable()] == [("t", 0)], compacted
    outcome = _cli_of(catalog, "gc", "--grace-ms", "0", now=later + 1)
    assert outcome.code == 1 and len(outcome.stderr.splitlines()) == 1 and "Traceback" not in outcome.stderr, outcome
    assert "catalog rows are damaged" in outcome.stderr and "gc deleted no object they may name" in outcome.stderr, outcome.stderr
    report = json.loads(outcome.stdout)
    assert first not in report["deleted_files"] and (first in report["kept_orphans"]) == (damage != "files row marked removed"), report
    assert (catalog.store.root / first).read_bytes() == stored
    with catalog.engine.begin() as connection:  # the row put back, as a restored catalog holds it
        connection.execute(schema.files.delete().where(files.file_id == row["file_id"]))
        connection.execute(schema.files.insert().values(**row))
    assert _values(catalog, now=later) == ["1", "2", "3"]


# -- 2b. a section row's crc32 bound to the row: no row changed in a locating field reads as truth --------------------

CHANGED = "the catalog's row of the section was changed; restore the file from a copy or the catalog database from a backup"


def _file_id(catalog: Catalog, key: str) -> int:
    with catalog.engine.connect() as connection:
        return connection.execute(select(schema.files.c.file_id).where(schema.files.c.key == key)).scalar_one()


def _swap_partitions(catalog: Catalog, key: str, a: int, b: int) -> None:
    """The rows of a file's sections of partitions a and b relabelled as each other (the primary key allows it)."""
    sec = schema.sections.c
    file_id = _file_id(catalog, key)
    with catalog.engine.begin() as connection:
        for old, new in ((a, -1), (b, a), (-1, b)):
            assert connection.execute(update(schema.sections).where(sec.file_id == file_id, sec.partition == old).values(partition=new)).rowcount == 1


def _records_until_refused(catalog: Catalog, partition: int) -> tuple[list, CorruptDataError | None]:
    """What a reader of the partition is shown before it is refused, and the refusal (None: read whole)."""
    shown: list = []
    try:
        for record in read_records(catalog.store, catalog.snapshot(), "t", partition):
            shown.append(record)
    except CorruptDataError as refused:
        return shown, refused
    return shown, None


def test_two_sections_of_a_file_swapped_by_partition_are_refused_never_read_as_each_other(two_partitions: Catalog) -> None:
    """Both sections of the first file hold offsets 0 to 3 (in one block, so one first-block CRC): swapped, every check
    of offsets passes; bound to its row, each one's crc32 no longer matches the file. Consume of either partition is
    refused in one line with nothing of the other shown, and a compaction sets both aside: their data survive."""
    catalog = two_partitions
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in (0, 1)}
    # produce_l0_files puts key k<n> in partition n % 2 (the last file's, of values "alone", are partition 0's).
    assert all(int(r.key[1:]) % 2 == p for p in (0, 1) for r in before[p] if r.value != b"alone")
    key = _key_at(catalog, 0, 0)
    assert _key_at(catalog, 1, 0) == key
    _swap_partitions(catalog, key, 0, 1)
    for partition in (0, 1):
        shown, refused = _records_until_refused(catalog, partition)
        assert refused is not None and shown == [], (partition, shown)
        message = str(refused)
        assert message.startswith(f"{key}: section t/{partition} at byte ") and CHANGED in message and "\n" not in message
        with pytest.raises(CorruptDataError, match="the catalog's row of the section was changed"):
            latest_values(catalog.store, catalog.snapshot(), "t", partition)
        _one_line_error(_cli(catalog, "consume", "t", "--partition", str(partition)), key, CHANGED)

    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)
    assert prepared.plan_ids  # the four L0 files, the swapped one among them
    summary = run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    assert sorted((u["topic"], u["partition"]) for u in summary.uncleanable) == [("t", 0), ("t", 1)]
    assert all(u["reason"].startswith(f"{key}: section t/{u['partition']} at byte ") and "index CRC-32" in u["reason"]
               for u in summary.uncleanable)
    assert sorted((m.topic, m.partition, m.file_key) for m in catalog.uncleanable()) == [("t", 0, key), ("t", 1, key)]
    assert {f.level for f in catalog.snapshot().files()} == {0}  # nothing written over the damage, nothing removed
    for partition in (0, 1):
        _one_line_error(_cli(catalog, "consume", "t", "--partition", str(partition)), key, CHANGED)
    # The rows put back (as a restored catalog holds them), every record is where it was.
    _swap_partitions(catalog, key, 0, 1)
    assert {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in (0, 1)} == before


def test_a_section_row_shifted_onto_offsets_outside_its_plan_is_not_copied(tmp_path: Path) -> None:
    """A shifted row outside the plan: an L1 file holds offsets 0 to 11 of each partition; four newer L0 files 12 to 27. The
    first L0 file's section of partition 0 (12 to 15) shifted by half its length, onto 10 to 13, overlaps the L1
    file's, which the L0 plan does not read: no check of the plan's own sections' rows against each other can tell.
    It leaves offsets 14 and 15 between them that no compaction dropped (and its CRC, bound to its row, no longer
    matches its blocks where they are read): partition 0 is set aside before anything is leased, with nothing of it
    written, partition 1 is compacted, and consume of partition 0 is refused in one line until the row is restored."""
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=4, records=6, keys=6, partitions=2)
    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    (l1,) = catalog.snapshot().files()
    assert l1.level == 1 and [(s.partition, s.first_offset, s.last_offset) for s in l1.sections] == [(0, 0, 11), (1, 0, 11)]
    produce_l0_files(catalog, "t", files=4, records=8, keys=6, partitions=2, now=NOW + 1_000)
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in (0, 1)}
    assert [r.offset for r in before[0]] == list(range(28))
    key = _key_at(catalog, 0, 12)
    damage_section(catalog, key, 0, first_offset=10, last_offset=13)

    prepared = prepare_plans(catalog, "regular", NOW + 2_000, CONFIG)
    ((topic, partition, reason),) = [(m.topic, m.partition, m.reason) for m in prepared.set_aside]
    assert (topic, partition) == ("t", 0)
    assert reason.startswith("catalog rows of partition t/0 hide offsets 14 to 15: no live section holds them, yet no compaction dropped them")
    (plan_id,) = prepared.plan_ids
    planned = read_header(catalog.store, plan_id)
    assert l1.key not in {f.key for f in planned.inputs} and key in {f.key for f in planned.inputs}
    summary = run_here(catalog, prepared.plan_ids, prepared.groups, NOW + 2_000)
    assert summary.committed == [plan_id] and not summary.uncleanable
    # Nothing of partition 0 was written: the new L1 file holds partition 1 alone; partition 0's four L0 sections are
    # live where they were, the shifted one included.
    (output,) = [f for f in catalog.snapshot().files(level=1) if f.key != l1.key]
    assert [s.partition for s in output.sections] == [1]
    assert [k for k, s in catalog.snapshot().sections_of("t", 1)] == [l1.key, output.key]
    zero = sorted((s.first_offset, f.key) for f in catalog.snapshot().files() for s in f.sections if s.partition == 0)
    assert [first for first, _ in zero] == [0, 10, 16, 20, 24] and zero[:2] == [(0, l1.key), (10, key)]
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "0"), key)
    with pytest.raises(CorruptDataError):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    assert list(read_records(catalog.store, catalog.snapshot(), "t", 1)) == before[1]  # L0 to L1 copies
    damage_section(catalog, key, 0, first_offset=12, last_offset=15)  # the row restored
    assert list(read_records(catalog.store, catalog.snapshot(), "t", 0)) == before[0]


@pytest.mark.parametrize("field", BOUND)
def test_a_section_row_changed_in_any_locating_field_is_refused_where_its_blocks_are_read(tmp_path: Path, field: str) -> None:
    """Each field the crc32 is bound to, changed alone in the row of section t/1 (topic_id to another topic's,
    partition to one the file has no section of): the loaded section's CRC is no longer the file's, and
    `read_section` refuses it in one line, whichever checks of offsets and counts would pass."""
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    create_topic(catalog, "u", partitions=2, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=1, records=40, keys=10, partitions=2)
    ((key, placed),) = catalog.snapshot().sections_of("t", 1)
    assert read_section(catalog.store, key, placed.info).info == placed.info  # as written, it reads
    sec = schema.sections.c
    with catalog.engine.connect() as connection:
        current = connection.execute(select(sec[field]).where(sec.file_id == _file_id(catalog, key), sec.partition == 1)).scalar_one()
    changed = {"topic_id": catalog.snapshot().topic_ids["u"], "partition": 7, "record_count": current - 1}.get(field, current + 1)
    damage_section(catalog, key, 1, **{field: changed})
    (loaded,) = [s for f in catalog.snapshot().files() if f.key == key for s in f.sections if (s.info.topic, s.info.partition) != ("t", 0)]
    assert loaded.info.topic == ("u" if field == "topic_id" else "t")
    assert loaded.info.crc32 != placed.info.crc32
    with pytest.raises(CorruptDataError, match=f"^{key}: section [tu]/[17] at byte \\d+: .*, or {CHANGED}$") as refused:
        read_section(catalog.store, key, loaded.info)
    assert "\n" not in str(refused.value)


def test_the_binding_is_zlib_s_crc_of_the_eight_fields_and_each_one_changes_it() -> None:
    """What `sections.crc32` holds is part of the schema: a change here needs a new schema version and an upgrade."""
    fields = (3, 17, 4096, 1500, 2, 1_000_000, 1_000_099, 80)
    assert schema.section_crc_binding(*fields) == zlib.crc32(struct.pack("<8q", *fields)) == 0x7662FFB9
    for n in range(len(fields)):
        for delta in (1, -1):
            changed = list(fields)
            changed[n] += delta
            assert schema.section_crc_binding(*changed) != schema.section_crc_binding(*fields), (BOUND[n], delta)


def _stored_crcs(catalog: Catalog) -> dict[tuple[int, int, int], int]:
    sec = schema.sections.c
    with catalog.engine.connect() as connection:
        return {(f, t, p): crc for f, t, p, crc in connection.execute(select(sec.file_id, sec.topic_id, sec.partition, sec.crc32))}


def _as_schema_14(catalog: Catalog) -> None:
    """The catalog as schema 14 held it: files without sections_packed, retired sections not indexed, schema_version 14."""
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("DROP INDEX sections_retired")
        connection.exec_driver_sql("ALTER TABLE files DROP COLUMN sections_packed")
        connection.execute(update(schema.catalog_info).values(schema_version=14))


def _as_schema_13(catalog: Catalog) -> None:
    """The catalog as schema 13 held it: sections without produced_compression, schema_version 13."""
    _as_schema_14(catalog)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE sections DROP COLUMN produced_compression")
        connection.execute(update(schema.catalog_info).values(schema_version=13))


def _as_schema_12(catalog: Catalog) -> None:
    """The catalog as schema 12 held it: none of the security tables, schema_version 12."""
    _as_schema_13(catalog)
    with catalog.engine.begin() as connection:
        for table in reversed(schema.SECURITY_TABLES):
            table.drop(connection)
        connection.execute(update(schema.catalog_info).values(schema_version=12))


def _as_schema_11(catalog: Catalog) -> None:
    """The catalog as schema 11 held it: none of the transactions' tables nor offset_holes, files without
    filtered_version, schema_version 11."""
    _as_schema_12(catalog)
    with catalog.engine.begin() as connection:
        for table in reversed(schema.TRANSACTION_TABLES):
            table.drop(connection)
        schema.offset_holes.drop(connection)
        connection.exec_driver_sql("ALTER TABLE files DROP COLUMN filtered_version")
        connection.execute(update(schema.catalog_info).values(schema_version=11))


def _as_schema_10(catalog: Catalog) -> None:
    """The catalog as schema 10 held it: schema 11's, with partitions without the newest file of an append,
    consumer_groups without leader and each row's members as DescribeGroups lists them (ids only), schema_version 10."""
    _as_schema_11(catalog)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE partitions DROP COLUMN newest_file")
        connection.exec_driver_sql("ALTER TABLE consumer_groups DROP COLUMN leader")
        for group_id, members in connection.execute(select(schema.consumer_groups.c.group_id, schema.consumer_groups.c.members)).all():
            described = [{key: member[key] for key in ("member_id", "group_instance_id", "client_id")} for member in json.loads(members)]
            connection.execute(update(schema.consumer_groups).where(schema.consumer_groups.c.group_id == group_id).values(members=json.dumps(described)))
        connection.execute(update(schema.catalog_info).values(schema_version=10))


def test_a_schema_10_catalog_upgrades_to_group_rows_a_coordinator_loads(catalog: Catalog) -> None:
    """On each database: a schema-10 catalog is refused until upgraded; its group rows kept no member's protocols
    nor assignment, so the upgrade leaves each Empty without members (they join again, as under schema 10), with its
    generation and protocol type, and its committed offsets. Rows written after it keep their members."""
    create_topic(catalog, "t", partitions=1, cleanup_policy="compact")
    member = StoredMember("m-1", None, "client", 10_000, 30_000, (("range", b"\x00\x01"),), b"\x00\x02")
    catalog.save_group(GroupRow("g", 1, 7, "consumer", "range", "Stable", "m-1", (member,), NOW))
    catalog.commit_offsets("g", {("t", 0): CommittedOffset(42, 3, "", NOW)})
    _as_schema_10(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 10, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(10, 0)
    reopened = Catalog(catalog.store, catalog.url)
    assert reopened.group("g") == GroupRow("g", 1, 7, "consumer", "", "Empty", "", (), NOW)
    assert reopened.committed_offsets("g") == {("t", 0): CommittedOffset(42, 3, "", NOW)}
    stable = GroupRow("g", 1, 8, "consumer", "range", "Stable", "m-1", (member,), NOW + 1)
    assert reopened.save_group(stable) and reopened.group("g") == stable


def test_a_schema_11_catalog_upgrades_to_the_holes_its_compactions_left(catalog: Catalog) -> None:
    """On each database: t/0 compacted twice (offsets 0 and 2 dropped), t/1 and u never compacted. As schema 11 (no
    offset_holes) the catalog is refused until upgraded; the upgrade records every gap between the live sections
    of each compacted partition as the commits had (without running schema 10's steps again, which would fail on
    columns already there); consume reads as before, and a section row moved out of t/0 after it is refused."""
    now = wall_clock_ms()
    _compacted_with_holes(catalog, now)
    rows = schema.offset_holes.c
    live = select(rows.topic_id, rows.partition, rows.first_offset, rows.last_offset).where(rows.removed_version.is_(None)).order_by(rows.first_offset)
    with catalog.engine.connect() as connection:
        recorded = connection.execute(live).all()
    t_id = catalog.snapshot().topic_ids["t"]
    assert recorded == [(t_id, 0, 0, 0), (t_id, 0, 2, 2)]
    _as_schema_11(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 11, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(11, 0)
    reopened = Catalog(catalog.store, catalog.url)
    with reopened.engine.connect() as connection:
        assert connection.execute(live).all() == recorded
    assert _values(reopened, now=now) == ["2", "3", "4", "5"]
    assert_summaries_kept(reopened)
    sec = schema.sections.c
    with reopened.engine.begin() as connection:
        connection.execute(update(schema.sections).where(sec.file_id == _file_row(reopened, _key_at(reopened, 0, 4))["file_id"], sec.partition == 0)
                           .values(partition=1))
    _one_line_error(_cli_of(reopened, "consume", "t", "--partition", "0", now=now), "hide offsets 4 to 4: no live section holds them, yet no compaction dropped them")


def test_a_schema_12_catalog_upgrades_to_empty_security_tables(catalog: Catalog) -> None:
    """On each database: a schema-12 catalog (no security tables) is refused until upgraded; the upgrade makes the
    tables, empty, and reads go on as before (without running schema 12's steps again, which would fail on the
    transactions' tables already there)."""
    now = wall_clock_ms()
    _compacted_with_holes(catalog, now)
    _as_schema_12(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 12, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(12, 0)
    reopened = Catalog(catalog.store, catalog.url)
    with reopened.engine.connect() as connection:
        for table in schema.SECURITY_TABLES:
            assert connection.execute(select(func.count()).select_from(table)).scalar_one() == 0
    assert _values(reopened, now=now) == ["2", "3", "4", "5"]


def _produce_compressed(catalog: Catalog, codec: int, first: int, count: int) -> None:
    """`count` records of t/0, keys and values from `first` on, in one L0 file, as Produce hands a batch produced with
    Kafka's `codec` to the agent."""
    rows = [{"timestamp": NOW, "key": b"k%d" % n, "value": b"%d" % n, "headers": None} for n in range(first, first + count)]
    with Agent(catalog, background=False, clock=lambda: NOW) as agent:
        agent.produce_columns("t", 0, pa.RecordBatch.from_pylist(rows, PRODUCE_SCHEMA), produced_codec=codec)
        agent.flush()


def _produced_compressions(catalog: Catalog) -> dict[int, set[int]]:
    """By level, the produced codecs the live files' sections record."""
    sec, files = schema.sections.c, schema.files.c
    found: dict[int, set[int]] = {}
    with catalog.engine.connect() as connection:
        for level, codec in connection.execute(
            select(sec.level, sec.produced_compression).join(schema.files, files.file_id == sec.file_id).where(files.removed_version.is_(None))
        ):
            found.setdefault(level, set()).add(codec)
    return found


def test_a_schema_14_catalog_upgrades_to_files_whose_sections_planners_read_from_their_rows(catalog: Catalog) -> None:
    """On each database: a schema-14 catalog (files without their sections packed) is refused until upgraded; the
    upgrade leaves its files without a pack and indexes the retired sections, planning passes read those files'
    sections from their rows as they read packed ones (the same columns), and files added after it carry their pack."""
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    _produce_compressed(catalog, GZIP, 0, 30)
    before = catalog.snapshot().section_columns()
    _as_schema_14(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 14, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(14, 0)
    reopened = Catalog(catalog.store, catalog.url)
    after = reopened.snapshot().section_columns()
    assert (after.keys, after.file.tolist(), after.partition.tolist(), after.first_offset.tolist(), after.last_offset.tolist()) == (
        before.keys, before.file.tolist(), before.partition.tolist(), before.first_offset.tolist(), before.last_offset.tolist())
    _produce_compressed(reopened, ZSTD, 30, 20)
    prepared = prepare_plans(reopened, "regular", NOW, PlannerConfig(min_files=(2, 2, 2, 2)))
    run_here(reopened, prepared.plan_ids, prepared.groups, NOW)
    files = schema.files.c
    with reopened.engine.connect() as connection:
        live = connection.execute(select(files.level, files.sections_packed).where(files.removed_version.is_(None))).all()
    assert [(level, pack is not None) for level, pack in live] == [(1, True)]  # a compaction's output carries its pack
    compacted = reopened.snapshot().section_columns()
    assert (compacted.levels.tolist(), compacted.first_offset.tolist(), compacted.last_offset.tolist()) == ([1], [0], [49])


def test_a_schema_13_catalog_upgrades_to_sections_whose_produced_codec_is_unknown(catalog: Catalog) -> None:
    """On each database: a schema-13 catalog (sections without produced_compression) is refused until upgraded, as a
    schema-13 release refuses a schema-14 catalog; the upgrade adds the column, laid out as a new catalog lays it, its
    rows not knowing the codec they were produced with (-1), and reads go on as before. Appends after it record
    theirs, and a compaction the codec of most of its inputs' records where any is known."""
    create_topic(catalog, "t", partitions=1, cleanup_policy="compact")
    _produce_compressed(catalog, GZIP, 0, 30)
    assert _produced_compressions(catalog) == {0: {GZIP}}
    fresh_layout = _sections_layout(catalog)
    before = list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    _as_schema_13(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 13, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(13, 0)
    reopened = Catalog(catalog.store, catalog.url)
    assert _sections_layout(reopened) == fresh_layout
    assert _produced_compressions(reopened) == {0: {schema.UNKNOWN_CODEC}}
    assert list(read_records(reopened.store, reopened.snapshot(), "t", 0)) == before
    _produce_compressed(reopened, ZSTD, 30, 20)
    _produce_compressed(reopened, GZIP, 50, 10)
    assert _produced_compressions(reopened) == {0: {schema.UNKNOWN_CODEC, ZSTD, GZIP}}
    prepared = prepare_plans(reopened, "regular", NOW, PlannerConfig(min_files=(2, 2, 2, 2)))
    run_here(reopened, prepared.plan_ids, prepared.groups, NOW)
    assert _produced_compressions(reopened) == {1: {ZSTD}}  # 20 zstd records to 10 gzip, 30 unknown
    assert [r.key for r in read_records(reopened.store, reopened.snapshot(), "t", 0)] == [b"k%d" % n for n in range(60)]


def _as_schema_9(catalog: Catalog) -> None:
    """The catalog as schema 9 held it: schema 10's, with partition_summaries without their partitions' entries in
    the index counted, schema_version 9."""
    _as_schema_10(catalog)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE partition_summaries DROP COLUMN indexed")
        connection.execute(update(schema.catalog_info).values(schema_version=9))


def _as_schema_8(catalog: Catalog) -> None:
    """The catalog as schema 8 held it: on PostgreSQL, sections' record_count and tombstones 64-bit (where binary
    COPY of schema 9's 32-bit ones fails); schema_version 8."""
    _as_schema_10(catalog)
    with catalog.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("ALTER TABLE sections ALTER COLUMN record_count TYPE bigint, ALTER COLUMN tombstones TYPE bigint")
        connection.exec_driver_sql("ALTER TABLE partition_summaries DROP COLUMN indexed")
        connection.execute(update(schema.catalog_info).values(schema_version=8))


def _sections_layout(catalog: Catalog) -> tuple[list[tuple[str, str]], list[tuple]]:
    """The sections table's columns as the database lays them out, (name, type) in order, and its indexes' names and
    columns."""
    with catalog.engine.connect() as connection:
        found = inspect(connection)
        columns = [(c["name"], str(c["type"])) for c in found.get_columns("sections")]
        return columns, sorted((i["name"], tuple(i["column_names"])) for i in found.get_indexes("sections"))


def _as_schema_7(catalog: Catalog) -> None:
    """The catalog as schema 7 held it: partition_summaries without l1_bytes, schema_version 7."""
    _as_schema_10(catalog)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE partition_summaries DROP COLUMN l1_bytes")
        connection.execute(update(schema.catalog_info).values(schema_version=7))


def _as_schema_6(catalog: Catalog) -> None:
    """The catalog as schema 6 held it: no partition_summaries, schema_version 6."""
    _as_schema_10(catalog)
    with catalog.engine.begin() as connection:
        schema.partition_summaries.drop(connection)
        connection.execute(update(schema.catalog_info).values(schema_version=6))


def _as_schema_5(catalog: Catalog) -> None:
    """The catalog as schema 5 held it: schema 6's, without sections.level nor partitions.assigned_end, every
    section in `sections_by_partition`, schema_version 5."""
    _as_schema_6(catalog)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("DROP INDEX sections_by_partition")
        connection.exec_driver_sql("ALTER TABLE sections DROP COLUMN level")
        connection.exec_driver_sql("CREATE INDEX sections_by_partition ON sections (topic_id, partition, last_offset)")
        connection.exec_driver_sql("ALTER TABLE partitions DROP COLUMN assigned_end")
        connection.execute(update(schema.catalog_info).values(schema_version=5))


def _as_schema_4(catalog: Catalog) -> None:
    """The catalog as schema 4 held it: schema 5's, without the Kafka agents' tables, partitions.log_start_offset
    and topics.deleted_version, its topics' names unique by a constraint, schema_version 4."""
    _as_schema_5(catalog)
    with catalog.engine.begin() as connection:
        for table in (schema.agents, schema.producers, schema.producer_batches, schema.consumer_groups, schema.group_offsets):
            table.drop(connection)
        connection.exec_driver_sql("ALTER TABLE partitions DROP COLUMN log_start_offset")
        connection.exec_driver_sql("DROP INDEX topics_live_name")
        connection.exec_driver_sql("ALTER TABLE topics DROP COLUMN deleted_version")
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("ALTER TABLE topics ADD CONSTRAINT topics_name_key UNIQUE (name)")
        else:  # SQLite adds no constraint to a table: built again as schema 4 created it
            connection.exec_driver_sql("ALTER TABLE topics RENAME TO topics_schema_5")
            connection.exec_driver_sql(
                "CREATE TABLE topics (topic_id INTEGER NOT NULL, name VARCHAR(249) NOT NULL, partitions INTEGER NOT NULL, "
                "config TEXT NOT NULL, created_ms BIGINT NOT NULL, created_version BIGINT NOT NULL, PRIMARY KEY (topic_id), "
                "UNIQUE (name))"
            )
            connection.exec_driver_sql("INSERT INTO topics SELECT * FROM topics_schema_5")
            connection.exec_driver_sql("DROP TABLE topics_schema_5")
        connection.execute(update(schema.catalog_info).values(schema_version=4))


def _as_schema_3(catalog: Catalog) -> None:
    """The catalog as schema 3 held it: schema 4's tables with each sections row's crc32 raw (unbound)."""
    _as_schema_4(catalog)
    sec = schema.sections.c
    with catalog.engine.begin() as connection:
        rows = connection.execute(select(sec.file_id, sec.topic_id, sec.partition, *(sec[n] for n in BOUND[2:]), sec.crc32)).all()
        for row in rows:
            connection.execute(
                update(schema.sections).where(sec.file_id == row[0], sec.topic_id == row[1], sec.partition == row[2])
                .values(crc32=row[-1] ^ schema.section_crc_binding(*row[1:-1]))
            )
        connection.execute(update(schema.catalog_info).values(schema_version=3))


def test_a_schema_3_catalog_is_refused_until_upgrade_catalog_binds_its_rows(catalog: Catalog) -> None:
    """On each database: a catalog of schema 3 (raw CRCs) is refused by every command with one line naming
    `logcompact cluster upgrade-catalog`, which rewrites every sections row (live and removed, in batches) in one
    transaction; then it reads as before, and upgrading again has nothing to do. Other versions are refused."""
    create_topic(catalog, "t", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=5, records=30, keys=10, partitions=3)
    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)  # removed rows, kept for the versions, are upgraded too
    produce_l0_files(catalog, "t", files=2, records=30, keys=10, partitions=3)
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in range(3)}
    bound = _stored_crcs(catalog)
    assert len(bound) == 3 * 8  # 7 L0 files (5 removed) and an L1 file, every one holding each partition
    cli = ["--store", catalog.store.uri, "--catalog", catalog.url, "--now", str(NOW)]

    _as_schema_3(catalog)
    assert all(crc != bound[row] for row, crc in _stored_crcs(catalog).items())
    with pytest.raises(CatalogSchemaError, match=f"has schema version 3, this logcompact uses {schema.SCHEMA_VERSION}: .*run `logcompact cluster upgrade-catalog`"):
        Catalog(catalog.store, catalog.url).snapshot()
    for argv in (["consume", "t", "--partition", "0"], ["files"], ["compact", "--all"], ["cluster", "describe"]):
        _one_line_error(run_in_process([*cli, *argv]), "has schema version 3", "logcompact cluster upgrade-catalog")
    upgraded = run_in_process([*cli, "cluster", "upgrade-catalog"])
    assert upgraded.code == 0 and not upgraded.stderr, upgraded
    assert json.loads(upgraded.stdout) == {"upgraded": True, "from_schema_version": 3, "schema_version": schema.SCHEMA_VERSION, "sections_rewritten": 24}
    assert _stored_crcs(catalog) == bound
    reopened = Catalog(catalog.store, catalog.url)
    assert {p: list(read_records(reopened.store, reopened.snapshot(), "t", p)) for p in range(3)} == before
    again = run_in_process([*cli, "cluster", "upgrade-catalog"])
    assert again.code == 0 and json.loads(again.stdout)["upgraded"] is False and "nothing to do" in again.stdout, again
    assert _stored_crcs(catalog) == bound

    # The library's method, in batches smaller than the table.
    _as_schema_3(catalog)
    assert Catalog(catalog.store, catalog.url).upgrade_catalog(batch=5) == CatalogUpgrade(3, 24)
    assert _stored_crcs(catalog) == bound
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() is None

    for other in (2, schema.SCHEMA_VERSION + 1):
        with catalog.engine.begin() as connection:
            connection.execute(update(schema.catalog_info).values(schema_version=other))
        _one_line_error(run_in_process([*cli, "cluster", "upgrade-catalog"]), f"has schema version {other}",
                        f"upgrades schemas {', '.join(map(str, schema.UPGRADABLE_FROM))} to {schema.SCHEMA_VERSION} only")
        assert _stored_crcs(catalog) == bound


def test_a_schema_5_catalog_upgrades_to_its_l0_sections_out_of_the_partition_index(catalog: Catalog) -> None:
    """On each database: a schema-5 catalog is refused until upgraded; the upgrade gives each section its file's
    level, indexes by partition only those above L0, and starts each partition's assigned_end at its next offset,
    so an append still refuses a lowered next_offset. Reads, appends and compactions go on as before."""
    create_topic(catalog, "t", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=4, records=30, keys=10, partitions=3)
    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    produce_l0_files(catalog, "t", files=2, records=30, keys=10, partitions=3)
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in range(3)}
    _as_schema_5(catalog)
    sec, files, part = schema.sections.c, schema.files.c, schema.partitions.c
    with catalog.engine.begin() as connection:  # lowered under schema 5: still refused after the upgrade
        connection.execute(update(schema.partitions).where(part.partition == 2).values(next_offset=7))
    with pytest.raises(CatalogSchemaError, match=f"has schema version 5, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(5, 0)
    reopened = Catalog(catalog.store, catalog.url)
    with reopened.engine.connect() as connection:
        levels = connection.execute(select(sec.level, files.level).join(schema.files, files.file_id == sec.file_id)).all()
        assert {row[0] for row in levels} == {0, 1} and all(mine == its for mine, its in levels)
        assert connection.execute(select(part.next_offset, part.assigned_end).order_by(part.partition)).all() == [(60, 60), (60, 60), (7, 60)]
    with pytest.raises(IngestError, match=r"partition 2\) has next_offset 7 but the last append assigned offsets up to 59"):
        produce_l0_files(reopened, "t", files=1, records=30, keys=10, partitions=3)
    with reopened.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(part.partition == 2).values(next_offset=60))
    assert {p: list(read_records(reopened.store, reopened.snapshot(), "t", p)) for p in range(3)} == before
    produce_l0_files(reopened, "t", files=1, records=30, keys=10, partitions=3)
    assert [len(list(read_records(reopened.store, reopened.snapshot(), "t", p))) for p in range(3)] == [len(before[p]) + 10 for p in range(3)]
    with reopened.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(part.partition == 1).values(next_offset=5))
    with pytest.raises(IngestError, match=r"partition 1\) has next_offset 5 but the last append assigned offsets up to 69"):
        produce_l0_files(reopened, "t", files=1, records=30, keys=10, partitions=3)


@pytest.mark.parametrize("found", [6, 7, 8, 9, 10])
def test_a_schema_6_to_10_catalog_upgrades_to_partition_summaries_that_commits_then_keep(catalog: Catalog, found: int) -> None:
    """On each database: a schema-6 catalog (no summaries), schema-7 one (summaries without their bytes at L1),
    schema-8 one (sections laid out wider) or schema-9 one (summaries not counting their partitions' index entries) is
    refused until upgraded; the upgrade lays the sections out as a new catalog does and sums up every partition's live
    sections above L0 (an empty row for one without), set by the newest version, so an older snapshot reads the
    sections (schema 9's rows are kept as they were); each row counts its partition's entries in the index; then
    compactions, appends and gc keep the rows."""
    create_topic(catalog, "t", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=4, records=30, keys=10, partitions=2)  # partition 2 gets no record
    older = catalog.snapshot()
    prepared = prepare_plans(catalog, "regular", NOW, CONFIG)
    run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    produce_l0_files(catalog, "t", files=2, records=30, keys=10, partitions=2)
    fresh_layout = _sections_layout(catalog)
    records = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in range(3)}
    kept = schema.partition_summaries.c
    part = schema.partitions.c
    with catalog.engine.connect() as connection:
        rows_before = connection.execute(select(kept.partition, kept.floor, kept.version).order_by(kept.partition)).all()
        newest_before = connection.execute(select(part.newest_file).order_by(part.partition)).scalars().all()
    assert newest_before[0] > newest_before[2] == 0  # partition 2 was never appended to
    {6: _as_schema_6, 7: _as_schema_7, 8: _as_schema_8, 9: _as_schema_9, 10: _as_schema_10}[found](catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version {found}, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(found, 0)
    reopened = Catalog(catalog.store, catalog.url)
    assert _sections_layout(reopened) == fresh_layout
    assert {p: list(read_records(reopened.store, reopened.snapshot(), "t", p)) for p in range(3)} == records
    with reopened.engine.connect() as connection:
        rows = connection.execute(select(kept.partition, kept.floor, kept.version).order_by(kept.partition)).all()
        assert connection.execute(select(part.newest_file).order_by(part.partition)).scalars().all() == newest_before
    latest = reopened.latest_version()
    assert rows == (rows_before if found >= 9 else [(0, 0, latest), (1, 0, latest), (2, None, latest)])
    assert_summaries_kept(reopened)
    partitions = [("t", p) for p in range(3)]
    assert reopened.snapshot().floors_above_l0(partitions) == {("t", 0): 0, ("t", 1): 0, ("t", 2): None}
    # Older than every row the upgrade set: its sections are read (schema 9's rows keep the versions that set them).
    assert older.floors_above_l0(partitions) == ({("t", 2): None} if found >= 9 else {})
    for _ in range(2):  # L0 to L1, then L1 to L2: sections above L0 removed and added
        prepared = prepare_plans(reopened, "regular", NOW, PlannerConfig(min_files=(2, 2, 2, 2)))
        run_here(reopened, prepared.plan_ids, prepared.groups, NOW)
        assert_summaries_kept(reopened)
    assert reopened.snapshot().level_counts() == {2: 1}
    reopened.forget_files(reopened.collectable_files(reopened.latest_version() + 1, 2**62))  # the L1 files' entries go
    assert_summaries_kept(reopened)


def test_a_schema_4_catalog_upgrades_to_the_kafka_tables_and_keeps_its_topics(catalog: Catalog) -> None:
    """On each database: a schema-4 catalog is refused until upgraded; the upgrade keeps topics (their ids, so new
    ones never reuse one), offsets and records, starts every log at offset 0, and a deleted topic's name can then be
    taken again by a new topic (topics' names are unique among live topics only)."""
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    create_topic(catalog, "u", partitions=1, cleanup_policy="delete")
    produce_l0_files(catalog, "t", files=2, records=20, keys=5, partitions=2)
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in range(2)}
    ids = _topic_ids(catalog)
    _as_schema_4(catalog)
    with pytest.raises(CatalogSchemaError, match=f"has schema version 4, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(4, 0)
    reopened = Catalog(catalog.store, catalog.url)
    assert {p: list(read_records(reopened.store, reopened.snapshot(), "t", p)) for p in range(2)} == before
    assert _topic_ids(reopened) == ids
    with reopened.engine.connect() as connection:
        starts = connection.execute(select(schema.partitions.c.log_start_offset)).scalars().all()
        assert starts == [0, 0, 0]
        for table in (schema.agents, schema.producers, schema.producer_batches, schema.consumer_groups, schema.group_offsets):
            assert connection.execute(select(table)).all() == []
    with reopened.engine.begin() as connection:  # a deleted topic frees its name; a live one keeps it unique
        connection.execute(update(schema.topics).where(schema.topics.c.name == "u").values(deleted_version=99))
    create_topic(reopened, "u", partitions=1, cleanup_policy="compact")
    assert _topic_ids(reopened)["u"] > max(ids.values())
    with pytest.raises(IntegrityError), reopened.engine.begin() as connection:
        connection.execute(schema.topics.insert().values(
            name="t", partitions=1, config="{}", created_ms=NOW, created_version=1))


def _topic_ids(catalog: Catalog) -> dict[str, int]:
    """Live topics' ids by name."""
    top = schema.topics.c
    with catalog.engine.connect() as connection:
        return dict(connection.execute(select(top.name, top.topic_id).where(top.deleted_version.is_(None))).all())


def test_upgrade_catalog_of_no_cluster_is_refused(tmp_path: Path) -> None:
    outcome = run_in_process(["--store", f"file://{tmp_path}/store", "cluster", "upgrade-catalog"])
    _one_line_error(outcome, "no logcompact cluster in")
    assert not (tmp_path / "store" / "catalog.db").exists()


@pytest.fixture
def directory_object(tmp_path: Path) -> Iterator[tuple[LocalStore, str]]:
    store = LocalStore(tmp_path / "store")
    store.put("data/l0/a.seg", b"0123456789")
    (tmp_path / "store" / "data" / "l0" / "a.seg").unlink()
    (tmp_path / "store" / "data" / "l0" / "a.seg").mkdir()
    yield store, "data/l0/a.seg"


def test_an_object_replaced_by_a_directory_is_no_object_on_every_read_path(directory_object: tuple[LocalStore, str]) -> None:
    store, key = directory_object
    for read in (lambda: store.get(key), lambda: store.open_stream(key), lambda: store.open_stream(key, 4),
                 lambda: store.get_range(key, 2, 3)):
        with pytest.raises(ObjectNotFoundError, match=f"no object '{key}' in {store.uri}: a directory is in its place"):
            read()
    assert store.stat(key) is None  # as S3 answers a HEAD of a "directory"
    assert [info.key for info in store.list("data/")] == []
    store.delete(key)  # nothing to delete, as on S3; the directory is not the store's
    assert (store.root / key).is_dir()
    with pytest.raises(StoreError, match=f"write {store.uri}/{key} failed: a directory is in its place"):
        store.put(key, b"x")
    with pytest.raises(StoreError, match="a directory is in its place"):
        store.put_if_absent(key, b"x")
    assert not [p for p in (store.root / "data" / "l0").iterdir() if p.name != "a.seg"]  # no temporary file left


def test_a_data_file_replaced_by_a_directory_is_one_line_for_consume(two_partitions: Catalog) -> None:
    catalog = two_partitions
    key = _key_at(catalog, 0, 0)  # the first read: nothing is printed before the error
    path = catalog.store.root / key
    path.unlink()
    path.mkdir()
    with pytest.raises(ObjectNotFoundError, match="a directory is in its place"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    _one_line_error(_cli(catalog, "consume", "t", "--partition", "0"), key, "a directory is in its place")


# -- 3. the database going away after the first connection -------------------------------------------------------


def _accepting(server: PostgresServer, url: str, accepting: bool) -> None:
    """Open or close a database to connections; closing it also ends the sessions it has (a database going away)."""
    name = make_url(url).database
    with server.connect("postgres") as connection:
        connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(accepting).lower()}')
        if not accepting:
            connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


@pytest.fixture
def postgres_catalog(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Catalog, PostgresServer, str]]:
    """A cluster on its own PostgreSQL database, its URL with a password (the server trusts, so any will do)."""
    url = make_url(postgres.create_database()).set(password=PLANTED).render_as_string(hide_password=False)
    catalog = Catalog(LocalStore(tmp_path / "store"), url)
    create_topic(catalog, "accounts", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=5, records=60, keys=20, partitions=3)
    try:
        yield catalog, postgres, url
    finally:
        _accepting(postgres, url, True)
        catalog.engine.dispose()
        postgres.drop_database(url)


def test_a_snapshot_whose_database_goes_away_raises_catalog_unavailable(postgres_catalog: tuple[Catalog, PostgresServer, str]) -> None:
    catalog, server, url = postgres_catalog
    snapshot = catalog.snapshot()
    before = snapshot.sections_of("accounts", 0)
    assert before and snapshot.file_summaries()
    _accepting(server, url, False)
    for read in (
        lambda: snapshot.sections_of("accounts", 0),
        lambda: snapshot.file_summaries(),
        lambda: snapshot.files(),
        lambda: snapshot.leases(NOW),
        lambda: list(read_records(catalog.store, snapshot, "accounts", 1)),
    ):
        with pytest.raises(CatalogUnavailableError, match="cannot be reached or read .*; check --catalog") as raised:
            read()
        message = str(raised.value)
        assert PLANTED not in message and redact_url(url) in message and "\n" not in message
        assert "is not currently accepting connections" in message
    _accepting(server, url, True)
    assert snapshot.sections_of("accounts", 0) == before  # once it is back, the same snapshot reads again


@pytest.mark.parametrize("stage", ["advance", "sections"])
def test_an_append_that_waits_out_its_lock_timeout_raises_catalog_unavailable(
    postgres_catalog: tuple[Catalog, PostgresServer, str], stage: str
) -> None:
    """Another session holds the partition rows an append advances, or the sections table against the append's
    COPY (statements it runs on the driver's connection, past SQLAlchemy), past the database's lock_timeout. The
    append is refused on one line as a catalog that cannot be read, with the database's reason, nothing of it is
    written, and once the other session ends the next append takes the offsets the refused one did not."""
    catalog, server, url = postgres_catalog
    name = make_url(url).database
    with server.connect(name) as connection:
        connection.execute(f'ALTER DATABASE "{name}" SET lock_timeout = 200')
    catalog.engine.dispose()  # sessions opened from now on take the setting
    offsets = catalog.next_offsets("accounts")
    sections = tuple(SectionInfo("accounts", p, 2, 1, NOW, NOW, 0, 100, "none", 0, 0, 100) for p in range(3))
    with server.connect(name, autocommit=False) as blocker:
        blocker.execute("SELECT 1 FROM partitions FOR UPDATE" if stage == "advance" else "LOCK TABLE sections IN SHARE MODE")
        with pytest.raises(CatalogUnavailableError, match="cannot be reached or read \\(canceling statement due to lock timeout\\)") as raised:
            catalog.append_files([NewFile("data/l0/refused.seg", 0, 300, NOW, sections)], NOW)
        assert "\n" not in str(raised.value) and PLANTED not in str(raised.value)
    assert catalog.next_offsets("accounts") == offsets
    assert catalog.known_files(["data/l0/refused.seg"]) == set()
    assigned = catalog.append_files([NewFile("data/l0/accepted.seg", 0, 300, NOW, sections)], NOW).assigned
    assert assigned == [offsets]


@pytest.mark.parametrize("stage", ["advance", "sections"])
def test_an_append_whose_database_goes_away_midway_raises_catalog_unavailable(
    postgres_catalog: tuple[Catalog, PostgresServer, str], monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """The database ends the append's session just before the partitions are advanced, or just before the sections
    are placed (the one-step append's round trip, run on the driver's connection past SQLAlchemy; a Catalog's first
    append, which expires idle producers, copies them in the long way). The append is refused as an
    unreachable catalog on one line, nothing of it is written, and once the database is back the next append runs on
    a connection of its own (the dropped one left the pool) and takes the offsets the refused one did not."""
    catalog, server, url = postgres_catalog
    offsets = catalog.next_offsets("accounts")
    module, hooked = (catalog_files, catalog_files.take_file_ids) if stage == "advance" else (appends, appends.place)

    def going_away(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = hooked(*args, **kwargs)
        _accepting(server, url, False)
        return found

    monkeypatch.setattr(module, hooked.__name__, going_away)
    sections = tuple(SectionInfo("accounts", p, 2, 1, NOW, NOW, 0, 100, "none", 0, 0, 100) for p in range(3))
    with pytest.raises(CatalogUnavailableError, match="cannot be reached or read .*; check --catalog") as raised:
        catalog.append_files([NewFile("data/l0/refused.seg", 0, 300, NOW, sections)], NOW)
    assert "\n" not in str(raised.value) and PLANTED not in str(raised.value)
    monkeypatch.undo()
    _accepting(server, url, True)
    assert catalog.next_offsets("accounts") == offsets
    assert catalog.known_files(["data/l0/refused.seg"]) == set()
    assigned = catalog.append_files([NewFile("data/l0/accepted.seg", 0, 300, NOW, sections)], NOW).assigned
    assert assigned == [offsets]


@pytest.mark.parametrize("lowered_by", [1, 2])
def test_an_append_on_postgresql_under_a_lowered_version_row_is_refused_writing_nothing(
    postgres_catalog: tuple[Catalog, PostgresServer, str], lowered_by: int
) -> None:
    """The version row lowered below the commit log's newest version, on PostgreSQL, where the row is bumped and the
    commit logged in one round trip: the append is refused on one line naming the row and the log, nothing of it is
    written (no log row, no file, no offsets), and once the row is set back the next append takes those offsets."""
    catalog, server, url = postgres_catalog
    name = make_url(url).database
    offsets = catalog.next_offsets("accounts")
    with server.connect(name) as connection:
        (version,) = connection.execute("SELECT version FROM catalog_info").fetchone()
        connection.execute("UPDATE catalog_info SET version = %s", (version - lowered_by,))
    sections = tuple(SectionInfo("accounts", p, 2, 1, NOW, NOW, 0, 100, "none", 0, 0, 100) for p in range(3))
    with pytest.raises(CorruptDataError, match=f"catalog_info.version is {version - lowered_by} but the commit log \\(versions\\) holds version {version}") as raised:
        catalog.append_files([NewFile("data/l0/refused.seg", 0, 300, NOW, sections)], NOW)
    assert "\n" not in str(raised.value) and PLANTED not in str(raised.value)
    with server.connect(name) as connection:
        assert connection.execute("SELECT max(version) FROM versions").fetchone() == (version,)
        connection.execute("UPDATE catalog_info SET version = %s", (version,))
    assert catalog.next_offsets("accounts") == offsets
    assert catalog.known_files(["data/l0/refused.seg"]) == set()
    appended = catalog.append_files([NewFile("data/l0/accepted.seg", 0, 300, NOW, sections)], NOW)
    assert (appended.version, appended.assigned) == (version + 1, [offsets])


def test_a_snapshot_whose_sqlite_file_turns_to_garbage_raises_catalog_unavailable(two_partitions: Catalog) -> None:
    catalog = two_partitions
    snapshot = catalog.snapshot()
    assert snapshot.sections_of("t", 0)
    database = Path(make_url(catalog.url).database or "")
    catalog.engine.dispose()  # the pool's connections hold the old file open
    for side in ("-wal", "-shm"):
        Path(f"{database}{side}").unlink(missing_ok=True)
    database.write_bytes(bytes((n * 131 + 7) % 256 for n in range(8192)))
    with pytest.raises(CatalogUnavailableError, match=f"catalog sqlite:///{database} cannot be reached or read \\(file is not a database\\)"):
        snapshot.sections_of("t", 0)


def test_catalog_errors_converts_only_connection_failures() -> None:
    url = f"postgresql+psycopg://u:{PLANTED}@127.0.0.1/db"
    with pytest.raises(CatalogUnavailableError, match=r"catalog postgresql\+psycopg://u:\*\*\*@127.0.0.1/db cannot be reached or read \(refused\)"):
        with catalog_errors(url):
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("refused"))
    for kept in (IntegrityError("INSERT", {}, ValueError("duplicate key")), ProgrammingError("SELECT", {}, ValueError("syntax"))):
        with pytest.raises(type(kept)):
            with catalog_errors(url):
                raise kept
    invalidated = ProgrammingError("SELECT", {}, ValueError("lost"), connection_invalidated=True)
    with pytest.raises(CatalogUnavailableError, match="lost"):
        with catalog_errors(url):
            raise invalidated


# -- 4. commit_plans: every plan it can, then the failures together ----------------------------------------------


@pytest.fixture
def three_plans(catalog: Catalog) -> tuple[Catalog, list[str]]:
    """Three leased plans of one topic (on each database), their groups run."""
    create_topic(catalog, "accounts", partitions=3, cleanup_policy="compact")
    plan_ids = []
    for number in range(3):
        now = NOW + number * 1_000
        produce_l0_files(catalog, "accounts", files=4, records=30, keys=20, partitions=3, now=now)
        (plan_id,) = prepare_plans(catalog, "regular", now, CONFIG).plan_ids  # the earlier plans' files are leased
        for group in read_header(catalog.store, plan_id).groups:
            run_group(catalog.store, plan_id, group.group)
        plan_ids.append(plan_id)
    return catalog, plan_ids


def _tamper(catalog: Catalog, plan_id: str) -> None:
    """Change a stored document of the plan after it was sealed."""
    key = group_key(plan_id, 0)
    catalog.store.put(key, catalog.store.get(key) + b"\x00")


def test_a_changed_document_does_not_hold_back_the_other_plans(three_plans: tuple[Catalog, list[str]]) -> None:
    catalog, (first, second, _third) = three_plans
    _tamper(catalog, first)
    with pytest.raises(InvalidPlanError, match=f"plan {first}: its documents in .* were changed since; plan again") as raised:
        commit_plans(catalog, [first, second], NOW + 5_000)
    assert "\n" not in str(raised.value)
    assert catalog.is_committed(second) and not catalog.is_committed(first)


def test_failures_of_several_kinds_are_raised_together_after_the_others_commit(three_plans: tuple[Catalog, list[str]]) -> None:
    catalog, (first, second, third) = three_plans
    _tamper(catalog, first)
    catalog.store.delete(f"plans/{second}/results/g000.json")  # a missing result: a conflict
    with pytest.raises(PlansNotCommittedError) as raised:
        commit_plans(catalog, [first, second, third], NOW + 5_000)
    message = str(raised.value)
    assert message.startswith(f"2 plans not committed: plan {first}: its documents") and "\n" not in message
    assert f"; plan {second}: no result for group(s) 0" in message
    assert catalog.is_committed(third) and not catalog.is_committed(first) and not catalog.is_committed(second)
    summary = commit_plans(catalog, [first, second, third], NOW + 6_000, keep_going=True)
    assert summary.already_committed == [third] and len(summary.conflicts) == 2
    assert summary.conflicts[0].startswith(f"plan {first}: its documents") and summary.conflicts[1].startswith(f"plan {second}: no result")


def test_conflicts_alone_stay_a_commit_conflict(three_plans: tuple[Catalog, list[str]]) -> None:
    catalog, (first, second, third) = three_plans
    for plan_id in (first, second):
        catalog.store.delete(f"plans/{plan_id}/results/g000.json")
    with pytest.raises(CommitConflictError, match=f"^2 plans not committed: plan {first}: no result .*; plan {second}: no result"):
        commit_plans(catalog, [first, second, third], NOW + 5_000)
    assert catalog.is_committed(third)


def test_an_error_that_is_not_logcompact_s_is_reported_with_the_others(
    three_plans: tuple[Catalog, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog, (first, second, third) = three_plans
    import logcompact.jobs.commit as commit_module

    real = commit_module.read_results

    def broken(store, header):
        if header.plan_id == second:
            raise KeyError("slices")
        return real(store, header)

    monkeypatch.setattr(commit_module, "read_results", broken)
    with pytest.raises(PlansNotCommittedError, match=f"plan {second}: KeyError: 'slices'") as raised:
        commit_plans(catalog, [first, second, third], NOW + 5_000)
    assert isinstance(raised.value.__cause__, KeyError)
    assert catalog.is_committed(first) and catalog.is_committed(third)


# -- 5. a commit whose database goes away ---------------------------------------------------------------------------


def test_a_compaction_whose_database_dies_in_its_commit_fails_and_its_plan_is_released_once_it_returns(
    postgres_catalog: tuple[Catalog, PostgresServer, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    catalog, server, url = postgres_catalog
    real = Catalog.replace_files

    def dying(self, *args, **kwargs):
        _accepting(server, url, False)  # the database goes away as the commit starts, and stays away
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Catalog, "replace_files", dying)
    base = ["--store", catalog.store.uri, "--catalog", url, "--now", str(NOW)]
    with caplog.at_level(logging.WARNING, logger="logcompact"):
        outcome = run_in_process([*base, "compact", "--all", "--min-files", "4"])
    monkeypatch.setattr(Catalog, "replace_files", real)
    # The commit's own failure, on one line, and a non-zero exit.
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("logcompact: error: ")]
    assert outcome.code == 1 and len(errors) == 1 and "Traceback" not in outcome.stderr and not outcome.stdout, outcome
    assert "is not currently accepting connections" in errors[0] and PLANTED not in outcome.stderr
    (plan_id,) = abandoned_plans(catalog.store)
    assert plan_id in errors[0]
    # The release that failed too is logged, not swallowed.
    assert any(f"plan {plan_id}: could not be released" in r.getMessage() and abandoned_key(plan_id) in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert json.loads(catalog.store.get(abandoned_key(plan_id)))["plan_id"] == plan_id

    _accepting(server, url, True)
    # Back, the plan still holds its files (for the lease's hour: a planner that did not release it would find
    # nothing to do, and compact would exit 0 printing nothing, as the campaign saw). The plan step releases it
    # first (`release_abandoned`), and compacts the files again.
    assert {lease.plan_id for lease in catalog.snapshot().leases(NOW + 1).values()} == {plan_id}
    again = run_in_process([*base, "compact", "--all", "--min-files", "4"])
    assert again.code == 0 and json.loads(again.stdout.splitlines()[0])["committed"], again
    assert catalog.plan_seal(plan_id) is None and abandoned_plans(catalog.store) == [] and not catalog.is_committed(plan_id)
    assert release_abandoned(catalog) == []


def test_release_abandoned_leaves_a_plan_that_committed_after_all(three_plans: tuple[Catalog, list[str]]) -> None:
    from logcompact.plans.documents import write_abandoned

    catalog, (first, second, _third) = three_plans
    commit_plans(catalog, [first], NOW + 5_000)
    write_abandoned(catalog.store, first, NOW + 5_000, "the database went away")
    write_abandoned(catalog.store, second, NOW + 5_000, "the database went away")
    assert catalog.plan_seal(second) is not None
    assert release_abandoned(catalog) == [first, second]
    assert catalog.is_committed(first) and catalog.plan_seal(second) is None
    assert not any(lease.plan_id == second for lease in catalog.snapshot().leases(NOW + 5_000).values())


# -- the Airflow hook -----------------------------------------------------------------------------------------------


def test_the_hook_hands_its_catalog_password_to_airflow_s_masker_and_prints_it_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    from logcompact.exceptions import CatalogConfigError
    from logcompact_airflow.hooks.logcompact import LogcompactHook

    def connection(catalog: object) -> LogcompactHook:
        extra = {"store": f"file://{tmp_path}/store", "catalog": catalog}
        monkeypatch.setenv("AIRFLOW_CONN_PLANTED", json.dumps({"conn_type": "generic", "extra": extra}))
        return LogcompactHook("planted")

    for url in (f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:1/db", f"postgresql+psycopg://u:x@{PLANTED}@127.0.0.1:1/db"):
        connection(url).get_catalog()
        assert PLANTED not in str(redact(f"a task logs {url} and {make_url(url).host}"))  # whatever prints it
    with pytest.raises(CatalogUnavailableError) as raised:
        connection(f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:1/db").get_catalog().snapshot()
    assert PLANTED not in str(raised.value)
    for unparsed in (f"postgresql+psycopg://u:{PLANTED}@127.0.0.1:port/db", f"postgresql+psycopg://u:{PLANTED}@[::1/db"):
        with pytest.raises(CatalogConfigError, match="is not a database URL") as refused:
            connection(unparsed).get_catalog()
        assert PLANTED not in str(refused.value)
    with pytest.raises(CatalogConfigError, match="connection 'planted': extra catalog must be a URL string .*, not a dict"):
        connection({"url": f"postgresql+psycopg://u:{PLANTED}@h/db"}).get_catalog()


def test_a_plan_step_whose_catalog_dies_after_leasing_fails_with_its_own_error_and_abandons_its_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan task fails after leasing (explaining itself) and its catalog is gone: the release fails too. The
    task fails with its own error, not the release's, and the plans are recorded as abandoned, so the retry plans
    the same files at once (the plan step releases abandoned plans first) instead of an hour later."""
    import time

    from logcompact_airflow.operators import compaction as operators
    from logcompact_airflow.operators.compaction import LogcompactPlanOperator

    store = LocalStore(tmp_path / "store")
    monkeypatch.setenv("AIRFLOW_CONN_DYING", json.dumps({"conn_type": "generic", "extra": {"store": store.uri}}))
    catalog = Catalog(store)
    now = int(time.time() * 1000)
    create_topic(catalog, "accounts", now=now, cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=now)

    def broken(*args, **kwargs):
        raise ConnectionError("the catalog database went away while explaining")

    def release_fails(self, plan_id: str) -> None:
        raise CatalogUnavailableError(f"catalog {self.url} cannot be reached or read (gone)")

    explain_run, release = operators.explain_run, Catalog.release
    monkeypatch.setattr(operators, "explain_run", broken)
    monkeypatch.setattr(Catalog, "release", release_fails)
    with pytest.raises(ConnectionError, match="went away while explaining"):
        LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="dying", force=True).execute({})
    (plan_id,) = abandoned_plans(store)
    assert {lease.plan_id for lease in catalog.snapshot().leases(now + 1).values()} == {plan_id}
    monkeypatch.setattr(operators, "explain_run", explain_run)
    monkeypatch.setattr(Catalog, "release", release)
    (job,) = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="dying", force=True).execute({})
    assert job["plan_id"] != plan_id and job["label"].startswith(f"{job['plan_id'][-12:]} g0 of 1: accounts/0 L0>L1, ") and abandoned_plans(store) == []


@given(st.lists(st.tuples(*[st.integers(-(2**63), 2**63 - 1)] * 8), min_size=1, max_size=50))
def test_bindings_by_column_equal_the_binding_by_row(rows) -> None:
    """A commit binds its rows by columns (`section_crc_bindings`), readers check them a row at a time."""
    assert schema.section_crc_bindings(*zip(*rows)).tolist() == [schema.section_crc_binding(*row) for row in rows]
