"""The agent's hand-written Produce decoder against kio's generic reader, its reference: random Produce requests of
every served version decode to the same entities, and every cut of one is refused as malformed, never misread."""

from __future__ import annotations

import datetime
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from logcompact.kafka import codec

PRODUCE_VERSIONS = range(3, 10)

names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_categories=("Cs",)), min_size=1, max_size=20)
records = st.one_of(st.none(), st.binary(max_size=300))
topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), records), max_size=4)), max_size=4)


def produce_frame(version: int, correlation_id: int, client_id: str | None, transactional_id: str | None, acks: int,
                  timeout_ms: int, topic_data: list) -> bytes:
    body_class, topic_class, partition_class = codec._produce_classes(version)
    body = body_class(
        transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(topic_class(name=name, partition_data=tuple(partition_class(index=index, records=data) for index, data in partitions))
                         for name, partitions in topic_data),
    )
    header_class = RequestHeaderV2 if body_class.__flexible__ else RequestHeaderV1
    buffer = io.BytesIO()
    entity_writer(header_class)(buffer, header_class(request_api_key=0, request_api_version=version, correlation_id=correlation_id, client_id=client_id))
    entity_writer(body_class)(buffer, body)
    return buffer.getvalue()


def read_by_kio(frame: bytes, version: int) -> tuple[int, str | None, object]:
    body_class = codec._produce_classes(version)[0]
    header, size = entity_reader(RequestHeaderV2 if body_class.__flexible__ else RequestHeaderV1)(frame, 0)
    return int(header.correlation_id), header.client_id, entity_reader(body_class)(frame, size)[0]


def plain(body: object) -> object:
    """Records as bytes: the decoder hands on views of the frame where kio copies."""
    return [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data]) for t in body.topic_data]  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PRODUCE_VERSIONS), st.integers(-(2**31), 2**31 - 1), st.one_of(st.none(), names), st.one_of(st.none(), names),
       st.sampled_from([-1, 0, 1]), st.integers(0, 2**31 - 1), topics)
def test_produce_requests_decode_as_kio_decodes_them(version: int, correlation_id: int, client_id: str | None, transactional_id: str | None,
                                                      acks: int, timeout_ms: int, topic_data: list) -> None:
    frame = produce_frame(version, correlation_id, client_id, transactional_id, acks, timeout_ms, topic_data)
    request = codec.decode_request(frame, lambda api_key, served_version: True)
    expected_correlation, expected_client, expected = read_by_kio(frame, version)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (0, version, expected_correlation, expected_client)
    body = request.body
    assert type(body) is type(expected)
    assert (body.transactional_id, body.acks, body.timeout) == (expected.transactional_id, expected.acks, expected.timeout)
    assert plain(body) == plain(expected) == [(name, list(partitions)) for name, partitions in topic_data]


@pytest.mark.parametrize("version", [3, 9])
def test_every_cut_of_a_produce_request_is_refused_as_malformed(version: int) -> None:
    frame = produce_frame(version, 7, "client", None, -1, 30_000, [("topic", [(0, b"x" * 40), (1, None)]), ("other", [(2, b"y")])])
    for end in range(len(frame)):
        with pytest.raises(codec.MalformedRequestError):
            codec.decode_request(frame[:end], lambda api_key, served_version: True)


def test_a_produce_request_declaring_billions_of_topics_fails_before_allocating() -> None:
    frame = produce_frame(3, 7, "client", None, -1, 30_000, [])
    with pytest.raises(codec.MalformedRequestError, match="array of 2147483647 items"):
        codec.decode_request(frame[:-4] + (2**31 - 1).to_bytes(4, "big"), lambda api_key, served_version: True)


def test_a_produce_version_not_served_keeps_no_body() -> None:
    frame = produce_frame(9, 7, "client", None, -1, 30_000, [])
    request = codec.decode_request(frame, lambda api_key, served_version: served_version < 9)
    assert (request.api_key, request.api_version, request.body) == (0, 9, None)
