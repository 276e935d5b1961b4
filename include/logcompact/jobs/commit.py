"""The commit step: a plan's outputs replace its inputs in one catalog transaction, once, from its groups' results."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog, SetAside
from logcompact.exceptions import CommitConflictError, CorruptDataError, LogcompactError, ObjectNotFoundError, PlansNotCommittedError
from logcompact.plans import Plan, PlanHeader, read_header, read_results
from logcompact.plans.documents import check_seal
from logcompact.plans.results import CompactionStats, JobResult, add_topic_figures, summarize
from logcompact.units import mib

log = logging.getLogger(__name__)

def commit_plan(catalog: Catalog, plan: Plan | PlanHeader, results: list[JobResult], now_ms: int, leased: bool = False) -> bool:
    """Replace the plan's inputs by the outputs of all its groups, in one transaction; whether this call committed.
    The plan's header is enough (its ids and input files).

    A plan already committed (a retried job) is a no-op. An input that is no longer live is a
    CommitConflictError and nothing changes. With `leased`, the plan's lease must still hold at the commit:
    once it has expired, gc may collect the outputs, so the commit is refused and the plan must be made again.
    """
    if catalog.is_committed(plan.plan_id):  # first: after gc, a committed plan's outputs may be gone
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return False
    if plan.cluster_id != catalog.cluster_id:
        raise CommitConflictError(
            f"plan {plan.plan_id} is for cluster {plan.cluster_id}, not {catalog.cluster_id}; commit it to its own catalog"
        )
    outputs = [data_file for result in results for data_file in result.outputs]
    for data_file in outputs:
        if catalog.store.stat(data_file.key) is None:
            raise CommitConflictError(
                f"plan {plan.plan_id}: output {data_file.key} is missing from the store (collected by gc after the "
                "plan's lease expired?); plan again"
            )
    # Partitions a job set aside keep their sections where they are, and are marked uncleanable.
    marks = [SetAside(**mark) for result in results for mark in result.stats.uncleanable]
    committed = catalog.replace_files(
        [f.key for f in plan.inputs], outputs, now_ms, plan_id=plan.plan_id, expected_version=plan.manifest_version,
        leased=leased, kept={(m.topic, m.partition) for m in marks} | set(plan.set_aside), marks=marks,
    ).committed
    if not committed:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
    return committed


@dataclass
class PlanResult:
    """A plan run and committed: the statistics of each of its jobs (groups, or their slices)."""

    plan_id: str
    jobs: list[CompactionStats]
    bytes_in: int  # the plan's input files (a file read by several jobs counts once)

    def to_dict(self) -> dict:
        return summarize(self.jobs, self.bytes_in)


@dataclass
class CommitSummary:
    committed: list[str] = field(default_factory=list)
    already_committed: list[str] = field(default_factory=list)
    stats: dict[str, dict] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)
    cluster_id: str = ""
    manifest_version: int = 0  # the catalog's newest version once the plans are committed
    uncleanable: list[dict] = field(default_factory=list)  # partitions these plans set aside (SetAside as dicts)
    topic_stats: dict[str, dict[str, int]] = field(default_factory=dict)  # each topic's figures over these plans
    conflicts: list[str] = field(default_factory=list)  # why plans did not commit (`commit_plans(keep_going=True)`)

    def to_dict(self) -> dict:
        return asdict(self)

    def _bytes(self, plan_id: str) -> str:
        """A committed plan's stored bytes in (its whole input files) and out."""
        stats = self.stats[plan_id]
        return f"{mib(stats['bytes_in'])} of input files stored, {mib(stats['bytes_out'])} written"

    def describe(self) -> list[str]:
        """What the commit did, for a log: the plans, then a table of each topic's figures, then what was set aside."""
        committed = [f"{plan_id} ({self._bytes(plan_id)})" for plan_id in self.committed]
        lines = [
            (f"committed {len(committed)} plan(s): {'; '.join(committed)}" if committed else "committed no plan")
            + (f"; committed before (a retry): {', '.join(self.already_committed)}" if self.already_committed else "")
            + f"; manifest version {self.manifest_version}"
        ]
        if self.topic_stats:
            rows = [("topic", "partitions", "records in", "records out", "duplicates", "tombstones", "expired", "aborted", "MiB in", "MiB out")]
            for topic, f in sorted(self.topic_stats.items()):
                rows.append((
                    topic, f"{f['partitions']:,}", f"{f['records_in']:,}", f"{f['records_out']:,}", f"{f['duplicates_removed']:,}",
                    f"{f['tombstones_removed']:,}", f"{f['expired_removed']:,}", f"{f.get('aborted_removed', 0):,}",
                    mib(f["uncompressed_bytes_in"]).removesuffix(" MiB"), mib(f["uncompressed_bytes_out"]).removesuffix(" MiB"),
                ))
            widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
            lines += ["  ".join(cell.ljust(w) if n == 0 else cell.rjust(w) for n, (cell, w) in enumerate(zip(row, widths))) for row in rows]
            lines.append(
                "(duplicates, tombstones, expired, aborted (of aborted transactions): records removed; MiB in and out: uncompressed "
                "bytes of the topic's sections)"
            )
        lines += [f"set aside as uncleanable: {p['topic']}/{p['partition']}: {p['reason']}" for p in self.uncleanable]
        lines += [f"not committed: {conflict}" for conflict in self.conflicts]
        return lines


