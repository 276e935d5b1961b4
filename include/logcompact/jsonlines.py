"""Records as the command line's JSON lines, both ways: `logcompact produce` reads them, `logcompact consume` writes
them. A line is {"partition": int, "key": str|null, "value": str|null, "timestamp": ms, "headers": {str: str}}, with
key_b64 / value_b64 for bytes that are not UTF-8 text (produce takes headers as text; consume writes a header whose
value is not UTF-8 as {name}_b64). Bad input is an InvalidRecordError naming the line and the fix; nothing of the
input is produced then."""

from __future__ import annotations

import base64
import json
from typing import Any

from logcompact.consume import ConsumedRecord
from logcompact.exceptions import InvalidRecordError
from logcompact.ingest import Record
from logcompact.units import LONG_MAX


def parse_record(line_number: int, line: bytes) -> Record:
    """One input line as a record to produce."""
    document = _parse_json(line_number, line)
    if not isinstance(document, dict):
        raise InvalidRecordError(f"line {line_number}: expected a JSON object; nothing was produced")
    partition = document.get("partition")
    if not isinstance(partition, int) or isinstance(partition, bool):
        raise InvalidRecordError(f"line {line_number}: \"partition\" must be an integer; nothing was produced")
    timestamp = document.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool) or not 0 <= timestamp <= LONG_MAX):
        raise InvalidRecordError(f"line {line_number}: \"timestamp\" must be integer milliseconds from 0 to {LONG_MAX}; nothing was produced")
    headers = document.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidRecordError(f"line {line_number}: \"headers\" must be an object of strings; nothing was produced")
    for name in headers:
        _utf8(line_number, f"header name {name!r}", name)
    return Record(
        partition,
        _bytes_field(line_number, document, "key"),
        _bytes_field(line_number, document, "value"),
        timestamp,
        [(name, _utf8(line_number, f"header {name!r}", value)) for name, value in headers.items()] or None,
    )


def record_document(record: ConsumedRecord) -> dict[str, Any]:
    """A consumed record as its output line's document: text where the bytes are UTF-8, base64 beside the name where not."""
    document: dict[str, Any] = {"offset": record.offset, "timestamp": record.timestamp}
    _text_or_b64(document, "key", record.key)
    _text_or_b64(document, "value", record.value)
    headers: dict[str, Any] = {}
    for name, value in record.headers:
        _text_or_b64(headers, name, value)
    document["headers"] = headers
    return document


def _utf8(line_number: int, field: str, text: str) -> bytes:
    """`text` as UTF-8: json.loads accepts escapes of lone surrogates ("\\ud800"), which have no UTF-8 form."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRecordError(
            f"line {line_number}: {field} holds a lone surrogate \\u{ord(exc.object[exc.start]):04x}, which UTF-8 cannot "
            "encode: pair it (\\ud83d\\ude00 is one character) or drop it; nothing was produced"
        ) from None


def _bytes_field(line_number: int, document: dict, name: str) -> bytes | None:
    encoded = f"{name}_b64"
    if encoded in document:
        raw = document[encoded]
        if raw is None:
            return None
        try:
            return base64.b64decode(raw, validate=True)
        except (ValueError, TypeError):  # binascii.Error is a ValueError, and so is a str beyond ASCII
            raise InvalidRecordError(f"line {line_number}: {encoded} is not valid base64; nothing was produced") from None
    text = document.get(name)
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidRecordError(f"line {line_number}: {name} must be a string or null (use {encoded} for bytes); nothing was produced")
    return _utf8(line_number, name, text)


def _parse_json(line_number: int, line: bytes) -> Any:
    try:
        return json.loads(line.decode())
    except UnicodeDecodeError as exc:
        raise InvalidRecordError(
            f"line {line_number}: not UTF-8 (byte {exc.start + 1}: {exc.reason}); input lines are JSON in UTF-8, "
            "with key_b64 / value_b64 for binary data; nothing was produced"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRecordError(f"line {line_number}: not JSON ({exc.msg}); nothing was produced") from None
    except ValueError as exc:  # the other error json.loads raises: an integer of more digits than Python converts
        raise InvalidRecordError(f"line {line_number}: a number too long ({str(exc).partition(':')[0]}); nothing was produced") from None
    except RecursionError:
        raise InvalidRecordError(f"line {line_number}: JSON nested too deep; a record is one flat object; nothing was produced") from None


def _text_or_b64(document: dict, name: str, data: bytes | None) -> None:
    if data is None:
        document[name] = None
        return
    try:
        document[name] = data.decode()
    except UnicodeDecodeError:
        document[f"{name}_b64"] = base64.b64encode(data).decode()
