"""A plan's stored form: a header (`plan.json`, JSON, and `inputs.arrow`, the input files without their sections:
`encode_header`, `decode_header`) and one Arrow document per group with that group's sections and per-partition
floors (`encode_groups`, `decode_group`), so a group's workers read their own part and the commit reads the
header alone (`plans.documents` keeps them in the store). Stored sections leave out the key sketches, which only
the planner reads."""

from __future__ import annotations

from collections.abc import Collection
from itertools import repeat
from typing import get_type_hints

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.collector import collector_paused
from logcompact.exceptions import InvalidPlanError
from logcompact.format.layout import SectionInfo
from logcompact.plans.grouping import input_sections
from logcompact.plans.json_form import SECTION_TYPES, group_metadata_from_json, group_metadata_to_json, header_document, header_from_document, header_to_json
from logcompact.plans.model import InputFile, Plan, PlanHeader
from logcompact.topics import Topic

# Every SectionInfo field the engine reads is a column, typed from its annotation, so fields the format adds flow
# through. The key sketch is the planner's alone (its estimates): a stored plan's sections go without it.
_ARROW_TYPES = {str: pa.string(), int: pa.int64(), bytes: pa.binary()}
_PLANNER_ONLY = {"key_sketch": SectionInfo._field_defaults["key_sketch"]}


def _column_type(kind: type) -> pa.DataType:
    # Strings (topics, compressions) repeat: stored once each, as a dictionary.
    return pa.dictionary(pa.int32(), pa.string()) if kind is str else _ARROW_TYPES[kind]


INPUTS_SCHEMA = pa.schema([pa.field(name, _ARROW_TYPES[kind], nullable=False) for name, kind in get_type_hints(InputFile).items()])
GROUP_SCHEMA = pa.schema(
    [
        pa.field("file", pa.int32(), nullable=False),  # the section's file: its row in the plan's inputs
        pa.field("first_offset", pa.int64(), nullable=False),
        *(pa.field(name, _column_type(kind), nullable=False) for name, kind in SECTION_TYPES.items() if name not in _PLANNER_ONLY),
        pa.field("outside_floor", pa.int64()),
        pa.field("first_uncleanable", pa.int64()),
        # The partition's aborted ranges (`Plan.aborted`), on each of its rows: their first and last offsets.
        pa.field("aborted_first", pa.list_(pa.int64())),
        pa.field("aborted_last", pa.list_(pa.int64())),
    ]
)
# The group document's schema metadata: the group's settings, topics and PlanGroup, as JSON.
GROUP_METADATA_KEY = b"logcompact.plan"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def encode_header(header: PlanHeader) -> tuple[bytes, bytes]:
    """`plan.json` (settings, topics, groups) and `inputs.arrow` (the input files, one row each)."""
    columns = list(zip(*header.inputs)) if header.inputs else [()] * len(InputFile._fields)
    inputs = pa.table([pa.array(c, f.type) for c, f in zip(columns, INPUTS_SCHEMA)], schema=INPUTS_SCHEMA)
    return header_to_json(header), _arrow_file(inputs)


def decode_header(text: bytes, inputs: bytes, source: str) -> PlanHeader:
    """The header `encode_header` wrote, checked."""
    document = header_document(text, source)
    table = _arrow_table(inputs, INPUTS_SCHEMA, f"{source} inputs")
    with collector_paused():
        files = tuple(map(InputFile._make, zip(*(_column(table, name) for name in InputFile._fields))))
    return header_from_document(document, files, source)