def commit_plans(catalog: Catalog, plan_ids: list[str], now_ms: int, keep_going: bool = False) -> CommitSummary:
    """Commit each plan from its header and its groups' results in the store; plans committed before are counted,
    not redone.

    A plan with a group missing its result, whose inputs are no longer live, or whose lease has expired is a
    CommitConflictError and commits nothing. The call's other plans commit regardless (each is its own transaction
    over files leased to it alone), whatever stopped one plan: a conflict, a document changed since it was sealed,
    a missing or damaged document, the store or the catalog failing. Then the failures are raised together as one
    error whose message gives each plan's on one line (`failed_together`: CommitConflictError when they are all
    conflicts), or with `keep_going` listed in the summary's `conflicts`, for a caller that reports what did commit
    first.
    """
    summary = CommitSummary()
    topics: set[str] = set()
    failures: list[tuple[str, Exception]] = []
    for plan_id in plan_ids:
        try:
            try:
                header = read_header(catalog.store, plan_id)
            except ObjectNotFoundError:
                if not catalog.is_committed(plan_id):
                    raise
                # Committed long ago and its documents collected since: nothing to redo, no stats to report.
                summary.already_committed.append(plan_id)
                continue
            results = read_results(catalog.store, header)
            if not catalog.is_committed(plan_id):
                # Never trusted: the stored documents must be those the planner sealed with the lease (the planner
                # made them from the catalog, and Spark jobs never open it), and the header must still check out.
                check_seal(catalog.store, header, catalog.plan_seal(plan_id))
                header.check_against(catalog.snapshot(), now_ms)
            committed = commit_plan(catalog, header, results, now_ms, leased=True)
        except Exception as failure:  # each plan's failure is reported with the others', after they commit
            log.warning("plan %s not committed: %s", plan_id, _one_line(failure))
            failures.append((plan_id, failure))
            summary.conflicts.append(_failure_line(plan_id, failure))
            continue
        (summary.committed if committed else summary.already_committed).append(plan_id)
        summary.stats[plan_id] = PlanResult(plan_id, [r.stats for r in results], sum(f.size for f in header.inputs)).to_dict()
        summary.uncleanable += summary.stats[plan_id]["uncleanable"]
        add_topic_figures(summary.topic_stats, summary.stats[plan_id]["topics"])
        topics.update(header.topics)
    if plan_ids:
        try:
            summary.cluster_id, summary.manifest_version = catalog.cluster_id, catalog.latest_version()
        except Exception:
            if not failures:
                raise  # (else the plans' failures say more: most likely the same database gone)
    summary.topics = sorted(topics)
    if failures and not keep_going:
        raise failed_together(failures)
    return summary


def failed_together(failures: list[tuple[str, Exception]]) -> LogcompactError:
    """One error for the failures of several plans, (plan id, error), each on one line of its message, joined by
    '; ' (the CLI prints one line): of their common type when they are all of one LogcompactError type (all
    conflicts: CommitConflictError, which a new plan fixes; the catalog down: CatalogUnavailableError, which a
    retry may), PlansNotCommittedError otherwise. The first failure that is not a LogcompactError (a bug) is its
    cause, for its traceback."""
    kinds = {type(failure) for _, failure in failures}
    message = "; ".join(_failure_line(plan_id, failure) for plan_id, failure in failures)
    if len(failures) > 1:
        message = f"{len(failures)} plans not committed: {message}"
    kind = kinds.pop() if len(kinds) == 1 else None
    error: LogcompactError
    if kind is not None and issubclass(kind, LogcompactError):
        try:
            error = kind(message)
        except TypeError:  # an error type of another signature
            error = PlansNotCommittedError(message)
        if isinstance(error, CorruptDataError):
            error.key = getattr(failures[0][1], "key", None)
    else:
        error = PlansNotCommittedError(message)
    error.__cause__ = next((failure for _, failure in failures if not isinstance(failure, LogcompactError)), None)
    return error


def _failure_line(plan_id: str, failure: Exception) -> str:
    """A plan's failure on one line, naming the plan."""
    line = _one_line(failure)
    if not isinstance(failure, LogcompactError):
        line = f"{type(failure).__name__}: {line}"
    return line if plan_id in line else f"plan {plan_id}: {line}"


def _one_line(failure: BaseException) -> str:
    return " ".join(str(failure).split()) or type(failure).__name__


def uncleanable_report(catalog: Catalog) -> tuple[int, str]:
    """Kafka's uncleanable-partitions-count for the cluster, and one line saying which partitions and what to do."""
    marks = catalog.uncleanable()
    if not marks:
        return 0, "no uncleanable partitions"
    listed = "; ".join(f"{m.topic}/{m.partition} ({m.bytes:,} bytes, {m.failures} failure(s)): {m.reason}" for m in marks[:5])
    more = f"; and {len(marks) - 5} more" if len(marks) > 5 else ""
    return len(marks), (
        f"{len(marks)} uncleanable partition(s), set aside while the rest compacted: {listed}{more}. Restore the damaged "
        "files from a copy (planners retry once a file changes, or after the backoff), then `logcompact uncleanable "
        "clear`; `logcompact uncleanable` lists them"
    )
