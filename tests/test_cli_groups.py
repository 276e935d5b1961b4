"""`logcompact groups` on a catalog: list, describe with lag, reset-offsets (each way of choosing the offsets, a dry
run unless --execute, refused for a group with members), delete (refused for a group with members), and one-line
errors for what cannot be done. Kafka's own kafka-consumer-groups.sh against an agent, compared with these, is in
tests/kafka/test_group_admin.py."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from click.testing import CliRunner

from logcompact.catalog import Catalog
from logcompact.catalog.groups import CommittedOffset, GroupRow, StoredMember
from logcompact.cli import cli
from logcompact.ingest import Record
from tests.helpers import create_topic, produce_records

TOPIC, OTHER = "events", "audit"
BASE_MS = 1_700_000_000_000  # the records' timestamps: offset n at BASE_MS + 1000 n


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, 2)
    create_topic(catalog, OTHER, 1)
    for partition in range(2):
        produce_records(catalog, TOPIC, [Record(partition, b"k%d" % n, b"v", BASE_MS + 1000 * n) for n in range(10)])
    return catalog


def invoke(catalog: Catalog, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "groups", *args])


def groups_json(catalog: Catalog, *args: str) -> list[dict[str, Any]]:
    done = invoke(catalog, *args, "--json")
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in done.output.splitlines()]


def refused(catalog: Catalog, *args: str) -> str:
    """The one-line error: `logcompact` prints it after "logcompact: error: ", click's runner after "Error: " (below
    the usage, for a usage error)."""
    done = invoke(catalog, *args)
    assert done.exit_code != 0
    [line] = [line for line in done.output.splitlines() if line.startswith("Error: ")]
    return line.removeprefix("Error: ")


def commit(catalog: Catalog, group: str, offsets: dict[tuple[str, int], int]) -> None:
    catalog.commit_offsets(group, {key: CommittedOffset(offset, -1, "", BASE_MS) for key, offset in offsets.items()})


def assignment(partitions: dict[str, list[int]]) -> bytes:
    """A ConsumerProtocolAssignment v0, as a consumer group's leader writes it."""
    out = b"\x00\x00" + len(partitions).to_bytes(4, "big")
    for topic, indexes in partitions.items():
        out += len(topic).to_bytes(2, "big") + topic.encode() + len(indexes).to_bytes(4, "big") + b"".join(i.to_bytes(4, "big") for i in indexes)
    return out + b"\xff\xff\xff\xff"  # no user data


def stable_group(catalog: Catalog, group: str) -> None:
    """The row a coordinator writes for a Stable group of one consumer assigned partition 1 of TOPIC."""
    member = StoredMember("m-1", None, "client-1", 10_000, 30_000, (("range", b""),), assignment({TOPIC: [1]}), "/10.0.0.7")
    catalog.save_group(GroupRow(group, 0, 3, "consumer", "range", "Stable", "m-1", (member,), BASE_MS))


def test_list_and_describe_with_lag_and_members(catalog: Catalog) -> None:
    commit(catalog, "idle", {(TOPIC, 0): 4})
    stable_group(catalog, "live")
    commit(catalog, "live", {(TOPIC, 0): 9})
    assert groups_json(catalog, "list") == [{"group": "idle", "state": "Empty", "protocol_type": ""},
                                            {"group": "live", "state": "Stable", "protocol_type": "consumer"}]
    [described] = groups_json(catalog, "describe", "live")
    assert (described["state"], described["protocol_type"], described["protocol"], described["generation"]) == ("Stable", "consumer", "range", 3)
    assert described["members"] == [{"member_id": "m-1", "group_instance_id": None, "client_id": "client-1", "host": "/10.0.0.7", "partitions": [[TOPIC, 1]]}]
    assert described["partitions"] == [
        {"topic": TOPIC, "partition": 0, "committed_offset": 9, "log_end_offset": 10, "lag": 1, "member_id": None, "host": None, "client_id": None},
        {"topic": TOPIC, "partition": 1, "committed_offset": None, "log_end_offset": 10, "lag": None, "member_id": "m-1", "host": "/10.0.0.7",
         "client_id": "client-1"},
    ]
    table = invoke(catalog, "describe", "live").output.splitlines()
    assert table[0] == "group live: Stable, protocol consumer/range, generation 3, 1 members"
    assert table[1].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert table[2].split() == ["live", TOPIC, "0", "9", "10", "1", "-", "-", "-"]
    assert table[3].split() == ["live", TOPIC, "1", "-", "10", "-", "m-1", "/10.0.0.7", "client-1"]
    assert refused(catalog, "describe", "ghost") == "consumer group 'ghost' does not exist: `logcompact groups list` lists the groups"


