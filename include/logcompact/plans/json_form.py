"""A plan's JSON: the single document (`plan_to_json`, `plan_from_json`) that `logcompact plan` prints and
`compact --plan` reads, and the JSON fields the stored form shares with it (the header's `plan.json`, the group
documents' metadata, job results' files). Anything malformed is an InvalidPlanError naming the field."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, get_type_hints

from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.collector import collector_paused
from logcompact.exceptions import InvalidPlanError, InvalidTopicError
from logcompact.format.layout import SectionInfo
from logcompact.keys import PLAN_ID_PATTERN
from logcompact.limits import MAX_BUFFER_BYTES, MAX_BYTE_COUNT, MAX_LEVEL, MAX_TARGET_FILE_BYTES, MIN_BUFFER_BYTES
from logcompact.plans.grouping import PlanGroup
from logcompact.plans.model import SETTING_FIELDS, InputFile, Plan, PlanHeader, check_shape
from logcompact.topics import MAX_PARTITIONS, Topic

# 3: `first_uncleanable` leaves out the plan's own inputs, whose first young record the engine finds (an
# engine reading format 2 would deduplicate them).
# 4: `first_uncleanable` holds each compacted partition's LSO where an open transaction holds it (an engine reading
# format 3 applies it to min-lag topics only), and `aborted` the aborted transactions' ranges to drop.
PLAN_FORMAT = 4

SECTION_TYPES = get_type_hints(SectionInfo)  # each SectionInfo field's type, as the forms write it
_BYTES_FIELDS = [name for name in SectionInfo._fields if SECTION_TYPES[name] is bytes]
_KIND_NAMES = {int: "an integer", str: "a string"}


# -- the single document ------------------------------------------------------------------------------------


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        **settings_to_dict(plan),
        "topics": [t.to_dict() for t in plan.topics.values()],
        "groups": [group_to_dict(g) for g in plan.groups],
        "inputs": [file_to_json(f) for f in plan.inputs],
        "outside_floors": [[t, p, floor] for (t, p), floor in sorted(plan.outside_floors.items())],
        "first_uncleanable": [[t, p, offset] for (t, p), offset in sorted(plan.first_uncleanable.items())],
        "aborted": [[t, p, [list(r) for r in ranges]] for (t, p), ranges in sorted(plan.aborted.items())],
        "set_aside": [list(tp) for tp in plan.set_aside],
    }


def plan_to_json(plan: Plan) -> str:
    with collector_paused():
        return json.dumps(plan_to_dict(plan), separators=(",", ":"))


def plan_from_dict(document: Any, source: str = "plan") -> Plan:
    """A validated plan; anything malformed is an InvalidPlanError naming the field."""
    check_format(document, source)
    if "inputs" not in document and "groups" in document:
        raise InvalidPlanError(
            f"{source}: this is the header of a stored plan, whose inputs and sections are in the documents beside it; "
            "pass the plan's directory"
        )
    with _malformed("plan", source, "regenerate it with `logcompact plan`"):
        with collector_paused():
            inputs = [file_from_json(entry, source) for entry in _list(document, "inputs", source)]
        plan = Plan(
            **settings_from_dict(document, source),
            topics=topics_from_dict(document, source),
            groups=_groups_from_dict(document, source),
            outside_floors=_offsets_from_dict(document, "outside_floors", source),
            first_uncleanable=_offsets_from_dict(document, "first_uncleanable", source),
            aborted=_ranges_from_dict(document, "aborted", source),
            set_aside=_set_aside_from_dict(document, source),
            inputs=tuple(inputs),
        )
    plan.validate(source)
    return plan


def plan_from_json(text: str, source: str = "plan") -> Plan:
    with collector_paused():
        return plan_from_dict(parse_json(text, source), source)


# -- the stored header's plan.json and the group documents' metadata -----------------------------------------


def header_to_json(header: PlanHeader) -> bytes:
    """`plan.json`: a header's settings, topics, groups and set-aside partitions (its inputs are an Arrow document)."""
    document = {
        **settings_to_dict(header), "topics": [t.to_dict() for t in header.topics.values()],
        "groups": [group_to_dict(g) for g in header.groups], "set_aside": [list(tp) for tp in header.set_aside],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def header_document(text: bytes, source: str) -> dict:
    """`plan.json` parsed, its format checked: read before the inputs, so a plan of another format says so."""
    document = parse_json(text, source)
    check_format(document, source)
    return document


def header_cluster_id(text: bytes, source: str) -> str:
    """The cluster a stored plan's `plan.json` names: what a group's run checks its store against first."""
    document = header_document(text, source)
    with _malformed("plan header", source):
        return _text(document, "cluster_id", source)


def header_from_document(document: dict, inputs: tuple[InputFile, ...], source: str) -> PlanHeader:
    """The header `plan.json` (`header_document`) describes, with its `inputs`, checked."""
    with _malformed("plan header", source):
        header = PlanHeader(
            **settings_from_dict(document, source),
            topics=topics_from_dict(document, source),
            inputs=inputs,
            groups=_groups_from_dict(document, source),
            set_aside=_set_aside_from_dict(document, source),
        )
    check_shape(header, source, whole=True)
    return header


def group_metadata_to_json(plan: Plan, group: PlanGroup, topics: list[str]) -> str:
    """A group document's metadata: the plan's settings, the group, and the topics of its sections."""
    return json.dumps(
        {**settings_to_dict(plan), "topics": [plan.topics[t].to_dict() for t in sorted(topics)], "group": group_to_dict(group)},
        separators=(",", ":"),
    )


def group_metadata_from_json(text: bytes, source: str) -> tuple[dict[str, Any], dict[str, Topic], PlanGroup]:
    """The settings, topics and group a group document's metadata holds."""
    document = parse_json(text, source)
    check_format(document, source)
    with _malformed("group metadata", source):
        return settings_from_dict(document, source), topics_from_dict(document, source), group_from_dict(_field(document, "group", source), source)


# -- fields ---------------------------------------------------------------------------------------------------


@contextmanager
def _malformed(what: str, source: str, fix: str = "plan again") -> Iterator[None]:
    """The fields' own checks name a field missing or of the wrong shape in words (`_field`, `_integer`, ...) and are
    raised as they are; whatever else a document's values make Python raise is one InvalidPlanError all the same."""
    try:
        yield
    except InvalidPlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidPlanError(f"{source}: malformed {what} ({type(exc).__name__}: {exc}); {fix}") from None


def settings_to_dict(plan: Plan | PlanHeader) -> dict[str, Any]:
    return {"format": PLAN_FORMAT, **{name: getattr(plan, name) for name in SETTING_FIELDS}}


def settings_from_dict(document: dict, source: str) -> dict[str, Any]:
    return {
        "plan_id": _plan_id(document, source),
        "cluster_id": _text(document, "cluster_id", source),
        "manifest_version": _integer(document, "manifest_version", 1, source=source),
        "now_ms": _integer(document, "now_ms", 0, 2**63 - 1, source=source),
        "mode": _text(document, "mode", source, "regular"),
        "target_level": _integer(document, "target_level", 1, MAX_LEVEL, source=source),
        "deduplicate": _boolean(document, "deduplicate", source),
        "buffer_bytes": _integer(document, "buffer_bytes", MIN_BUFFER_BYTES, MAX_BUFFER_BYTES, source=source),
        "target_file_bytes": _integer(document, "target_file_bytes", 1, MAX_TARGET_FILE_BYTES, source=source),
        "max_partition_bytes": _integer(document, "max_partition_bytes", 1, MAX_BYTE_COUNT, source=source),
        "compression": _text(document, "compression", source, "lz4"),
    }


def check_format(document: Any, source: str) -> None:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a plan is a JSON object")
    if document.get("format") != PLAN_FORMAT:
        raise InvalidPlanError(f"{source}: plan format {document.get('format')!r} is not supported (expected {PLAN_FORMAT}); plan again")


def group_to_dict(group: PlanGroup) -> dict:
    return {
        "group": group.group,
        "first": None if group.first is None else list(group.first),
        "last": None if group.last is None else list(group.last),
        "partitions": group.partitions,
        "bytes": group.bytes,
    }


def group_from_dict(document: Any, source: str) -> PlanGroup:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a group is an object {{group, first, last, partitions, bytes}}")
    name = f"group {document.get('group')!r}"
    return PlanGroup(
        _integer(document, "group", 0, source=source),
        _topic_partition(document, "first", f"{source}: {name}"),
        _topic_partition(document, "last", f"{source}: {name}"),
        _integer(document, "partitions", 0, source=f"{source}: {name}"),
        _integer(document, "bytes", 0, source=f"{source}: {name}"),
    )


def _groups_from_dict(document: dict, source: str) -> tuple[PlanGroup, ...]:
    return tuple(group_from_dict(g, source) for g in _list(document, "groups", source))


def _input_dict(data_file: DataFile | InputFile) -> dict[str, Any]:
    return {"key": data_file.key, "level": data_file.level, "size": data_file.size, "created_ms": data_file.created_ms}


def _input_from_dict(document: Any, source: str) -> tuple[str, int, int, int]:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: an input is an object {{key, level, size, created_ms}}")
    key = _text(document, "key", source)
    where = f"{source}: input {key}"
    return key, _integer(document, "level", 0, source=where), _integer(document, "size", 0, source=where), _integer(document, "created_ms", 0, source=where)


def file_to_json(data_file: DataFile) -> dict[str, Any]:
    """A file with its sections as JSON values (plans, job results, `logcompact files`): every SectionInfo field,
    bytes in base64, and the section's first offset."""
    return {**_input_dict(data_file), "sections": [_section_to_json(s) for s in data_file.sections]}


def file_from_json(document: Any, source: str) -> DataFile:
    """The file `file_to_json` wrote, checked field by field."""
    key, level, size, created_ms = _input_from_dict(document, source)
    sections = tuple(_section_from_json(s, f"{source}: input {key}") for s in _list(document, "sections", f"{source}: input {key}"))
    return DataFile(key, level, size, created_ms, sections)


def _section_to_json(section: CatalogSection) -> dict[str, Any]:
    fields = section.info._asdict()
    for name in _BYTES_FIELDS:
        fields[name] = base64.b64encode(fields[name]).decode()
    return {**fields, "first_offset": section.first_offset}


def _section_from_json(document: Any, source: str) -> CatalogSection:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a section is an object of the SectionInfo fields and first_offset")
    fields = dict(document)
    first_offset = _field(fields, "first_offset", source, "section field")
    del fields["first_offset"]
    unknown = set(fields) - set(SectionInfo._fields)
    if unknown:
        raise InvalidPlanError(f"{source}: section field(s) {', '.join(sorted(unknown))} unknown; plan again")
    for name in SectionInfo._fields:
        _field(fields, name, source, "section field")
    for name, value in fields.items():
        kind = SECTION_TYPES[name]
        if kind is bytes:
            try:
                fields[name] = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise InvalidPlanError(f"{source}: section field {name!r} is not base64") from None
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidPlanError(f"{source}: section field {name!r} is {value!r}: must be {_KIND_NAMES[kind]}")
    if not isinstance(first_offset, int) or isinstance(first_offset, bool):
        raise InvalidPlanError(f"{source}: section field 'first_offset' is {first_offset!r}: must be an integer")
    return CatalogSection(SectionInfo(**fields), first_offset)


def topics_from_dict(document: dict, source: str) -> dict[str, Topic]:
    topics = [_topic_from_dict(t, source) for t in _list(document, "topics", source)]
    return {topic.name: topic for topic in topics}


def _topic_from_dict(document: Any, source: str) -> Topic:
    """A topic as `Topic.to_dict` wrote it, its configs checked by the rules that let them in."""
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a topic is an object {{name, partitions, config, created_ms}}")
    name = _text(document, "name", source)
    where = f"{source}: topic {name[:80]!r}"
    partitions = _integer(document, "partitions", 1, MAX_PARTITIONS, source=where)
    created_ms = _integer(document, "created_ms", 0, source=where)
    config = _field(document, "config", where)
    if not isinstance(config, dict):
        raise InvalidPlanError(f"{where}: plan field 'config' must be an object of configs by Kafka name")
    try:
        return Topic.from_dict({"name": name, "partitions": partitions, "config": config, "created_ms": created_ms})
    except InvalidTopicError as exc:
        raise InvalidPlanError(f"{where}: {exc}; plan again") from None


def _offsets_from_dict(document: dict, name: str, source: str) -> dict[TopicPartition, int]:
    """A per-partition offset field, [[topic, partition, offset], ...]; a plan without it has none."""
    offsets = {}
    for entry in _list(document, name, source) if name in document else []:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and all(isinstance(v, int) for v in entry[1:])):
            raise InvalidPlanError(f"{source}: {name} entry {entry!r} is not [topic, partition, offset]")
        offsets[(entry[0], entry[1])] = entry[2]
    return offsets


