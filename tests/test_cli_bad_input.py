"""The bad-input table: every command, fed bad input, prints one line and writes nothing.

Each case runs `logcompact` in this process (`tests.support.cli_cases.run_in_process`; a few also as a real
process) against one small cluster, and must end with exit code 1 (2 for a usage error), stderr one line
`logcompact: error: ...` naming what is wrong, no traceback, and the store, the catalog and the working
directory as they were. The test prints its counts (`pytest -s`) and fails on any miss.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import NamedTuple

import pytest

from logcompact.limits import MAX_BUFFER_BYTES, MAX_BYTE_COUNT, MAX_TARGET_FILE_BYTES
from tests.support.cli_cases import CATALOG, CATALOG_COMMANDS, GOOD_LINE, Case, Outcome, case, changes, run_in_process, run_process, tree_state

NOW = "1700000000000"
DEEP = 100_000  # nesting the JSON parser cannot follow (the campaign's RecursionError)


def produce(name: str, says: str, stdin: bytes, topic: str = "accounts", **options) -> Case:
    return case(f"produce: {name}", 1, says, "produce", topic, stdin=stdin, **options)


def _nested(depth: int, opening: str = "[", closing: str = "]") -> str:
    return opening * depth + closing * depth


# -- global options and the store ------------------------------------------------------------------------

GLOBAL = [
    case("no store", 2, "no store given: pass --store URI or set LOGCOMPACT_STORE", "topic", "list", cluster=False),
    case("no store, produce", 2, "no store given", "produce", "accounts", cluster=False, stdin=GOOD_LINE),
    case("store: ftp scheme", 1, "is not supported: use file:///path or s3://bucket/prefix", "--store", "ftp://host/x", "topic", "list", cluster=False),
    case("store: no scheme", 1, "is not supported", "--store", "{store}", "topic", "list", cluster=False),
    case("store: relative file path", 1, "needs an absolute path", "--store", "file://relative/path", "topic", "list", cluster=False),
    case("store: file URI with a host", 1, "needs an absolute path", "--store", "file://host/tmp/x", "files", cluster=False),
    case("store: s3 without a bucket", 1, "names no bucket", "--store", "s3:///prefix", "topic", "list", cluster=False),
    case("store: s3 without a catalog", 1, "needs a catalog database: pass --catalog", "--store", "s3://bucket/cluster", "topic", "list", cluster=False),
    case("store: s3 without a catalog, create", 1, "needs a catalog database", "--store", "s3://bucket/cluster", "topic", "create", "t",
         "--partitions", "1", cluster=False),
    case("store from the environment: bad", 1, "is not supported", "topic", "list", cluster=False, env={"LOGCOMPACT_STORE": "ftp://x"}),
    case("store: missing option value", 2, "requires an argument", "--store", cluster=False),
    case("store: empty directory, list", 1, "no logcompact cluster in", "--store", "file://{work}/empty", "topic", "list", cluster=False),
    case("store: empty directory, produce", 1, "no logcompact cluster in", "--store", "file://{work}/empty", "produce", "accounts",
         cluster=False, stdin=GOOD_LINE),
    case("store: empty directory, consume", 1, "no logcompact cluster in", "--store", "file://{work}/empty", "consume", "accounts",
         "--partition", "0", cluster=False),
    case("store: empty directory, compact", 1, "no logcompact cluster in", "--store", "file://{work}/empty", "compact", "--all", cluster=False),
    case("store: empty directory, gc", 1, "no logcompact cluster in", "--store", "file://{work}/empty", "gc", cluster=False),
    case("store: a missing directory, files", 1, "no logcompact cluster in", "--store", "file://{work}/missing", "files", cluster=False),
]
for command in (["topic", "list"], ["topic", "create", "t", "--partitions", "1"], ["files"], ["produce", "t"], ["gc"]):
    GLOBAL.append(case(f"store is a file: {' '.join(command[:2])}", 1, "is a file, not a directory", "--store", "file://{work}/a-file",
                       *command, cluster=False, stdin=GOOD_LINE))
    GLOBAL.append(case(f"store under a file: {' '.join(command[:2])}", 1, "is a file, not a directory", "--store",
                       "file://{work}/a-file/store", *command, cluster=False, stdin=GOOD_LINE))

GLOBAL += [
    case("store: a name too long, list", 1, "File name too long", "--store", "file://{work}/" + "s" * 300, "topic", "list", cluster=False),
    case("store: a name too long, create", 1, "File name too long", "--store", "file://{work}/" + "s" * 300, "topic", "create", "t",
         "--partitions", "1", cluster=False),
]

# An unreadable manifest: the catalog database of a file:// store, damaged.
DAMAGES = {
    "garbage": "file is not a database",
    "text": "file is not a database",
    "truncated": "database disk image is malformed",
    "header only": "database disk image is malformed",
    "directory": "unable to open database file",
    "zero-length": "no logcompact cluster in",
}
DAMAGED = [
    case(f"catalog.db {damage}: {' '.join(command[:2])}", 1, says, *command, damage=damage, stdin=GOOD_LINE,
         process=command == ["files"])
    for damage, says in DAMAGES.items()
    for command in CATALOG_COMMANDS
    if not (damage == "zero-length" and command[0:2] == ["topic", "create"])
]
# An emptied catalog beside data files: a new cluster there would hand out the files' offsets again.
DAMAGED.append(case("catalog.db zero-length: topic create", 1, "restore the catalog database from a backup", "topic", "create", "new",
                    "--partitions", "1", damage="zero-length"))
# Damaged rows that a command reading them refuses in one line: a live file's key leading out of the store's data
# (nothing outside the store is read), a topic's cleanup.policy the product does not know (never run as no policy).
FIRST_FILE = "file_id = (SELECT min(file_id) FROM files)"  # an accounts file, with sections in both partitions
ROW_DAMAGES = {
    "file key climbing out": f"UPDATE files SET key = 'data/../../x.seg' WHERE {FIRST_FILE}",
    "file key absolute": f"UPDATE files SET key = '/etc/hostname' WHERE {FIRST_FILE}",
    "cleanup.policy unknown": """UPDATE topics SET config = json_set(config, '$."cleanup.policy"', 'shred') WHERE name = 'accounts'""",
}
DAMAGED += [
    case("row file key climbing out: consume", 1, "catalog row of file 'data/../../x.seg' (section accounts/0, offsets 0 to 1) names no data file",
         "consume", "accounts", "--partition", "0", damage="file key climbing out", process=True),
    case("row file key absolute: consume", 1, "catalog row of file '/etc/hostname' (section accounts/1, offsets 0 to 1) names no data file",
         "consume", "accounts", "--partition", "1", damage="file key absolute"),
    *(case(f"row cleanup.policy unknown: {' '.join(command[:2])}", 1,
           "catalog row topics 'accounts' (topic_id 1) is damaged: its config", *command, damage="cleanup.policy unknown")
      for command in (["consume", "accounts", "--partition", "0"], ["compact", "--full"])),
    case("row cleanup.policy unknown: says which", 1, "(cleanup.policy='shred' is invalid: use delete, compact or compact,delete); "
         "restore the row from a backup", "consume", "accounts", "--partition", "0", damage="cleanup.policy unknown"),
]

CLOCK = [
    case("--now not a number", 2, "'abc' is not a valid integer", "--now", "abc", "topic", "list", cluster=False),
    case("--now a fraction", 2, "is not a valid integer", "--store", "file://{store}", "--now", "1.5", "files", cluster=False),
    case("--now empty", 2, "is not a valid integer", "--store", "file://{store}", "--now", "", "files", cluster=False),
    case("--now negative", 2, "is not in the range 0<=x<=9223372036854775807", "--store", "file://{store}", "--now", "-1", "topic", "create", "t", "--partitions", "1", cluster=False),
    case("--now beyond int64", 2, "is not in the range 0<=x<=9223372036854775807", "--store", "file://{store}", "--now", str(2**63), "topic", "create", "t", "--partitions", "1",
         cluster=False),
    case("--now beyond int64, produce", 2, "is not in the range 0<=x<=9223372036854775807", "--store", "file://{store}", "--now", str(10**30), "produce", "accounts",
         cluster=False, stdin=GOOD_LINE),
    case("LOGCOMPACT_NOW_MS not a number", 2, "is not a valid integer", "--store", "file://{store}", "files", cluster=False,
         env={"LOGCOMPACT_NOW_MS": "soon"}),
    case("command --now not a number", 2, "is not a valid integer", "gc", "--now", "later"),
    case("command --now beyond int64", 2, "is not in the range 0<=x<=9223372036854775807", "compact", "--all", "--now", str(2**64)),
    case("command --now negative", 2, "is not in the range 0<=x<=9223372036854775807", "plan", "--now", "-5"),
    case("unknown global option", 2, "No such option '--bogus'", "--bogus", "topic", "list", cluster=False),
    case("unknown command", 2, "No such command 'frobnicate'", "frobnicate"),
    case("no command after options", 2, "Missing command", "--verbose"),
]

# -- topics ------------------------------------------------------------------------------------------------

TOPICS = [
    case("topic: unknown subcommand", 2, "No such command 'rename'", "topic", "rename", "accounts"),
    case("topic list: extra argument", 2, "Got unexpected extra argument", "topic", "list", "accounts"),
    case("topic describe: no name", 2, "Missing argument 'NAME'", "topic", "describe"),
    case("topic describe: unknown", 1, "topic 'nope' does not exist", "topic", "describe", "nope"),
    case("topic describe: empty name", 1, "does not exist", "topic", "describe", ""),
    case("topic create: no name", 2, "Missing argument 'NAME'", "topic", "create", "--partitions", "1"),
    case("topic create: no partitions", 2, "Missing option '--partitions'", "topic", "create", "t"),
    case("topic create: exists", 1, "topic 'accounts' already exists", "topic", "create", "accounts", "--partitions", "1"),
    case("topic create: exists, other policy", 1, "already exists", "topic", "create", "clicks", "--partitions", "3", "--config",
         "cleanup.policy=compact"),
    case("topic create: partitions not a number", 2, "'two' is not a valid integer", "topic", "create", "t", "--partitions", "two"),
    case("topic create: config without a value", 2, "Option '--config' requires an argument", "topic", "create", "t", "--partitions", "1", "--config"),
    case("topic create: lone surrogate in the name", 1, "topic name '\\udcff' is invalid", "topic", "create", "\udcff", "--partitions", "1"),
]
for name in ("", ".", "..", "a/b", "a b", "x" * 250, "bad\x00name", "ünïcode", "t*", "../escape", "a\nb"):
    TOPICS.append(case(f"topic create: name {name[:20]!r}", 1, "is invalid: use 1 to 249 characters", "topic", "create", name,
                       "--partitions", "1"))
for partitions in ("0", "-1", "100001", str(10**30)):
    TOPICS.append(case(f"topic create: --partitions {partitions[:12]}", 1, "is out of range: use 1 to 100000", "topic", "create", "t",
                       "--partitions", partitions))
BAD_CONFIGS = [
    ("nokey", "is not KEY=VALUE"),
    ("=compact", "is not KEY=VALUE"),
    ("cleanup.policy=bogus", "cleanup.policy"),
    ("cleanup.policy=", "cleanup.policy"),
    ("retention.ms=abc", "retention.ms"),
    ("retention.ms=-5", "retention.ms=-5 is out of range"),
    ("retention.ms=1.5", "retention.ms"),
    (f"retention.ms={2**63}", "is out of range"),
    ("delete.retention.ms=-1", "is out of range"),
    ("min.compaction.lag.ms=-1", "is out of range"),
    ("max.compaction.lag.ms=0", "is out of range"),
    (f"max.compaction.lag.ms={10**40}", "is out of range"),
    ("segment.bytes=1024", "segment.bytes='1024' is not taken: the agent's flushes and the compactions' target sizes make the files; give 1073741824"),
    ("retention.bytes=1000", "retention.bytes='1000' is not taken: topics here have no size limit; give -1 or leave it out"),
    ("unknown.config=1", "unknown.config"),
]
for config, says in BAD_CONFIGS:
    TOPICS.append(case(f"topic create: --config {config[:30]}", 1 if "=" in config[1:] else 2, says, "topic", "create", "t",
                       "--partitions", "1", "--config", config))
    TOPICS.append(case(f"topic alter: --config {config[:30]}", 1 if "=" in config[1:] else 2, says, "topic", "alter", "accounts",
                       "--config", config))
TOPICS += [
    case("topic alter: no config", 2, "Missing option '--config'", "topic", "alter", "accounts"),
    case("topic alter: unknown topic", 1, "topic 'nope' does not exist", "topic", "alter", "nope", "--config", "retention.ms=5"),
    case("topic delete: unknown topic", 1, "topic 'nope' does not exist", "topic", "delete", "nope"),
    case("topic delete: no name", 2, "Missing argument 'NAME'", "topic", "delete"),
]

# -- produce -----------------------------------------------------------------------------------------------

PRODUCE = [
    case("produce: no topic", 2, "Missing argument 'TOPIC'", "produce", stdin=GOOD_LINE),
    produce("unknown topic", "topic 'nope' does not exist", GOOD_LINE, topic="nope"),
    produce("invalid UTF-8", "line 1: not UTF-8 (byte 40: invalid start byte)", b'{"partition": 0, "key": "k", "value": "\xff"}\n',
            process=True),
    produce("invalid UTF-8 on line 3", "line 3: not UTF-8", GOOD_LINE * 2 + b'{"partition": 0, "key": "\xc3"}\n'),
    produce("overlong UTF-8", "line 1: not UTF-8", b'{"partition": 0, "key": "\xc0\xaf"}\n'),
    produce("UTF-8 of a surrogate", "line 1: not UTF-8", b'{"partition": 0, "key": "\xed\xa0\x80"}\n'),
    produce("Latin-1 text", "line 2: not UTF-8", GOOD_LINE + '{"partition": 0, "key": "café"}\n'.encode("latin-1")),
    produce("UTF-16", "line 1: not UTF-8", '{"partition": 0, "key": "k"}\n'.encode("utf-16")),
    produce("lone surrogate in key", "line 1: key holds a lone surrogate \\ud800", b'{"partition": 0, "key": "\\ud800"}\n', process=True),
    produce("lone low surrogate in key", "line 1: key holds a lone surrogate \\udc00", b'{"partition": 0, "key": "a\\udc00b"}\n'),
    produce("lone surrogate in value", "line 2: value holds a lone surrogate", GOOD_LINE + b'{"partition": 0, "key": "k", "value": "\\udfff"}\n'),
    produce("lone surrogate in a header name", "line 1: header name '\\ud800' holds a lone surrogate",
            b'{"partition": 0, "key": "k", "headers": {"\\ud800": "x"}}\n'),
    produce("lone surrogate in a header value", "line 1: header 'trace' holds a lone surrogate",
            b'{"partition": 0, "key": "k", "headers": {"trace": "\\udbff"}}\n'),
    produce("surrogates in the wrong order", "lone surrogate \\ude00", b'{"partition": 0, "key": "\\ude00\\ud83d"}\n'),
    produce(f"arrays nested {DEEP} deep", "line 1: JSON nested too deep", _nested(DEEP).encode() + b"\n", process=True),
    produce(f"objects nested {DEEP} deep", "line 1: JSON nested too deep", ('{"a":' * DEEP + "1" + "}" * DEEP).encode() + b"\n"),
    produce("value nested too deep", "line 2: JSON nested too deep",
            GOOD_LINE + b'{"partition": 0, "key": "k", "value": ' + _nested(DEEP).encode() + b"}\n"),
    produce("unclosed nesting", "line 1: JSON nested too deep", b"[" * DEEP + b"\n"),
    produce("an integer of 5000 digits", "line 1: a number too long (Exceeds the limit (4300 digits)", b'{"partition": ' + b"1" * 5000 + b', "key": "k"}\n'),
    produce("not JSON", "line 1: not JSON", b"hello\n"),
    produce("not JSON on line 2", "line 2: not JSON", GOOD_LINE + b"not json\n"),
    produce("truncated JSON", "line 1: not JSON", b'{"partition": 0, "key": "k"\n'),
    produce("two objects on a line", "line 1: not JSON (Extra data)", b'{"partition": 0, "key": "k"} {"partition": 0, "key": "j"}\n'),
    produce("a byte order mark", "line 1: not JSON", b'\xef\xbb\xbf{"partition": 0, "key": "k"}\n'),
    produce("a NUL byte", "line 1: not JSON", b'{"partition": 0,\x00 "key": "k"}\n'),
    produce("a control character in a string", "line 1: not JSON (Invalid control character", b'{"partition": 0, "key": "a\x01b"}\n'),
    produce("single quotes", "line 1: not JSON", b"{'partition': 0, 'key': 'k'}\n"),
    produce("a JSON array", "line 1: expected a JSON object", b'[{"partition": 0, "key": "k"}]\n'),
    produce("a JSON string", "line 1: expected a JSON object", b'"record"\n'),
    produce("a JSON number", "line 1: expected a JSON object", b"42\n"),
    produce("JSON null", "line 1: expected a JSON object", b"null\n"),
    produce("JSON true", "line 1: expected a JSON object", b"true\n"),
    produce("no partition", "line 1: \"partition\" must be an integer", b'{"key": "k", "value": "v"}\n'),
    produce("partition a string", "\"partition\" must be an integer", b'{"partition": "0", "key": "k"}\n'),
    produce("partition a fraction", "\"partition\" must be an integer", b'{"partition": 0.5, "key": "k"}\n'),
    produce("partition true", "\"partition\" must be an integer", b'{"partition": true, "key": "k"}\n'),
    produce("partition null", "\"partition\" must be an integer", b'{"partition": null, "key": "k"}\n'),
    produce("partition NaN", "\"partition\" must be an integer", b'{"partition": NaN, "key": "k"}\n'),
    produce("partition Infinity", "\"partition\" must be an integer", b'{"partition": Infinity, "key": "k"}\n'),
    produce("partition negative", "partition -1 is not in 0 to 1", b'{"partition": -1, "key": "k"}\n'),
    produce("partition out of range", "partition 2 is not in 0 to 1", b'{"partition": 2, "key": "k"}\n'),
    produce("partition beyond int64", "is not in 0 to 1", b'{"partition": ' + str(2**70).encode() + b', "key": "k"}\n'),
    produce("partition out of range on line 2", "record 1 of topic 'accounts': partition 5", GOOD_LINE + b'{"partition": 5, "key": "k"}\n'),
    produce("no key, compacted topic", "record 0 of compacted topic 'accounts' has no key", b'{"partition": 0, "value": "v"}\n'),
    produce("null key, compacted topic", "has no key", b'{"partition": 1, "key": null, "value": "v"}\n'),
    produce("null key_b64, compacted topic", "has no key", b'{"partition": 1, "key_b64": null}\n'),
    produce("key an integer", "line 1: key must be a string or null (use key_b64 for bytes)", b'{"partition": 0, "key": 7}\n'),
    produce("key a list", "key must be a string or null", b'{"partition": 0, "key": ["k"]}\n'),
    produce("key an object", "key must be a string or null", b'{"partition": 0, "key": {"k": 1}}\n'),
    produce("value an integer", "value must be a string or null", b'{"partition": 0, "key": "k", "value": 1}\n'),
    produce("value true", "value must be a string or null", b'{"partition": 0, "key": "k", "value": true}\n'),
    produce("key_b64 not base64", "line 1: key_b64 is not valid base64", b'{"partition": 0, "key_b64": "***"}\n'),
    produce("key_b64 bad padding", "key_b64 is not valid base64", b'{"partition": 0, "key_b64": "abc"}\n'),
    produce("key_b64 beyond ASCII", "key_b64 is not valid base64", '{"partition": 0, "key_b64": "ä="}\n'.encode()),
    produce("key_b64 an integer", "key_b64 is not valid base64", b'{"partition": 0, "key_b64": 5}\n'),
    produce("value_b64 not base64", "value_b64 is not valid base64", b'{"partition": 0, "key": "k", "value_b64": "!!"}\n'),
    produce("value_b64 a list", "value_b64 is not valid base64", b'{"partition": 0, "key": "k", "value_b64": []}\n'),
    produce("timestamp a string", "\"timestamp\" must be integer milliseconds", b'{"partition": 0, "key": "k", "timestamp": "now"}\n'),
    produce("timestamp a fraction", "\"timestamp\" must be integer milliseconds", b'{"partition": 0, "key": "k", "timestamp": 1.5}\n'),
    produce("timestamp true", "\"timestamp\" must be integer milliseconds", b'{"partition": 0, "key": "k", "timestamp": true}\n'),
    produce("timestamp negative", "\"timestamp\" must be integer milliseconds from 0 to 9223372036854775807", b'{"partition": 0, "key": "k", "timestamp": -1}\n'),
    produce("timestamp beyond int64", "\"timestamp\" must be integer milliseconds from 0", b'{"partition": 0, "key": "k", "timestamp": ' + str(2**63).encode() + b"}\n"),
    produce("timestamp far beyond int64", "\"timestamp\" must be integer milliseconds from 0", b'{"partition": 0, "key": "k", "timestamp": ' + str(10**40).encode() + b"}\n"),
    produce("headers a list", "\"headers\" must be an object of strings", b'{"partition": 0, "key": "k", "headers": ["a"]}\n'),
    produce("headers a string", "\"headers\" must be an object of strings", b'{"partition": 0, "key": "k", "headers": "a=b"}\n'),
    produce("header value an integer", "\"headers\" must be an object of strings", b'{"partition": 0, "key": "k", "headers": {"a": 1}}\n'),
    produce("header value null", "\"headers\" must be an object of strings", b'{"partition": 0, "key": "k", "headers": {"a": null}}\n'),
    produce("header value an object", "\"headers\" must be an object", b'{"partition": 0, "key": "k", "headers": {"a": {"b": "c"}}}\n'),
    produce("delete topic: partition out of range", "partition 1 is not in 0 to 0", b'{"partition": 1, "value": "v"}\n', topic="clicks"),
    produce("delete topic: invalid UTF-8", "line 1: not UTF-8", b'{"partition": 0, "value": "\x80"}\n', topic="clicks"),
    produce("delete topic: key an integer", "key must be a string or null", b'{"partition": 0, "key": 1}\n', topic="clicks"),
    produce("good lines, then a bad one", "line 4: not JSON", GOOD_LINE * 3 + b"{\n"),
    produce("good lines, then one without a key", "record 2 of compacted topic", GOOD_LINE * 2 + b'{"partition": 0}\n'),
]

# -- consume, files, log, gc ----------------------------------------------------------------------------------

READS = [
    case("consume: no topic", 2, "Missing argument 'TOPIC'", "consume", "--partition", "0"),
    case("consume: no partition", 2, "Missing option '--partition'", "consume", "accounts"),
    case("consume: unknown topic", 1, "topic 'nope' does not exist", "consume", "nope", "--partition", "0"),
    case("consume: partition not a number", 2, "'zero' is not a valid integer", "consume", "accounts", "--partition", "zero"),
    case("consume: partition negative", 1, "has partitions 0 to 1, not -1", "consume", "accounts", "--partition", "-1"),
    case("consume: partition out of range", 1, "has partitions 0 to 1, not 2", "consume", "accounts", "--partition", "2"),
    case("consume: partition beyond int64", 1, "has partitions 0 to 1", "consume", "accounts", "--partition", str(2**70)),
    case("consume: from-offset not a number", 2, "is not a valid integer", "consume", "accounts", "--partition", "0", "--from-offset", "x"),
    case("consume: from-offset negative", 2, "is not in the range 0<=x<=9223372036854775807", "consume", "accounts", "--partition", "0", "--from-offset", "-1"),
    case("consume: from-offset beyond int64", 2, "is not in the range 0<=x<=9223372036854775807", "consume", "accounts", "--partition", "0", "--from-offset", str(2**64)),
    case("consume: to-offset negative", 2, "is not in the range 0<=x<=9223372036854775807", "consume", "accounts", "--partition", "0", "--to-offset", "-5"),
    case("consume: to-offset beyond int64", 2, "is not in the range 0<=x<=9223372036854775807", "consume", "accounts", "--partition", "0", "--to-offset", str(10**25)),
    case("consume: to-offset a fraction", 2, "is not a valid integer", "consume", "accounts", "--partition", "0", "--to-offset", "2.5"),
    case("files: level 5", 2, "5 is not in the range 0<=x<=4", "files", "--level", "5"),
    case("files: level negative", 2, "is not in the range", "files", "--level", "-1"),
    case("files: level not a number", 2, "is not a valid integer", "files", "--level", "top"),
    case("files: extra argument", 2, "Got unexpected extra argument", "files", "accounts"),
    case("log: limit 0", 2, "0 is not in the range 1<=x<=9223372036854775807", "log", "--limit", "0"),
    case("log: limit negative", 2, "is not in the range 1<=x<=", "log", "--limit", "-3"),
    case("log: limit beyond int64", 2, "is not in the range 1<=x<=9223372036854775807", "log", "--limit", str(2**64)),
    case("log: limit not a number", 2, "is not a valid integer", "log", "--limit", "all"),
    case("gc: grace negative", 2, "is not in the range 0<=x<=", "gc", "--grace-ms", "-1"),
    case("gc: grace beyond int64", 2, "is not in the range 0<=x<=9223372036854775807", "gc", "--grace-ms", str(2**63)),
    case("gc: grace not a number", 2, "is not a valid integer", "gc", "--grace-ms", "1h"),
    case("gc: unknown option", 2, "No such option '--force'", "gc", "--force"),
]

# -- plan and compact ------------------------------------------------------------------------------------------

SIZES = [
    ("--min-files", "0", "0 is not in the range x>=1"),
    ("--min-files", "many", "is not a valid integer"),
    ("--buffer-bytes", "39", "39 is not in the range 40<=x<="),
    ("--buffer-bytes", str(MAX_BUFFER_BYTES + 1), f"is not in the range 40<=x<={MAX_BUFFER_BYTES}"),
    ("--buffer-bytes", str(10**15), "is not in the range 40<=x<="),
    ("--buffer-bytes", "1GB", "is not a valid integer"),
    ("--target-file-bytes", "0", "is not in the range 1<=x<="),
    ("--target-file-bytes", str(MAX_TARGET_FILE_BYTES + 1), f"1<=x<={MAX_TARGET_FILE_BYTES}"),
    ("--target-file-bytes", str(10**15), "is not in the range 1<=x<="),
    ("--group-bytes", "0", "is not in the range 1<=x<="),
    ("--group-bytes", str(MAX_BYTE_COUNT + 1), f"1<=x<={MAX_BYTE_COUNT}"),
    ("--group-bytes", str(10**19), "is not in the range 1<=x<="),
]
PLANNING = []
for option, value, says in SIZES:
    for command in (["plan"], ["compact", "--all"], ["compact", "--full"]):
        PLANNING.append(case(f"{' '.join(command)}: {option} {value[:14]}", 2, says, *command, option, value))
PLANNING += [
    case("plan: unknown mode", 2, "'sideways' is not one of", "plan", "--mode", "sideways"),
    case("plan: topics with the regular mode", 2, "topics can only be chosen for the max-lag and full modes", "plan", "--topics", "accounts"),
    case("plan: dry run and out", 2, "--dry-run writes nothing and --out writes plans: choose one", "plan", "--dry-run", "--out", "{work}/out"),
    case("plan: out is a file", 2, "is a file", "plan", "--min-files", "1", "--out", "{work}/a-file"),
    case("plan: out under a file", 2, "{work}/a-file is a file, not a directory", "plan", "--min-files", "1", "--out", "{work}/a-file/plans"),
    case("plan: out a name too long", 2, "File name too long", "plan", "--min-files", "1", "--out", "{work}/" + "o" * 300),
    case("plan: unknown topic", 1, "topic(s) nope not in cluster", "plan", "--mode", "full", "--topics", "nope"),
    case("plan: extra argument", 2, "Got unexpected extra argument", "plan", "accounts"),
    case("compact: no mode", 2, "choose exactly one of --plan FILE, --all, --until-idle, --full", "compact"),
    case("compact: two modes", 2, "choose exactly one of", "compact", "--all", "--full"),
    case("compact: three modes", 2, "choose exactly one of", "compact", "--all", "--until-idle", "--plan", "{work}/plan.json"),
    case("compact: unknown mode", 2, "'sideways' is not one of", "compact", "--all", "--mode", "sideways"),
    case("compact: topics with the regular mode", 2, "topics can only be chosen for the max-lag and full modes", "compact", "--all", "--topics", "accounts"),
    case("compact: full sweep of an unknown topic", 1, "topic(s) nope not in cluster", "compact", "--full", "--topics", "nope"),
    case("compact: plan option without a path", 2, "requires an argument", "compact", "--plan"),
]

PLAN_SOURCES = "a plan `logcompact plan` printed"
PLAN_PATHS = [
    case("compact --plan: missing file", 2, "{work}/missing.json does not exist; pass " + PLAN_SOURCES, "compact", "--plan",
         "{work}/missing.json", process=True),
    case("compact --plan: missing directory", 2, "does not exist", "compact", "--plan", "{work}/missing/"),
    case("compact --plan: a directory without plans", 2, "{work}/empty holds no plan", "compact", "--plan", "{work}/empty"),
    case("compact --plan: the store's data directory", 2, "holds no plan", "compact", "--plan", "{store}/data", process=True),
    case("compact --plan: a name too long", 2, "File name too long", "compact", "--plan", "{work}/" + "p" * 300),
    case("compact --plan: under a file", 2, "cannot read {work}/a-file/plan.json (Not a directory)", "compact", "--plan",
         "{work}/a-file/plan.json"),
    case("compact --plan: a loop of links", 2, "cannot read {work}/loop", "compact", "--plan", "{work}/loop"),
    case("compact --plan: the stored header", 1, "this is the header of a stored plan", "compact", "--plan", "{work}/plans/{stored_plan_id}/plan.json"),
]
BAD_PLANS: dict[str, tuple[bytes, str]] = {
    "invalid UTF-8": (b'{"format": 4, "plan_id": "\xff"}', "not UTF-8 text (byte 27: invalid start byte)"),
    "UTF-16": ('{"format": 4}'.encode("utf-16"), "not UTF-8 text"),
    "binary": (bytes(range(256)), "not UTF-8 text"),
    "empty": (b"", "not JSON (Expecting value at line 1)"),
    "whitespace": (b"  \n\n", "not JSON"),
    "not JSON": (b"plan please", "not JSON"),
    "truncated": (b'{"format": 4, "plan_id": ', "not JSON"),
    "a JSON array": (b"[]", "a plan is a JSON object"),
    "a JSON string": (b'"plan"', "a plan is a JSON object"),
    "no format": (b"{}", "plan format None is not supported"),
    "format 1": (b'{"format": 1}', "plan format 1 is not supported (expected 4); plan again"),
    "format 3": (b'{"format": 3}', "plan format 3 is not supported (expected 4); plan again"),
    "format 5": (b'{"format": 5}', "plan format 5 is not supported"),
    "format a string": (b'{"format": "2"}', "plan format '2' is not supported"),
    "no inputs": (b'{"format": 4}', "'inputs'"),
    "JSON lines, one bad": (b'{"format": 4}\n{"format": 1}\n', "line 1: "),
}
PLAN_FILES = [
    case(f"compact --plan: {name}", 1, says, "compact", "--plan", f"{{work}}/bad/{index}.json")
    for index, (name, (_data, says)) in enumerate(BAD_PLANS.items())
] + [
    case("compact --plan -: invalid UTF-8", 1, "stdin: not UTF-8 text", "compact", "--plan", "-", stdin=b"\xfe\xff{}", process=True),
    case("compact --plan -: not JSON", 1, "stdin", "compact", "--plan", "-", stdin=b"nothing here"),
    case("compact --plan -: empty", 1, "stdin", "compact", "--plan", "-"),
]
# Plans edited from one the cluster made: fields of the wrong type, another cluster, inputs that are gone.
EDITS: dict[str, tuple[dict, str]] = {
    "plan_id an integer": ({"plan_id": 7}, "'plan_id'"),
    "inputs not a list": ({"inputs": "all"}, "'inputs'"),
    "input key an integer": ({"inputs": [{"key": 5}]}, "'key'"),
    "target_level 9": ({"target_level": 9}, "'target_level'"),
    "target_level a string": ({"target_level": "1"}, "'target_level'"),
    "deduplicate a string": ({"deduplicate": "yes"}, "'deduplicate'"),
    "mode sideways": ({"mode": "sideways"}, "mode 'sideways' is not one of"),
    "compression brotli": ({"compression": "brotli"}, "compression 'brotli' is not one of none, lz4, zstd"),
    "another cluster": ({"cluster_id": "00000000-0000-0000-0000-000000000000"}, "is for cluster 00000000-0000-0000-0000-000000000000"),
    "an input that is gone": ({"replace_input_key": "data/l0/0000000000000-gone.seg"}, "data/l0/0000000000000-gone.seg"),
    "topics not an object": ({"topics": []}, "which the plan does not describe"),
}
EDITED = [
    case(f"compact --plan: edited, {name}", 1, says, "compact", "--plan", f"{{work}}/edited/{index}.json")
    for index, (name, (_edit, says)) in enumerate(EDITS.items())
]

# A plan `plan --out` wrote, its documents damaged (`_damage_stored_plan`).
STORED_DAMAGES = {
    "header not JSON": "plan.json: not JSON",
    "header empty": "plan.json: not JSON",
    "header a directory": "holds no plan",
    "inputs not Arrow": "inputs: not an Arrow document of a plan",
    "inputs missing": "lists no inputs",
    "group missing": "has no group 0",
    "group not Arrow": "groups/g000.arrow: not an Arrow document of a plan",
    "group truncated": "groups/g000.arrow: not an Arrow document of a plan",
}
STORED = [
    case(f"compact --plan: stored, {name}", 2 if says == "holds no plan" else 1, says, "compact", "--plan",
         f"{{work}}/stored/{index}/{{stored_plan_id}}")
    for index, (name, says) in enumerate(STORED_DAMAGES.items())
]

CASES = GLOBAL + CATALOG + DAMAGED + CLOCK + TOPICS + PRODUCE + READS + PLANNING + PLAN_PATHS + PLAN_FILES + EDITED + STORED


# -- the cluster -------------------------------------------------------------------------------------------------


def _ok(argv: list[str], stdin: bytes = b"") -> str:
    done = run_in_process(argv, stdin)
    assert done.code == 0, done.stderr
    return done.stdout


def _edited(plan: dict, edit: dict) -> dict:
    document = json.loads(json.dumps(plan))
    for name, value in edit.items():
        if name == "replace_input_key":
            document["inputs"][0]["key"] = value
        elif name == "inputs" and isinstance(value, list):
            document["inputs"] = [{**document["inputs"][0], **value[0]}]
        else:
            document[name] = value
    return document


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory: `store/` (two topics, four L0 files), a plan that cluster made (`plan.json`,
    `plans/`), bad plans, a plain file, an empty directory and a loop of symbolic links."""
    work = tmp_path_factory.mktemp("bad-input")
    store = ["--store", f"file://{work}/store", "--now", NOW]
    with pytest.MonkeyPatch.context() as patch:
        for name in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG", "LOGCOMPACT_NOW_MS"):
            patch.delenv(name, raising=False)
        _ok(store + ["topic", "create", "accounts", "--partitions", "2", "--config", "cleanup.policy=compact"])
        _ok(store + ["topic", "create", "clicks", "--partitions", "1"])
        for round_ in range(3):
            lines = "".join(json.dumps({"partition": i % 2, "key": f"k{i}", "value": str(round_)}) + "\n" for i in range(4))
            _ok(store + ["produce", "accounts"], lines.encode())
        _ok(store + ["produce", "clicks"], b'{"partition": 0, "value": "click"}\n')
        plan = json.loads(_ok(store + ["plan", "--min-files", "2"]))
        _ok(store + ["plan", "--min-files", "2", "--out", str(work / "plans")])
    with closing(sqlite3.connect(work / "store" / "catalog.db")) as database:  # the WAL's pages into the file, for `_damage`
        database.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (work / "plan.json").write_text(json.dumps(plan))
    (work / "a-file").write_text("not a store, a catalog or a plan\n")
    (work / "empty").mkdir()
    (work / "loop").symlink_to(work / "loop")
    (work / "bad").mkdir()
    for index, (data, _says) in enumerate(BAD_PLANS.values()):
        (work / "bad" / f"{index}.json").write_bytes(data)
    (work / "edited").mkdir()
    for index, (edit, _says) in enumerate(EDITS.values()):
        (work / "edited" / f"{index}.json").write_text(json.dumps(_edited(plan, edit)))
    for index, damage in enumerate(STORED_DAMAGES):
        copy = work / "stored" / str(index)
        shutil.copytree(work / "plans", copy)
        _damage_stored_plan(next(copy.iterdir()), damage)
    (work / "damaged").mkdir()
    return work