def encode_groups(plan: Plan) -> list[bytes]:
    """The plan's group documents, one per group in order: Arrow IPC files (zstd), one row per section, in the
    plan's file order. The sections are taken as columns (`input_sections`: read for a planned plan, no section
    object built), then dealt to their groups by their (topic, partition) codes."""
    sections = input_sections(plan.inputs).table
    columns = {"file": sections.column("file").combine_chunks(), "first_offset": sections.column("first_offset").combine_chunks()}
    for name in SECTION_TYPES:
        if name not in _PLANNER_ONLY:
            values = sections.column(name).combine_chunks()
            columns[name] = values.dictionary_encode() if SECTION_TYPES[name] is str else values
    codes = _partition_codes(columns["topic"], columns["partition"], plan.topics)
    for column, per_partition in (("outside_floor", plan.outside_floors), ("first_uncleanable", plan.first_uncleanable)):
        keys = _partition_codes(
            pa.array([t for t, _ in per_partition], pa.string()), pa.array([p for _, p in per_partition], pa.int64()), plan.topics
        )
        columns[column] = _lookup(codes, keys, np.fromiter(per_partition.values(), np.int64, len(per_partition)))
    aborted = sorted(plan.aborted.items())
    keys = _partition_codes(pa.array([t for (t, _), _ in aborted], pa.string()), pa.array([p for (_, p), _ in aborted], pa.int64()), plan.topics)
    places = _lookup(codes, keys, np.arange(len(aborted), dtype=np.int64))
    for column, end in (("aborted_first", 0), ("aborted_last", 1)):
        columns[column] = pa.array([[r[end] for r in ranges] for _, ranges in aborted], pa.list_(pa.int64())).take(places)
    table = pa.table(columns, schema=GROUP_SCHEMA)
    firsts = [g.first for g in plan.groups[1:] if g.first is not None]  # all of them in a checked plan
    starts = _partition_codes(pa.array([t for t, _ in firsts], pa.string()), pa.array([p for _, p in firsts], pa.int64()), plan.topics)
    numbers = np.searchsorted(starts, codes, side="right")
    documents = []
    for group in plan.groups:
        rows = table if len(plan.groups) == 1 else table.filter(pa.array(numbers == group.group))
        topics = pc.unique(rows.column("topic").combine_chunks().dictionary_decode()).to_pylist() if rows.num_rows else []
        metadata = group_metadata_to_json(plan, group, topics)
        documents.append(_arrow_file(rows.replace_schema_metadata({GROUP_METADATA_KEY: metadata})))
    return documents


def _partition_codes(topics: pa.Array, partitions: pa.Array, described: dict[str, Topic]) -> np.ndarray:
    """(topic, partition) pairs as int64 codes that sort as the pairs do: the topic's rank among the plan's topic
    names, then the partition number."""
    ranks = pc.fill_null(pc.index_in(topics, value_set=pa.array(sorted(described), pa.string())), -1)  # -1: not described
    return (ranks.to_numpy().astype(np.int64) << 32) | partitions.to_numpy(zero_copy_only=False).astype(np.int64)


def _lookup(codes: np.ndarray, keys: np.ndarray, values: np.ndarray) -> pa.Array:
    """Per code, the value of its key (null where none): a vectorized dictionary lookup."""
    if not len(keys):
        return pa.nulls(len(codes), pa.int64())
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    at = np.minimum(np.searchsorted(keys, codes), len(keys) - 1)
    return pa.array(values[at], pa.int64(), mask=keys[at] != codes)


def group_partition_bytes(data: bytes, source: str) -> dict[TopicPartition, int]:
    """Per topic-partition of a group document, the uncompressed bytes of its sections (what slices are dealt by),
    without building its sections."""
    table = _arrow_table(data, GROUP_SCHEMA, source)
    sums = table.group_by(["topic", "partition"]).aggregate([("uncompressed_bytes", "sum")])
    return dict(zip(zip(_column(sums, "topic"), _column(sums, "partition")), _column(sums, "uncompressed_bytes_sum")))


