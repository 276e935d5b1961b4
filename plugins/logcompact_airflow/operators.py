"""Plan, commit and gc as Airflow operators. Each acts on the catalog as it is when it runs (wall-clock now,
never the run's logical date), so a backfill or a re-run of an old date cannot undo newer work."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk import Asset, AssetAlias, BaseOperator

from logcompact.jobs import DEFAULT_GC_GRACE_MS, collect_garbage, commit_plans, prepare_plans, uncleanable_report
from logcompact.plan import MAX_BUFFER_BYTES
from logcompact.planner import MODES, PlannerConfig
from logcompact_airflow.hooks import LogcompactHook

# Commits announce the topics they compacted as events of assets `logcompact://{cluster}/{topic}`.
COMPACTED_TOPICS = AssetAlias("logcompact-compacted-topics")
MIN_BUFFER_BYTES = 1024**2


def _now_ms() -> int:
    return int(time.time() * 1000)


class LogcompactPlanOperator(BaseOperator):
    """Plan a mode's compactions, lease their files, write the plans to the store; return one job per group.

    The return value (XCom) holds one job per group the plans record, `{"store_uri", "plan_id", "group",
    "label", "application_args"}`, for a mapped SparkSubmitOperator: a few names per group, however large the
    plan. A dry run logs the plans' estimates and returns no jobs.
    """

    template_fields = ("topics", "dry_run", "buffer_bytes")

    def __init__(
        self,
        *,
        mode: str,
        logcompact_conn_id: str = LogcompactHook.default_conn_name,
        topics: Any = None,
        dry_run: Any = False,
        buffer_bytes: Any = None,
        min_files: tuple[int, int, int, int] = PlannerConfig.min_files,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"LogcompactPlanOperator mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.logcompact_conn_id = logcompact_conn_id
        self.topics = topics
        self.dry_run = dry_run
        self.buffer_bytes = buffer_bytes
        self.min_files = tuple(min_files)  # as the sensor waiting upstream was given

    def execute(self, context: Any) -> list[dict]:
        topics, dry_run, buffer_bytes = _checked_params(self.topics, self.dry_run, self.buffer_bytes)
        catalog = LogcompactHook(self.logcompact_conn_id).get_catalog()
        config = PlannerConfig(min_files=self.min_files)
        if buffer_bytes is not None:
            config = replace(config, buffer_bytes=buffer_bytes)
        prepared = prepare_plans(catalog, self.mode, _now_ms(), config, topics, dry_run)
        self.log.info("%s", prepared.thresholds.describe())
        for estimate in prepared.estimates:
            self.log.info("%s plan: %s", "dry-run" if dry_run else "leased", json.dumps(estimate))
        self.log.info("%d plan(s), %d group job(s)%s", len(prepared.estimates), len(prepared.groups), " (dry run: nothing written)" if dry_run else "")
        return [{**asdict(job), "application_args": job.application_args()} for job in prepared.groups]


def _checked_params(topics: Any, dry_run: Any, buffer_bytes: Any) -> tuple[list[str] | None, bool, int | None]:
    """The UI's params, checked again here because operators are also called from users' own DAGs."""
    if topics in (None, "", []):
        topics = None
    elif not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise ValueError(f"topics must be a list of topic names, not {topics!r}; e.g. [\"orders\"]")
    if not isinstance(dry_run, bool):
        raise ValueError(f"dry_run must be true or false, not {dry_run!r}; pass a bool (with templates, set the DAG's render_template_as_native_obj=True)")
    if buffer_bytes is not None and (
        isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int) or not MIN_BUFFER_BYTES <= buffer_bytes <= MAX_BUFFER_BYTES
    ):
        raise ValueError(f"buffer_bytes must be an integer from {MIN_BUFFER_BYTES} (1 MiB) to {MAX_BUFFER_BYTES} (2 GiB), not {buffer_bytes!r}")
    return topics, dry_run, buffer_bytes


class LogcompactCommitOperator(BaseOperator):
    """Commit every plan its group jobs ran, atomically and once (a retry is a no-op that reports the same stats).

    Emits one asset event per compacted topic through `COMPACTED_TOPICS`, with the plans' stats as metadata.
    """

    template_fields = ("group_jobs",)

    def __init__(self, *, group_jobs: Any, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [COMPACTED_TOPICS])
        super().__init__(**kwargs)
        self.group_jobs = group_jobs
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict:
        plan_ids = sorted({job["plan_id"] for job in self.group_jobs})
        catalog = LogcompactHook(self.logcompact_conn_id).get_catalog()
        summary = commit_plans(catalog, plan_ids, _now_ms())
        self.log.info("committed %s; already committed %s; manifest version %d", summary.committed, summary.already_committed, summary.manifest_version)
        for partition in summary.uncleanable:
            self.log.warning("set aside as uncleanable: %s/%d: %s", partition["topic"], partition["partition"], partition["reason"])
        events = context["outlet_events"][COMPACTED_TOPICS]
        for topic in summary.topics:
            events.add(_topic_asset(summary.cluster_id, topic), extra={"plans": summary.stats})
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
        count, message = uncleanable_report(LogcompactHook(self.logcompact_conn_id).get_catalog())
        if count:
            raise AirflowFailException(message)
        self.log.info("%s", message)
        return count


def _topic_asset(cluster_id: str, topic: str) -> Asset:
    return Asset(name=f"logcompact/{cluster_id}/{topic}", uri=f"logcompact://{cluster_id}/{topic}")


class LogcompactGcOperator(BaseOperator):
    """Release expired leases; delete replaced files no kept version holds, uncommitted outputs and old plans
    past their grace; trim the commit log to the kept versions."""

    def __init__(self, *, grace_ms: int = DEFAULT_GC_GRACE_MS, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grace_ms = grace_ms
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict:
        report = collect_garbage(LogcompactHook(self.logcompact_conn_id).get_catalog(), _now_ms(), self.grace_ms)
        self.log.info(
            "gc: %d data files, %d plan objects deleted; %d commit-log versions trimmed; %d expired leases released; "
            "%d young files kept; %d work directories of dead jobs removed",
            len(report.deleted_files), len(report.deleted_plans), report.trimmed_versions,
            len(report.released_leases), report.kept_unreferenced_young, len(report.reclaimed_workdirs),
        )
        return report.to_dict()