def _damage_stored_plan(directory: Path, damage: str) -> None:
    header, inputs, group = directory / "plan.json", directory / "inputs.arrow", directory / "groups" / "g000.arrow"
    if damage == "header not JSON":
        header.write_text("a plan")
    elif damage == "header empty":
        header.write_bytes(b"")
    elif damage == "header a directory":
        header.unlink()
        header.mkdir()
    elif damage == "inputs not Arrow":
        inputs.write_bytes(b"ARROW1 but not")
    elif damage == "inputs missing":
        inputs.unlink()
    elif damage == "group missing":
        group.unlink()
    elif damage == "group not Arrow":
        group.write_bytes(b"garbage")
    elif damage == "group truncated":
        group.write_bytes(group.read_bytes()[:100])
    else:
        raise AssertionError(f"no damage {damage!r}")


def _damage(store: Path, damage: str) -> None:
    """Damage `store`'s catalog.db (a copy of the cluster's, never opened by this process, so no pooled
    connection hides the damage)."""
    database = store / "catalog.db"
    for side in ("-wal", "-shm"):
        Path(f"{database}{side}").unlink(missing_ok=True)
    data = database.read_bytes()
    if damage == "garbage":
        database.write_bytes(bytes((n * 131 + 7) % 256 for n in range(8192)))
    elif damage == "text":
        database.write_text("catalog\n")
    elif damage == "truncated":
        database.write_bytes(data[: len(data) // 2])
    elif damage == "header only":
        database.write_bytes(data[:100])
    elif damage == "zero-length":
        database.write_bytes(b"")
    elif damage == "directory":
        database.unlink()
        database.mkdir()
    elif damage in ROW_DAMAGES:
        with closing(sqlite3.connect(database)) as damaged, damaged:
            damaged.execute(ROW_DAMAGES[damage])
    else:
        raise AssertionError(f"no damage {damage!r}")


def _expand(text: str, work: Path, store: Path) -> str:
    stored_plan_id = next((work / "plans").iterdir()).name
    return text.replace("{work}", str(work)).replace("{store}", str(store)).replace("{stored_plan_id}", stored_plan_id)


class Finding(NamedTuple):
    case: Case
    how: str  # in-process or process
    outcome: Outcome
    problems: list[str]


def _check(outcome: Outcome, expected: Case, says: str, written: list[str]) -> list[str]:
    problems = []
    if outcome.code != expected.code:
        problems.append(f"exit code {outcome.code}, expected {expected.code}")
    if "Traceback" in outcome.stderr:
        problems.append("traceback")
    lines = outcome.stderr.splitlines()
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr")
    if not outcome.stderr.startswith("logcompact: error: "):
        problems.append("stderr does not start with 'logcompact: error: '")
    if says not in outcome.stderr:
        problems.append(f"stderr does not say {says!r}")
    if outcome.stdout:
        problems.append("printed on stdout")
    if written:
        problems.append(f"wrote {', '.join(written[:3])}")
    return problems


def test_every_bad_input_is_one_line_with_nothing_written(cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG", "LOGCOMPACT_NOW_MS"):
        monkeypatch.delenv(name, raising=False)
    assert len(CASES) >= 190 and len({c.name for c in CASES}) == len(CASES)
    findings: list[Finding] = []
    runs = 0
    for number, bad in enumerate(CASES):
        store = cluster / "store"
        if bad.damage:
            store = cluster / "damaged" / str(number)
            shutil.copytree(cluster / "store", store)
            _damage(store, bad.damage)
        argv = [_expand(arg, cluster, store) for arg in bad.argv]
        if bad.cluster:
            argv = ["--store", f"file://{store}", "--now", NOW, *argv]
        says = _expand(bad.says, cluster, store)
        for how, run in [("in-process", run_in_process)] + ([("process", run_process)] if bad.process else []):
            before = tree_state(cluster)
            outcome = run(argv, bad.stdin, bad.env)
            runs += 1
            problems = _check(outcome, bad, says, changes(before, tree_state(cluster)))
            if problems:
                findings.append(Finding(bad, how, outcome, problems))
    counts = {
        "cases": len(CASES),
        "runs": runs,
        "as processes": sum(c.process for c in CASES),
        "tracebacks": sum("traceback" in f.problems for f in findings),
        "multi-line errors": sum(any(p.endswith("lines on stderr") for p in f.problems) for f in findings),
        "writes": sum(any(p.startswith("wrote ") for p in f.problems) for f in findings),
        "wrong exit codes": sum(any(p.startswith("exit code") for p in f.problems) for f in findings),
        "other misses": sum(not any(p == "traceback" or p.endswith("lines on stderr") or p.startswith(("wrote ", "exit code"))
                                    for p in f.problems) for f in findings),
    }
    print("\nCLI bad-input table: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    for finding in findings:
        last = finding.outcome.stderr.strip().splitlines()[-1:] or [""]
        print(f"  {finding.case.name} ({finding.how}): {'; '.join(finding.problems)}\n    {last[0][:300]}")
    assert not findings, f"{len(findings)} of {runs} runs broke the contract (listed above)"
