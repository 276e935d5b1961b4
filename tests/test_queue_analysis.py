"""The port of Jepsen's Kafka queue analysis (lab.queue_analysis) on hand-made histories: a clean one passes, and
each anomaly, made on purpose, is found and named, and fails the check but G0 and internal send skips, which Kafka's
transactions allow."""

from __future__ import annotations

from collections.abc import Hashable

from lab.queue_analysis import Op, Poll, Send, analyse


def send(process: int, outcome: str, *sends: tuple[Hashable, Hashable, int | None]) -> list[Op]:
    """An invoke and its completion: a transaction of (key, value, offset) sends."""
    return [Op(process, "invoke", "send", tuple(Send(k, v) for k, v, _ in sends)),
            Op(process, outcome, "send", tuple(Send(k, v, offset) for k, v, offset in sends))]  # type: ignore[arg-type]


def poll(process: int, **read: list[tuple[int, Hashable]]) -> list[Op]:
    return [Op(process, "invoke", "poll", (Poll(),)), Op(process, "ok", "poll", (Poll(dict(read)),))]


def assign(process: int, *keys: Hashable) -> list[Op]:
    return [Op(process, "invoke", "assign", keys=keys), Op(process, "ok", "assign", keys=keys)]


def clean() -> list[Op]:
    """Two producers interleaving transactions on x and y (markers take offsets 2 and 5), one aborted, an unknown one
    that committed, and two pollers reading everything once, in order."""
    return [
        *assign(10, "x", "y"),
        *send(0, "ok", ("x", 1, 0), ("x", 2, 1), ("y", 1, 0)),
        *send(1, "fail", ("x", 3, 3)),
        *send(1, "info", ("x", 4, None)),
        *poll(10, x=[(0, 1), (1, 2)]),
        *poll(10, x=[(4, 4)], y=[(0, 1)]),
        *poll(11, x=[(0, 1), (1, 2), (4, 4)], y=[(0, 1)]),
    ]


def test_a_clean_history_has_no_anomaly() -> None:
    found = analyse(clean())
    assert found.anomalies == {}
    assert found.orders["x"].by_index == [1, 2, 4]  # the aborted value and the markers leave no place


def test_an_aborted_read_is_found() -> None:
    history = [*clean(), *poll(12, x=[(3, 3)])]
    failing = analyse(history).failing
    # the aborted value takes a place in x's order, so the pollers that rightly left it out seem to skip it too
    assert sorted(failing) == ["aborted read", "internal poll skip", "poll skip"]
    assert failing["aborted read"] == [{"key": "x", "value": 3, "reader": len(history) - 1, "writer": 5}]


def test_a_lost_write_is_found() -> None:
    # a poller reads 4, past 2, but nobody ever read 2, which was acknowledged
    history = [*assign(10, "x"), *send(0, "ok", ("x", 1, 0), ("x", 2, 1)), *send(0, "ok", ("x", 4, 3)), *poll(10, x=[(0, 1), (3, 4)])]
    failing = analyse(history).failing
    assert failing["lost write"] == [{"key": "x", "value": 2, "index": 1, "max_read_index": 2, "writer": 3}]
    assert failing["unseen"] == [{"key": "x", "value": 2, "writer": 3}]
    assert failing["internal poll skip"][0]["values"] == (1, 4)


def test_an_acknowledged_write_nobody_read_is_unseen() -> None:
    failing = analyse([*clean(), *send(2, "ok", ("y", 9, 7))]).failing
    assert list(failing) == ["unseen"]


def test_a_duplicate_is_found() -> None:
    failing = analyse([*clean(), *poll(12, x=[(0, 1), (1, 2), (4, 4), (6, 2)])]).failing
    assert failing["duplicate"] == [{"key": "x", "value": 2, "offsets": [1, 6]}]


def test_an_inconsistent_offset_is_found() -> None:
    # the agent told a producer offset 1 for value 5 while pollers read 2 there
    failing = analyse([*clean(), *send(2, "ok", ("x", 5, 1)), *poll(12, x=[(7, 5)])]).failing
    assert failing["inconsistent offsets"] == [{"key": "x", "offset": 1, "values": [2, 5]}]


def test_a_poll_skip_across_polls_is_found() -> None:
    history = [*assign(10, "x"), *send(0, "ok", ("x", 1, 0), ("x", 2, 1), ("x", 3, 2)), *poll(10, x=[(0, 1)]), *poll(10, x=[(2, 3)]),
               *poll(11, x=[(0, 1), (1, 2), (2, 3)])]
    failing = analyse(history).failing
    assert list(failing) == ["poll skip"]
    assert failing["poll skip"][0]["values"] == (1, 3) and failing["poll skip"][0]["delta"] == 2


def test_a_nonmonotonic_poll_is_found_and_a_reassigned_key_starts_afresh() -> None:
    base = [*assign(10, "x"), *send(0, "ok", ("x", 1, 0), ("x", 2, 1)), *poll(10, x=[(0, 1), (1, 2)])]
    failing = analyse([*base, *poll(10, x=[(1, 2)])]).failing
    assert list(failing) == ["nonmonotonic poll"] and failing["nonmonotonic poll"][0]["delta"] == 0
    # an assign without x forgets its position; polling it again from the start is then no anomaly
    assert analyse([*base, *assign(10, "y"), *assign(10, "x"), *poll(10, x=[(0, 1), (1, 2)])]).failing == {}
    # one op reading backwards is an internal nonmonotonic poll
    assert list(analyse([*base, *poll(11, x=[(1, 2), (0, 1)])]).failing) == ["internal nonmonotonic poll"]


def test_a_precommitted_read_and_a_nonmonotonic_send_are_found() -> None:
    own = [Op(3, "invoke", "txn", (Send("x", 7), Poll())), Op(3, "ok", "txn", (Send("x", 7, 5), Poll({"x": [(5, 7)]})))]
    assert "precommitted read" in analyse([*clean(), *own]).failing
    # one producer's later send placed before its earlier one
    backwards = [*send(0, "ok", ("z", 1, 1)), *send(0, "ok", ("z", 2, 0)), *poll(10, z=[(0, 2), (1, 1)])]
    assert list(analyse(backwards).failing) == ["nonmonotonic send"]


def test_g0_and_interleaved_transactions_are_reported_but_allowed() -> None:
    # T1 writes x before T2 and y after it: a write cycle, which Kafka's transactions allow; T1's two values of x have
    # T2's between them
    history = [*assign(10, "x", "y"), *send(0, "ok", ("x", 1, 0), ("y", 4, 3), ("x", 3, 2)), *send(1, "ok", ("x", 2, 1), ("y", 3, 2)),
               *poll(10, x=[(0, 1), (1, 2), (2, 3)], y=[(2, 3), (3, 4)])]
    found = analyse(history)
    assert found.failing == {}
    assert found.anomalies["G0"] == [{"cycle": [3, 5, 3]}]
    assert found.anomalies["internal send skip"][0]["values"] == (1, 3)