def _ranges_from_dict(document: dict, name: str, source: str) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    """A per-partition field of offset ranges, [[topic, partition, [[first, last], ...]], ...]; a plan without it has
    none."""
    found = {}
    for entry in _list(document, name, source) if name in document else []:
        if not (
            isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], int) and isinstance(entry[2], list)
            and all(isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) for r in entry[2])
        ):
            raise InvalidPlanError(f"{source}: {name} entry {str(entry)[:200]} is not [topic, partition, [[first, last], ...]]")
        found[(entry[0], entry[1])] = tuple((first, last) for first, last in entry[2])
    return found


def _plan_id(document: dict, source: str) -> str:
    plan_id = _text(document, "plan_id", source)
    if not PLAN_ID_PATTERN.fullmatch(plan_id):
        raise InvalidPlanError(f"{source}: plan_id {plan_id[:80]!r} is not p<clock ms>-<12 hex digits>, as the planner names plans; plan again")
    return plan_id


def _set_aside_from_dict(document: dict, source: str) -> tuple[TopicPartition, ...]:
    entries = document.get("set_aside", [])
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], int) and not isinstance(e[1], bool)
        for e in entries
    ):
        raise InvalidPlanError(f"{source}: plan field 'set_aside' must be a list of [topic, partition]")
    return tuple(sorted((e[0], e[1]) for e in entries))


