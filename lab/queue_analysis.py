"""Jepsen's analysis of Kafka-like queues (jepsen.tests.kafka), ported to Python: a history of sends and polls,
checked for the anomalies Kafka's transactions rule out.

A history is a list of `Op`s in the order they happened: each client operation is an `invoke`, then its completion,
`ok` (it happened), `fail` (it did not: a transaction aborted) or `info` (unknown: the client lost its answer). A
`send` or `txn` op holds `Send` micro-ops, a `poll` or `txn` op `Poll` micro-ops; a completed send carries the offset
the partition gave it, when known, and a completed poll the (offset, value) pairs it read, per key. A key names one
partition; values are unique across the history. `assign` ops say which keys a process polls from now on.

What is checked, as Jepsen defines it:

* version orders: per key, the values at each offset, from every poll and from the sends of ops that must have
  committed (`ok`, or `info` with a send some `ok` poll read). Offsets need not be contiguous (a marker takes one);
  an offset holding two values is an **inconsistent offset**. A value's *index* is its place in the key's order
  with the gaps left out.
* **aborted read** (Jepsen's G1a): an `ok` poll read a value whose send `fail`ed.
* **precommitted read**: an op read a value it sent itself (in Kafka no poll sees an uncommitted record).
* **lost write**: below the highest index some `ok` poll read of a key, a value that must have committed was read
  by no `ok` poll.
* **unseen**: a value of an `ok` send that no `ok` poll read at all (the workload's final polls read every key to
  its end, so after them nothing acknowledged may stay unseen).
* **duplicate**: a value at more than one offset of a key.
* **poll skip** / **nonmonotonic poll**: a process's poll of a key starts past the value right after the last one
  its previous poll of that key read (values skipped), or at or before it (read again, or backwards). `assign`
  keeps the positions of the keys still assigned; a client started afresh is a new process.
* **internal poll skip** / **internal nonmonotonic poll**: the same between two reads of a key in one op.
* **nonmonotonic send**: a process's send to a key placed before its previous send to that key;
  **internal nonmonotonic send** the same inside one op. **internal send skip**, another producer's value between
  two sends of one transaction, is how Kafka interleaves transactions: reported, allowed.
* **G0** (write cycles): ops linked by write-write edges (T1 -> T2 when T1's value of a key directly precedes T2's in
  its order) form a cycle. Kafka does not isolate writes of concurrent transactions, so G0 is allowed: reported,
  never failing. (Jepsen's wr edges, from a send to the polls that read it, close no cycle when no op both sends
  and polls, as in this project's workloads; ops that do both are checked for precommitted reads.)

`analyse(history).failing` lists the anomalies found that are not allowed; `.anomalies` has them all, with cases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
OpKind = Literal["send", "poll", "txn", "assign"]

# Kafka's transactions interleave writes (internal send skips) and do not isolate them (G0).
ALLOWED = frozenset({"internal send skip", "G0"})


@dataclass(frozen=True)
class Send:
    key: Hashable
    value: Hashable
    offset: int | None = None  # known on an ok (or aborted) completion


@dataclass(frozen=True)
class Poll:
    # per key, the (offset, value) pairs read in order; empty on the invoke
    read: dict[Hashable, list[tuple[int, Hashable]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    process: int
    type: OpType
    f: OpKind
    value: tuple[Send | Poll, ...] = ()
    keys: tuple[Hashable, ...] = ()  # of an assign
    index: int = -1  # its place in the history, set by `analyse`

    def writes(self) -> dict[Hashable, list[Send]]:
        found: dict[Hashable, list[Send]] = defaultdict(list)
        for mop in self.value:
            if isinstance(mop, Send):
                found[mop.key].append(mop)
        return found

    def reads(self) -> dict[Hashable, list[tuple[int, Hashable]]]:
        found: dict[Hashable, list[tuple[int, Hashable]]] = defaultdict(list)
        for mop in self.value:
            if isinstance(mop, Poll):
                for key, pairs in mop.read.items():
                    found[key].extend(pairs)
        return found

    def read_values(self) -> dict[Hashable, list[Hashable]]:
        return {key: [value for _, value in pairs] for key, pairs in self.reads().items()}


@dataclass
class VersionOrder:
    """One key's log as the history shows it: offset -> values there, and the values in order without the gaps."""

    log: dict[int, set[Hashable]] = field(default_factory=dict)
    by_index: list[Hashable] = field(default_factory=list)
    by_value: dict[Hashable, int] = field(default_factory=dict)


@dataclass
class Analysis:
    anomalies: dict[str, list[dict[str, Any]]]
    orders: dict[Hashable, VersionOrder]

    @property
    def failing(self) -> dict[str, list[dict[str, Any]]]:
        return {name: cases for name, cases in self.anomalies.items() if name not in ALLOWED}

    def summary(self) -> str:
        """One line per anomaly found: its name, its count, and its first cases."""
        return "\n".join(f"{name}: {len(cases)}, e.g. {cases[:3]}" for name, cases in sorted(self.anomalies.items())) or "no anomalies"