def decode_group(
    data: bytes, inputs: bytes, source: str, partitions: Collection[TopicPartition] | None = None, slice: int = 0
) -> Plan:
    """The piece of a plan a group document holds, its files from the plan's `inputs.arrow`, validated; or slice
    `slice` of it: the sections of `partitions`."""
    table = _arrow_table(data, GROUP_SCHEMA, source)
    files = _arrow_table(inputs, INPUTS_SCHEMA, f"{source}: the plan's inputs")
    metadata = (table.schema.metadata or {}).get(GROUP_METADATA_KEY)
    if metadata is None:
        raise InvalidPlanError(f"{source}: the group document has no {GROUP_METADATA_KEY.decode()} metadata; plan again")
    settings, topics, group = group_metadata_from_json(metadata, source)
    if partitions is not None:
        wanted = list(partitions)
        wanted_codes = _partition_codes(pa.array([t for t, _ in wanted], pa.string()), pa.array([p for _, p in wanted], pa.int64()), topics)
        codes = _partition_codes(table.column("topic").combine_chunks().dictionary_decode(), table.column("partition").combine_chunks(), topics)
        table = table.filter(pa.array(np.isin(codes, wanted_codes)))
    bounds = pc.min_max(table.column("file")).as_py()
    if table.num_rows and (bounds["min"] < 0 or bounds["max"] >= files.num_rows):
        raise InvalidPlanError(f"{source}: a section names file {bounds['max']}, beyond the plan's {files.num_rows} inputs; plan again")
    with collector_paused():
        columns = (repeat(_PLANNER_ONLY[name]) if name in _PLANNER_ONLY else _column(table, name) for name in SectionInfo._fields)
        infos = list(map(SectionInfo._make, zip(*columns)))
        sections = list(map(CatalogSection, infos, _column(table, "first_offset")))
        # Rows are in the plan's file order: each run of one file is that file's sections.
        rows = _column(table, "file")
        used = sorted(set(rows))
        described = dict(zip(used, map(InputFile._make, zip(*(_column(files.take(used), name) for name in InputFile._fields)))))
        inputs_of_piece, start = [], 0
        for end in [n for n in range(1, len(rows)) if rows[n] != rows[n - 1]] + ([len(rows)] if rows else []):
            key, level, size, created_ms = described[rows[start]]
            inputs_of_piece.append(DataFile(key, level, size, created_ms, tuple(sections[start:end])))
            start = end
        floors = {(i.topic, i.partition): floor for i, floor in zip(infos, _column(table, "outside_floor")) if floor is not None}
        young = {(i.topic, i.partition): offset for i, offset in zip(infos, _column(table, "first_uncleanable")) if offset is not None}
        aborted = {}
        for i, firsts, lasts in zip(infos, _column(table, "aborted_first"), _column(table, "aborted_last")):
            if firsts is not None or lasts is not None:
                if firsts is None or lasts is None or len(firsts) != len(lasts):
                    raise InvalidPlanError(f"{source}: the aborted ranges of {i.topic}/{i.partition} have unmatched first and last offsets; plan again")
                aborted[(i.topic, i.partition)] = tuple(zip(firsts, lasts))
        piece = Plan(
            **settings, topics=topics, inputs=tuple(inputs_of_piece), outside_floors=floors, first_uncleanable=young, aborted=aborted,
            groups=(group,),
            group=group.group,
            slice=slice,
        )
        piece.validate(source, whole=False)
    return piece


def _arrow_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _arrow_table(data: bytes, schema: pa.Schema, source: str) -> pa.Table:
    """The table of an Arrow document, with every column of `schema` (named in the error when one is not)."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidPlanError(f"{source}: not an Arrow document of a plan ({str(exc).splitlines()[0]}); plan again") from None
    for expected in schema:
        index = table.schema.get_field_index(expected.name)
        if index < 0 or table.schema.field(index).type != expected.type:
            found = "missing" if index < 0 else f"of type {table.schema.field(index).type}"
            raise InvalidPlanError(f"{source}: column {expected.name!r} is {found}, expected {expected.type}; plan again")
        if not expected.nullable and table.column(index).null_count:
            raise InvalidPlanError(f"{source}: column {expected.name!r} has nulls; plan again")
    return table


def _column(table: pa.Table, name: str) -> list:
    column = table.column(name).combine_chunks()
    if pa.types.is_dictionary(column.type):
        names = column.dictionary.to_pylist()
        return [names[i] for i in column.indices.to_numpy(zero_copy_only=False).tolist()]
    if pa.types.is_integer(column.type) and column.null_count == 0:
        return column.to_numpy().tolist()
    return column.to_pylist()
