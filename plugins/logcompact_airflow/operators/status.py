"""The metrics operator: `logcompact status` as the cluster's gauges (`logcompact_airflow.gauges`), under the tasks'
clock and error policy (`policy`)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from logcompact.status import cluster_status
from logcompact_airflow.gauges import emit_gauges
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.policy import failing_at_once, now_ms


class LogcompactMetricsOperator(BaseOperator):
    """Compute `logcompact status`, log its table, emit the cluster's gauges; return the gauges."""

    def __init__(self, *, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict[str, float | None]:
        with failing_at_once():
            hook = LogcompactHook(self.logcompact_conn_id)
            # The connection's planner settings: status's notion of clean is the planner's (dedup_from_level).
            status = cluster_status(hook.get_catalog(), now_ms(), hook.get_planner_config())
        for line in status.describe():
            self.log.info("%s", line)
        emit_gauges(status.gauges)
        return status.gauges