def analyse(history: Iterable[Op]) -> Analysis:
    ops = [_indexed(op, n) for n, op in enumerate(history)]
    completions = [op for op in ops if op.type != "invoke"]
    failed_writes = _values_by_key(op.writes() for op in completions if op.type == "fail")
    ok_reads = _values_by_key(op.reads() for op in completions if op.type == "ok")
    writer_of = {(key, send.value): op for op in completions for key, sends in op.writes().items() for send in sends}

    def committed(op: Op) -> bool:
        return op.type == "ok" or (op.type == "info" and any(send.value in ok_reads.get(key, set()) for key, sends in op.writes().items() for send in sends))

    orders, inconsistent = _version_orders(completions, committed)
    anomalies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    anomalies["inconsistent offsets"] = inconsistent
    for op in completions:
        reads = op.read_values()
        if op.type == "ok":
            anomalies["aborted read"] += [{"key": k, "value": v, "reader": op.index, "writer": writer_of[(k, v)].index}
                                          for k, vs in reads.items() for v in vs if v in failed_writes.get(k, set())]
        anomalies["precommitted read"] += [{"key": k, "value": s.value, "op": op.index}
                                           for k, sends in op.writes().items() for s in sends if s.value in reads.get(k, ())]
        for kind, values in (("poll", reads), ("send", {k: [s.value for s in sends] for k, sends in op.writes().items()})):
            for k, pair, delta in _pairs_out_of_order(orders, values):
                name = f"internal {kind} skip" if delta > 1 else f"internal nonmonotonic {kind}"
                anomalies[name].append({"key": k, "values": pair, "delta": delta, "op": op.index})
    anomalies["lost write"] = _lost_writes(orders, ok_reads, writer_of, committed)
    anomalies["unseen"] = [{"key": k, "value": s.value, "writer": op.index} for op in completions if op.type == "ok"
                           for k, sends in op.writes().items() for s in sends if s.value not in ok_reads.get(k, set())]
    anomalies["duplicate"] = _duplicates(orders)
    for name, cases in _poll_skips(ops, orders).items():
        anomalies[name] += cases
    anomalies["nonmonotonic send"] = _nonmonotonic_sends(ops, orders)
    anomalies["G0"] = [{"cycle": cycle} for cycle in _write_cycles(orders, writer_of)]
    return Analysis({name: cases for name, cases in anomalies.items() if cases}, orders)


def _indexed(op: Op, index: int) -> Op:
    return Op(op.process, op.type, op.f, op.value, op.keys, index)


def _values_by_key(maps: Iterable[dict[Hashable, Any]]) -> dict[Hashable, set[Hashable]]:
    found: dict[Hashable, set[Hashable]] = defaultdict(set)
    for per_key in maps:
        for key, items in per_key.items():
            found[key].update(item.value if isinstance(item, Send) else item[1] for item in items)
    return found


def _version_orders(completions: list[Op], committed: Callable[[Op], bool]) -> tuple[dict[Hashable, VersionOrder], list[dict[str, Any]]]:
    """Every poll, even of a failed op (a read_committed poll returns committed data whatever its op became), and the
    sends of ops that must have committed."""
    orders: dict[Hashable, VersionOrder] = defaultdict(VersionOrder)
    for op in completions:
        if committed(op):
            for key, sends in op.writes().items():
                for send in sends:
                    if send.offset is not None:
                        orders[key].log.setdefault(send.offset, set()).add(send.value)
        for key, pairs in op.reads().items():
            for offset, value in pairs:
                orders[key].log.setdefault(offset, set()).add(value)
    inconsistent = []
    for key, order in orders.items():
        for index, offset in enumerate(sorted(order.log)):
            values = order.log[offset]
            if len(values) > 1:
                inconsistent.append({"key": key, "offset": offset, "values": sorted(values, key=repr)})
            first = min(values, key=repr)
            order.by_index.append(first)
            for value in values:
                order.by_value[value] = index
    return dict(orders), inconsistent


def _pairs_out_of_order(orders: dict[Hashable, VersionOrder], values: dict[Hashable, list[Hashable]]) -> list[tuple[Hashable, tuple[Hashable, Hashable], int]]:
    """Successive values of one key in one op that do not follow each other directly in its order."""
    found = []
    for key, seen in values.items():
        for first, second in zip(seen, seen[1:]):
            delta = _delta(orders, key, first, second)
            if delta != 1:
                found.append((key, (first, second), delta))
    return found