def parse_json(text: str | bytes, source: str) -> Any:
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except UnicodeDecodeError as exc:
        raise InvalidPlanError(f"{source}: not UTF-8 text (byte {exc.start}); plan again") from None
    except json.JSONDecodeError as exc:
        raise InvalidPlanError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise InvalidPlanError(f"{source}: JSON nested too deep to be a plan; plan again") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidPlanError(f"{source}: not a plan ({str(exc).splitlines()[0]}); plan again") from None


def _field(document: dict, name: str, source: str, what: str = "plan field") -> Any:
    """A field the form requires, or an InvalidPlanError saying it is missing."""
    if name not in document:
        raise InvalidPlanError(f"{source}: {what} {name!r} is missing; plan again")
    return document[name]


def _list(document: dict, name: str, source: str) -> list:
    value = _field(document, name, source)
    if not isinstance(value, list):
        raise InvalidPlanError(f"{source}: plan field {name!r} must be a list")
    return value


def _topic_partition(document: dict, name: str, source: str) -> TopicPartition | None:
    value = _field(document, name, source)
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
        raise InvalidPlanError(f"{source}: field {name!r} is {value!r}, not [topic, partition] or null")
    return value[0], value[1]


def _text(document: dict, name: str, source: str, default: str | None = None) -> str:
    value = document.get(name, default) if default is not None else _field(document, name, source)
    if not isinstance(value, str) or not value:
        raise InvalidPlanError(f"{source}: plan field {name!r} must be a non-empty string")
    return value


def _integer(document: dict, name: str, low: int, high: int | None = None, *, source: str) -> int:
    value = _field(document, name, source)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidPlanError(f"{source}: plan field {name!r} is {value!r}: must be an integer, {allowed}")
    return value


def _boolean(document: dict, name: str, source: str) -> bool:
    value = _field(document, name, source)
    if not isinstance(value, bool):
        raise InvalidPlanError(f"{source}: plan field {name!r} must be true or false")
    return value
