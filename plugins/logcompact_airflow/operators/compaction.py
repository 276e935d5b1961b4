"""The compaction chain's operators: plan, dry run, commit, uncleanable partitions. Each acts on the catalog as it is
when it runs (`policy.now_ms`, never the run's logical date), so a backfill or a re-run of an old date cannot undo
newer work; each fails or retries as `policy` says. One error depends on the task: a `CommitConflictError` (files no
longer live, or leased to another plan) makes the plan task plan again (at once, then through its retries), but
fails the commit task at once, since only a new plan can fix it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from logcompact.exceptions import CommitConflictError
from logcompact.jobs import commit_plans, give_up, prepare_plans, uncleanable_report
from logcompact.jobs.explain import explain_run, minutes
from logcompact.limits import MAX_BUFFER_BYTES
from logcompact.planner import MODES, PlannerConfig
from logcompact.status import job_gauges
from logcompact.units import MiB
from logcompact_airflow.gauges import emit_gauges
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.policy import TRANSIENT_ERRORS, checked_flag, failing_at_once, now_ms
from logcompact_airflow.schedule import next_pass_in_ms

# Commits announce the topics they compacted as events of assets `logcompact://{cluster}/{topic}`.
COMPACTED_TOPICS = AssetAlias("logcompact-compacted-topics")
# The smallest key map a run's params may ask for (the trigger form's bound too): a plan itself takes any from
# `logcompact.limits.MIN_BUFFER_BYTES`, the size of one slot, but a map of a few keys only makes a job crawl.
MIN_PARAM_BUFFER_BYTES = MiB
# A forced run compacts any level holding this many files (or a top-level size tier of as many).
FORCED_MIN_FILES = 2
# Plans made at once by two DAGs can race for the same files; the loser plans again around the winner's.
PLAN_ATTEMPTS = 3


def forced_config(config: PlannerConfig) -> PlannerConfig:
    """The thresholds a forced run plans with: any level of at least FORCED_MIN_FILES files is due."""
    return replace(
        config,
        min_files=tuple(min(n, FORCED_MIN_FILES) for n in config.min_files),
        tier_min_files=min(config.tier_min_files, FORCED_MIN_FILES),
    )


class LogcompactPlanOperator(BaseOperator):
    """Plan a mode's compactions, lease their files, write the plans to the store; return one job per group.

    The return value (XCom) holds one job per group the plans record, `{"store_uri", "plan_id", "group",
    "label", "application_args"}`, for a mapped SparkSubmitOperator: a few names per group, however large the
    plan. A dry run logs the plans' estimates and returns no jobs. `force` (regular mode) plans with every
    level's threshold lowered to 2 files. The planner's settings come from the connection's extra `planner`;
    `min_files`, when given, overrides its thresholds (as the sensor waiting upstream was given).
    """

    template_fields = ("topics", "plan_only", "buffer_bytes", "force")

    def __init__(
        self,
        *,
        mode: str,
        logcompact_conn_id: str = LogcompactHook.default_conn_name,
        topics: Any = None,
        dry_run: Any = False,
        buffer_bytes: Any = None,
        force: Any = False,
        min_files: tuple[int, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"LogcompactPlanOperator mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.logcompact_conn_id = logcompact_conn_id
        self.topics = topics
        self.plan_only = dry_run  # not `dry_run`: that is BaseOperator's method
        self.buffer_bytes = buffer_bytes
        self.force = force
        self.min_files = min_files

    def execute(self, context: Any) -> list[dict]:
        # A lease conflict is planned again: here at once, then by the task's retries.
        with failing_at_once(retried=(*TRANSIENT_ERRORS, CommitConflictError)):
            topics, dry_run, buffer_bytes, force = _checked_params(self.topics, self.plan_only, self.buffer_bytes, self.force)
            hook = LogcompactHook(self.logcompact_conn_id)
            catalog = hook.get_catalog()
            config = hook.get_planner_config()
            if self.min_files is not None:
                config = replace(config, min_files=self.min_files)
            if buffer_bytes is not None:
                config = replace(config, buffer_bytes=buffer_bytes)
            if self.mode == "max-lag" and self.has_dag():
                # The planner's pass interval is the time to the DAG's next run: otherwise records stay dirty past the deadline.
                next_pass_ms = next_pass_in_ms(self.dag.timetable)
                if next_pass_ms is None:
                    self.log.info(
                        "max-lag pass: the DAG's schedule has no next run of its own; the next pass is assumed in %s "
                        "(the connection's max_lag_pass_interval_ms)", minutes(config.max_lag_pass_interval_ms),
                    )
                else:
                    config = replace(config, max_lag_pass_interval_ms=next_pass_ms)
                    self.log.info(
                        "max-lag pass: the DAG runs next in %s; a partition is planned when by then it would be dirty longer than %s",
                        minutes(next_pass_ms), minutes(config.max_lag_deadline_ms),
                    )
            if force:
                config = forced_config(config)
                self.log.info("forced (force=true): any level of %d files or more is compacted, whatever its threshold", FORCED_MIN_FILES)
            for attempt in range(1, PLAN_ATTEMPTS + 1):
                now = now_ms()
                try:
                    prepared = prepare_plans(catalog, self.mode, now, config, topics, dry_run)
                    break
                except CommitConflictError as conflict:
                    if attempt == PLAN_ATTEMPTS:
                        raise
                    # Another DAG's plan leased some of these files between this plan's snapshot and its lease.
                    self.log.warning("planning again (%d of %d): %s", attempt + 1, PLAN_ATTEMPTS, conflict)
            try:
                for line in explain_run(self.mode, catalog.planning_snapshot(now), prepared, now, config, topics, dry_run):
                    self.log.info("%s", line)
            except BaseException as failure:
                # A retry plans again: these plans' leases would hold their files from it until they expire. A catalog
                # gone meanwhile cannot release them: they are recorded as abandoned, and the task fails with its own
                # error rather than the release's.
                give_up(catalog, prepared.plan_ids, now, failure)
                raise
        return [{**asdict(job), "application_args": job.application_args()} for job in prepared.groups]


def _checked_params(topics: Any, dry_run: Any, buffer_bytes: Any, force: Any = False) -> tuple[list[str] | None, bool, int | None, bool]:
    """The UI's params, checked again here because operators are also called from users' own DAGs. None, what an
    optional param left empty gives, is its default."""
    if topics in (None, "", []):
        topics = None
    elif not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise ValueError(f"topics must be a list of topic names, not {topics!r}; e.g. [\"orders\"]")
    checked_flag("dry_run", dry_run)
    checked_flag("force", force)
    if buffer_bytes is not None and (
        isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int) or not MIN_PARAM_BUFFER_BYTES <= buffer_bytes <= MAX_BUFFER_BYTES
    ):
        raise ValueError(f"buffer_bytes must be an integer from {MIN_PARAM_BUFFER_BYTES} (1 MiB) to {MAX_BUFFER_BYTES} (2 GiB), not {buffer_bytes!r}")
    return topics, dry_run, buffer_bytes, force


class LogcompactDryRunOperator(BaseOperator):
    """Succeeds in a dry run and is skipped in any other, so that the grid shows which runs were dry (a task
    cannot set its run's note through the Task SDK)."""

    template_fields = ("plan_only",)

    def __init__(self, *, dry_run: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan_only = dry_run  # not `dry_run`: that is BaseOperator's method

    def execute(self, context: Any) -> None:
        if self.plan_only is not True:
            raise AirflowSkipException("not a dry run")
        self.log.info("dry run: planned and estimated only; nothing was leased, written or run (the plan task's log lists the plans)")


class LogcompactCommitOperator(BaseOperator):
    """Commit every plan its group jobs ran, atomically and once (a retry is a no-op that reports the same stats).

    Logs a per-topic table, and emits one asset event per compacted topic through `COMPACTED_TOPICS` with that
    topic's own figures (records and bytes in and out, records removed, partitions) and the plan ids as metadata.
    """

    template_fields = ("group_jobs",)

    def __init__(self, *, group_jobs: Any, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [COMPACTED_TOPICS])
        super().__init__(**kwargs)
        self.group_jobs = group_jobs
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict:
        plan_ids = sorted({job["plan_id"] for job in self.group_jobs})
        with failing_at_once():
            summary = commit_plans(LogcompactHook(self.logcompact_conn_id).get_catalog(), plan_ids, now_ms(), keep_going=True)
        for line in summary.describe():
            self.log.info("%s", line)
        emit_gauges(job_gauges([summary.stats[plan_id] for plan_id in summary.committed]))
        if summary.conflicts:
            # The other plans committed, and the log and gauges above say so; Airflow records asset events only of
            # a task that succeeds. A conflict needs a new plan, which no retry of the commit makes.
            raise AirflowFailException(f"{len(summary.conflicts)} of {len(plan_ids)} plan(s) not committed: {'; '.join(summary.conflicts)}")
        events = context["outlet_events"][COMPACTED_TOPICS]
        for topic in summary.topics:
            plans = [plan_id for plan_id, stats in summary.stats.items() if topic in stats["topics"]]
            events.add(topic_asset(summary.cluster_id, topic), extra={**summary.topic_stats.get(topic, {}), "plans": plans})
        return summary.to_dict()


class LogcompactUncleanableOperator(BaseOperator):
    """Fail, visibly (give it no retries), while the cluster has uncleanable partitions (Kafka's
    uncleanable-partitions-count above 0): they were set aside so the rest could commit, and stay so until their
    damaged files are restored or the marks cleared. Runs after the commit, whatever it committed."""

    def __init__(self, *, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_failed")
        super().__init__(**kwargs)
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> int:
        with failing_at_once():
            count, message = uncleanable_report(LogcompactHook(self.logcompact_conn_id).get_catalog())
        if count:
            raise AirflowFailException(message)
        self.log.info("%s", message)
        return count


def topic_asset(cluster_id: str, topic: str) -> Asset:
    """The asset of a cluster's topic, which the commit emits an event of for each topic it compacted."""
    return Asset(name=f"logcompact/{cluster_id}/{topic}", uri=f"logcompact://{cluster_id}/{topic}")