def test_reset_offsets_each_way_as_a_dry_run_then_executed(catalog: Catalog) -> None:
    commit(catalog, "g", {(TOPIC, 0): 5, (TOPIC, 1): 5})

    def plan(*how: str) -> dict[tuple[str, int], int]:
        return {(r["topic"], r["partition"]): r["new_offset"] for r in groups_json(catalog, "reset-offsets", "g", *how)}

    assert plan("--topic", TOPIC, "--to-earliest") == {(TOPIC, 0): 0, (TOPIC, 1): 0}
    assert plan("--topic", f"{TOPIC}:1", "--to-latest") == {(TOPIC, 1): 10}
    assert plan("--topic", f"{TOPIC}:0", "--to-offset", "99") == {(TOPIC, 0): 10}  # within the log, as Kafka
    assert plan("--all-topics", "--shift-by", "-7") == {(TOPIC, 0): 0, (TOPIC, 1): 0}
    assert plan("--all-topics", "--shift-by", "2") == {(TOPIC, 0): 7, (TOPIC, 1): 7}
    moment = datetime.datetime.fromtimestamp((BASE_MS + 3500) / 1000, datetime.UTC).replace(tzinfo=None).isoformat()
    assert plan("--topic", f"{TOPIC}:0", "--to-datetime", moment) == {(TOPIC, 0): 4}  # the first record at or after it
    assert plan("--topic", f"{TOPIC}:0", "--to-datetime", "2100-01-01T00:00:00+02:00") == {(TOPIC, 0): 10}  # none: the log end
    assert {key: c.offset for key, c in catalog.committed_offsets("g").items()} == {(TOPIC, 0): 5, (TOPIC, 1): 5}  # dry runs
    dry = invoke(catalog, "reset-offsets", "g", "--topic", TOPIC, "--to-earliest")
    assert dry.exit_code == 0 and "dry run: nothing stored" in dry.output
    done = groups_json(catalog, "reset-offsets", "g", "--topic", f"{TOPIC}:0", "--to-offset", "3", "--execute")
    assert done == [{"group": "g", "topic": TOPIC, "partition": 0, "new_offset": 3, "previous_offset": 5, "executed": True}]
    assert catalog.committed_offsets("g")[(TOPIC, 0)].offset == 3
    # a group that does not exist yet is made, Empty, as Kafka's coordinator makes it for an admin's commit
    groups_json(catalog, "reset-offsets", "new", "--topic", OTHER, "--to-latest", "--execute")
    assert catalog.committed_offsets("new")[(OTHER, 0)].offset == 0
    assert {"group": "new", "state": "Empty", "protocol_type": ""} in groups_json(catalog, "list")


def test_reset_offsets_refusals_are_one_line(catalog: Catalog) -> None:
    stable_group(catalog, "live")
    assert refused(catalog, "reset-offsets", "live", "--topic", TOPIC, "--to-earliest", "--execute") == (
        "consumer group 'live' has members (it is Stable): stop its consumers, so it is Empty, to reset its offsets")
    assert "has none committed there" in refused(catalog, "reset-offsets", "fresh", "--topic", TOPIC, "--shift-by", "1")
    assert "is not a partition of 'events' (0 to 1)" in refused(catalog, "reset-offsets", "g", "--topic", f"{TOPIC}:2", "--to-earliest")
    assert "topic 'nowhere' does not exist" in refused(catalog, "reset-offsets", "g", "--topic", "nowhere", "--to-earliest")
    assert "exactly one of" in refused(catalog, "reset-offsets", "g", "--topic", TOPIC, "--to-earliest", "--to-latest")
    assert "--all-topics" in refused(catalog, "reset-offsets", "g", "--to-earliest")
    assert "is not an ISO 8601 time" in refused(catalog, "reset-offsets", "g", "--topic", TOPIC, "--to-datetime", "yesterday")


def test_delete_an_empty_group_and_refuse_one_with_members(catalog: Catalog) -> None:
    commit(catalog, "idle", {(TOPIC, 0): 4})
    stable_group(catalog, "live")
    assert groups_json(catalog, "delete", "idle") == [{"deleted": "idle"}]
    assert catalog.committed_offsets("idle") == {} and catalog.group("idle") is None
    assert refused(catalog, "delete", "live") == (
        "consumer group 'live' has members (it is Stable): stop its consumers, so it is Empty, to delete it")
    assert catalog.group("live") is not None
    assert refused(catalog, "delete", "idle") == "consumer group 'idle' does not exist: `logcompact groups list` lists the groups"
