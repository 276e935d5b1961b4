"""The object store contract, run on both backends (local directory and real Ceph RGW)."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from logcompact.exceptions import InvalidStoreUriError, ObjectNotFoundError
from logcompact.store import LocalStore, ObjectStore, open_store
from logcompact.store.local import WRITE_BYTES


def test_put_get_stat_delete(store: ObjectStore) -> None:
    store.put("a/b/one", b"first")
    store.put("a/b/one", b"second")  # a plain put replaces
    assert store.get("a/b/one") == b"second"
    assert store.stat("a/b/one").size == 6
    assert store.stat("a/b/missing") is None
    store.delete("a/b/one")
    store.delete("a/b/one")  # deleting a missing object is fine, as in S3
    assert store.stat("a/b/one") is None
    with pytest.raises(ObjectNotFoundError, match="a/b/one"):
        store.get("a/b/one")


def _parts() -> list:
    """Buffers of every kind a segment writer hands out, more of them than one writev takes (IOV_MAX, 1024)."""
    parts: list = [b"header", b"", memoryview(b"a view"), pa.py_buffer(bytes(range(256))).slice(10, 100)]
    parts += [os.urandom(n % 37) for n in range(3000)]
    return parts


def test_an_object_put_from_parts_is_their_bytes_joined(store: ObjectStore) -> None:
    parts = _parts()
    joined = b"".join(parts)
    store.put("a/parts", b"an older object")
    before = store.counters.snapshot()
    store.put_parts("a/parts", parts)
    spent = store.counters.snapshot() - before
    assert store.get("a/parts") == joined and store.stat("a/parts").size == len(joined)  # type: ignore[union-attr]
    assert (spent.put, spent.bytes_written) == (1, len(joined))
    store.put_parts("a/empty", [])
    assert store.get("a/empty") == b""


def test_a_local_put_from_parts_goes_on_after_partial_writes(tmp_path, monkeypatch) -> None:
    """writev may write less than it was given (a signal, a pipe, 2 GiB at a time): the rest follows, from inside a
    part as from its start, never more than IOV_MAX buffers a call."""
    calls = []

    def short_writev(fd: int, buffers: list) -> int:
        calls.append(len(buffers))
        assert len(buffers) <= os.sysconf("SC_IOV_MAX")
        return os.write(fd, b"".join(buffers)[: 1 + len(calls) % 50])

    store = LocalStore(tmp_path)
    parts = _parts()
    monkeypatch.setattr(os, "writev", short_writev)
    store.put_parts("parts", parts)
    monkeypatch.undo()
    assert store.get("parts") == b"".join(parts) and len(calls) > 1000


def test_a_local_put_from_parts_writes_at_most_write_bytes_a_call(tmp_path, monkeypatch) -> None:
    """Parts larger than WRITE_BYTES are written in slices, and small ones gathered up to it: a whole file in one
    writev would take page-cache folios as large as the file."""
    sizes = []
    writev = os.writev

    def counted_writev(fd: int, buffers: list) -> int:
        sizes.append(sum(memoryview(buffer).nbytes for buffer in buffers))
        return writev(fd, buffers)

    store = LocalStore(tmp_path)
    parts = [os.urandom(3 * WRITE_BYTES + 5), b"x" * 100, pa.py_buffer(os.urandom(WRITE_BYTES)), *(os.urandom(1000) for _ in range(600))]
    monkeypatch.setattr(os, "writev", counted_writev)
    store.put_parts("big", parts)
    monkeypatch.undo()
    assert store.get("big") == b"".join(bytes(part) for part in parts)
    assert max(sizes) == WRITE_BYTES and sum(sizes) == sum(len(part) for part in parts)
    # The first part's three slices; its tail with the 100 bytes; the second part; the small parts, 262 a call.
    assert sizes == [WRITE_BYTES] * 3 + [105, WRITE_BYTES, 262_000, 262_000, 76_000]


def test_streaming_get_is_one_request_read_in_pieces(store: ObjectStore) -> None:
    payload = bytes(range(256)) * 4096
    store.put("blob", payload)
    before = store.counters.snapshot()
    with store.open_stream("blob") as stream:
        pieces = []
        while chunk := stream.read(10_000):
            pieces.append(chunk)
    spent = store.counters.snapshot() - before
    assert b"".join(pieces) == payload
    assert (spent.get, spent.bytes_read) == (1, len(payload))


def test_a_stream_skips_bytes_and_hands_out_the_rest(store: ObjectStore) -> None:
    """A local file seeks past skipped bytes (not counted as read); an S3 body reads them (counted). Either way the
    bytes after them come next, and a skip past the end says how far it got."""
    payload = bytes(range(256)) * 8192
    store.put("blob", payload)
    before = store.counters.snapshot()
    with store.open_stream("blob") as stream:
        assert stream.skip(1_500_000) == 1_500_000
        assert stream.read(10) == payload[1_500_000:1_500_010]
        assert stream.skip(10**9) == len(payload) - 1_500_010
        assert stream.read(10) == b""
    skipped_counted = (store.counters.snapshot() - before).bytes_read - 10
    assert skipped_counted == (0 if store.uri.startswith("file://") else len(payload) - 10)


def test_a_local_store_gives_an_uploaded_file_the_mode_of_a_put_object(tmp_path) -> None:
    """Uploads are hard links where they can be: the object still gets a put object's mode, not the staged file's
    owner-only one, and outlives the staged file."""
    store = open_store(f"file://{tmp_path / 'store'}")
    store.put("put", b"x")
    staged = tmp_path / "staged"
    staged.write_bytes(b"payload")
    staged.chmod(0o600)
    store.put_file("uploaded", str(staged))
    staged.unlink()
    objects = tmp_path / "store"
    assert store.get("uploaded") == b"payload"
    assert (objects / "uploaded").stat().st_mode & 0o777 == (objects / "put").stat().st_mode & 0o777


def test_range_get(store: ObjectStore) -> None:
    store.put("blob", b"0123456789")
    before = store.counters.snapshot()
    assert store.get_range("blob", 3, 4) == b"3456"
    assert store.get_range("blob", 8, 2) == b"89"
    assert (store.counters.snapshot() - before).get == 2


def test_list_by_prefix_in_key_order(store: ObjectStore) -> None:
    for key in ["m/v3", "m/v1", "m/v2", "mx/other", "n/v1"]:
        store.put(key, b"x")
    assert [i.key for i in store.list("m/")] == ["m/v1", "m/v2", "m/v3"]
    assert [i.key for i in store.list("m/v", start_after="m/v1")] == ["m/v2", "m/v3"]
    assert [i.key for i in store.list("m")] == ["m/v1", "m/v2", "m/v3", "mx/other"]
    assert list(store.list("nothing/")) == []


def test_create_only_put_has_exactly_one_winner_under_a_race(store: ObjectStore) -> None:
    racers = 16
    start = threading.Barrier(racers)
    outcomes: list[bool] = []
    errors: list[BaseException] = []

    def race(n: int) -> None:
        try:
            start.wait()
            outcomes.append(store.put_if_absent("race/winner", f"writer-{n}".encode()))
        except BaseException as exc:  # re-raised below: a racer's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(outcomes) == [False] * (racers - 1) + [True]
    winner = store.get("race/winner").decode()
    assert winner.startswith("writer-")
    assert store.put_if_absent("race/winner", b"late") is False
    assert store.get("race/winner").decode() == winner


def test_counters_count_every_operation(store: ObjectStore) -> None:
    before = store.counters.snapshot()
    store.put("k", b"abc")
    store.get("k")
    list(store.list("k"))
    store.stat("k")
    store.delete("k")
    spent = store.counters.snapshot() - before
    assert spent.as_dict() == {
        "get": 1, "put": 1, "list": 1, "delete": 1, "head": 1, "bytes_read": 3, "bytes_written": 3,
    }


@pytest.mark.parametrize(
    "uri, message",
    [
        ("relative/path", "not supported"),
        ("file://relative/path", "absolute path"),
        ("s3:///prefix", "names no bucket"),
        ("gs://bucket/x", "not supported"),
    ],
)
def test_bad_store_uri_is_a_clear_error(uri: str, message: str) -> None:
    with pytest.raises(InvalidStoreUriError, match=message):
        open_store(uri)


def test_s3_store_from_an_airflow_connection_never_logs_the_secret(rgw, monkeypatch, caplog) -> None:
    import json
    import logging

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    monkeypatch.setenv(
        "AIRFLOW_CONN_LOGCOMPACT_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": rgw.access_key,
                "password": rgw.secret_key,
                "extra": {"endpoint_url": rgw.endpoint_url, "region_name": rgw.region},
            }
        ),
    )
    rgw.client().create_bucket(Bucket="from-airflow-connection")
    with caplog.at_level(logging.DEBUG):
        store = open_store("s3://from-airflow-connection/cluster", aws_conn_id="logcompact_s3")
        store.put("k", b"v")
        assert store.get("k") == b"v"
        assert store.put_if_absent("k", b"again") is False
    assert rgw.secret_key not in caplog.text
