"""The gc operator: what `logcompact gc` does, under the tasks' clock and error policy (`policy`)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from logcompact.jobs import DEFAULT_GC_GRACE_MS, collect_garbage
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.policy import failing_at_once, now_ms


class LogcompactGcOperator(BaseOperator):
    """Release expired leases; delete replaced files no kept version holds, uncommitted outputs and old plans
    past their grace; trim the commit log to the kept versions."""

    def __init__(self, *, grace_ms: int = DEFAULT_GC_GRACE_MS, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grace_ms = grace_ms
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict:
        with failing_at_once():
            report = collect_garbage(LogcompactHook(self.logcompact_conn_id).get_catalog(), now_ms(), self.grace_ms)
        self.log.info(
            "gc: %d data files, %d plan objects deleted; %d commit-log versions trimmed; %d expired leases released; "
            "%d young files kept; %d work directories of dead jobs removed; %d aborted transactions' ranges forgotten",
            len(report.deleted_files), len(report.deleted_plans), report.trimmed_versions,
            len(report.released_leases), report.kept_unreferenced_young, len(report.reclaimed_workdirs),
            report.forgotten_aborted_ranges,
        )
        return report.to_dict()