def _delta(orders: dict[Hashable, VersionOrder], key: Hashable, first: Hashable, second: Hashable) -> int:
    """How far `second` is past `first` in the key's order: 1 when it follows it directly (or either is unplaced)."""
    order = orders.get(key)
    if order is None or first not in order.by_value or second not in order.by_value:
        return 1
    return order.by_value[second] - order.by_value[first]


def _lost_writes(orders: dict[Hashable, VersionOrder], ok_reads: dict[Hashable, set[Hashable]], writer_of: dict[tuple[Hashable, Hashable], Op],
                 committed: Callable[[Op], bool]) -> list[dict[str, Any]]:
    """Below the highest index read of each key, every value that must have committed was read: values are placed
    at their first appearance for the bound and at their last for what must be read, as Jepsen does when offsets
    disagree."""
    lost = []
    for key, read in ok_reads.items():
        order = orders.get(key)
        if order is None:
            continue
        offsets = sorted(order.log)
        first_index: dict[Hashable, int] = {}
        last_index: dict[Hashable, int] = {}
        for index, offset in enumerate(offsets):
            for value in order.log[offset]:
                first_index.setdefault(value, index)
                last_index[value] = index
        bound = max((first_index[v] for v in read if v in first_index), default=-1)
        for value, index in last_index.items():
            if index <= bound and value not in read and (key, value) in writer_of and committed(writer_of[(key, value)]):
                lost.append({"key": key, "value": value, "index": index, "max_read_index": bound, "writer": writer_of[(key, value)].index})
    return lost


def _duplicates(orders: dict[Hashable, VersionOrder]) -> list[dict[str, Any]]:
    found = []
    for key, order in orders.items():
        at: dict[Hashable, list[int]] = defaultdict(list)
        for offset in sorted(order.log):
            for value in order.log[offset]:
                at[value].append(offset)
        found += [{"key": key, "value": value, "offsets": offsets} for value, offsets in at.items() if len(offsets) > 1]
    return found


def _poll_skips(ops: list[Op], orders: dict[Hashable, VersionOrder]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    last_read: dict[int, dict[Hashable, tuple[Hashable, int]]] = defaultdict(dict)  # process -> key -> (last value read, op)
    for op in ops:
        if op.f == "assign" and op.type in ("ok", "info"):
            last_read[op.process] = {k: found_at for k, found_at in last_read[op.process].items() if k in op.keys}
        elif op.f in ("poll", "txn") and op.type == "ok":
            for key, values in op.read_values().items():
                if not values:
                    continue
                if key in last_read[op.process]:
                    previous, previous_op = last_read[op.process][key]
                    delta = _delta(orders, key, previous, values[0])
                    if delta != 1:
                        name = "poll skip" if delta > 1 else "nonmonotonic poll"
                        found[name].append({"key": key, "values": (previous, values[0]), "delta": delta, "ops": (previous_op, op.index)})
                last_read[op.process][key] = (values[-1], op.index)
    return found


def _nonmonotonic_sends(ops: list[Op], orders: dict[Hashable, VersionOrder]) -> list[dict[str, Any]]:
    found = []
    last_sent: dict[int, dict[Hashable, tuple[Hashable, int]]] = defaultdict(dict)
    for op in ops:
        if op.f in ("send", "txn") and op.type in ("ok", "info"):
            for key, sends in op.writes().items():
                if key in last_sent[op.process]:
                    previous, previous_op = last_sent[op.process][key]
                    delta = _delta(orders, key, previous, sends[0].value)
                    if delta < 1:
                        found.append({"key": key, "values": (previous, sends[0].value), "delta": delta, "ops": (previous_op, op.index)})
                last_sent[op.process][key] = (sends[-1].value, op.index)
    return found


def _write_cycles(orders: dict[Hashable, VersionOrder], writer_of: dict[tuple[Hashable, Hashable], Op]) -> list[list[int]]:
    """Cycles of write-write edges between ops (as op indexes), one per strongly connected component of the graph."""
    edges: dict[int, set[int]] = defaultdict(set)
    for key, order in orders.items():
        for before, after in zip(order.by_index, order.by_index[1:]):
            first, second = writer_of.get((key, before)), writer_of.get((key, after))
            if first is not None and second is not None and first.index != second.index:
                edges[first.index].add(second.index)
    return [_cycle_in(component, edges) for component in _strongly_connected(edges) if len(component) > 1]


def _strongly_connected(edges: dict[int, set[int]]) -> list[set[int]]:
    """Tarjan's algorithm, iterative (histories have thousands of ops)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components = []
    nodes = set(edges) | {n for targets in edges.values() for n in targets}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def _cycle_in(component: set[int], edges: dict[int, set[int]]) -> list[int]:
    """One cycle through the component's smallest node: a breadth-first path back to it, inside the component."""
    start = min(component)
    came_from: dict[int, int] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(edges.get(node, ())):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target in component and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"component {sorted(component)} has no cycle through {start}")
