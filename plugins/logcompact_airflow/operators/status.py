"""The metrics operator: `logcompact status` as the cluster's gauges (`logcompact_airflow.gauges`), under the tasks'
clock and error policy (`policy`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow.sdk import BaseOperator

from logcompact.status import ClusterStatus, PartitionStatus, cluster_status, worst_partitions
from logcompact.units import mib
from logcompact_airflow.gauges import emit_gauges
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.policy import failing_at_once, now_ms

# The partitions a run's log lists, the worst first: a log every 5 minutes of every partition buries them.
WORST_PARTITIONS = 20


class LogcompactMetricsOperator(BaseOperator):
    """Compute `logcompact status`, log a headline naming the worst partitions and a table of the `worst` of them
    (by dirty ratio, then compaction delay), emit the cluster's gauges; return the gauges."""

    def __init__(self, *, logcompact_conn_id: str = LogcompactHook.default_conn_name, worst: int = WORST_PARTITIONS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logcompact_conn_id = logcompact_conn_id
        self.worst = worst

    def execute(self, context: Any) -> dict[str, float | None]:
        with failing_at_once():
            hook = LogcompactHook(self.logcompact_conn_id)
            # The connection's planner settings: status's notion of clean is the planner's (dedup_from_level).
            status = cluster_status(hook.get_catalog(), now_ms(), hook.get_planner_config())
        for line in worst_first(status, self.worst):
            self.log.info("%s", line)
        emit_gauges(status.gauges)
        return status.gauges


def worst_first(status: ClusterStatus, worst: int) -> list[str]:
    """A headline naming the partitions behind the cleaner's maxima, then `logcompact status`'s table with only the
    `worst` partitions in `logcompact status --worst`'s order (`worst_partitions`), then how many were left out."""
    cleanable = [p for p in status.partitions if not p.uncleanable]  # as the gauges count them
    dirtiest = next(iter(worst_partitions(cleanable, 1)), None)
    delayed = max((p for p in cleanable if p.compaction_delay_s), key=lambda p: p.compaction_delay_s or 0.0, default=None)
    set_aside = [p for p in status.partitions if p.uncleanable]
    uncleanable = [_name(p) for p in worst_partitions(set_aside, 5)]
    headline = [
        "max-dirty-percent "
        + (f"{dirtiest.dirty_percent}% at {_name(dirtiest)} ({mib(dirtiest.dirty_bytes)} of {mib(dirtiest.bytes)} uncompressed not yet "
           "deduplicated)" if dirtiest else "0 (no partition of a compacted topic)"),
        "max-compaction-delay-secs "
        + (f"{delayed.compaction_delay_s:,.0f} at {_name(delayed)}" if delayed else "0 (no partition past its max.compaction.lag.ms)"),
        f"{len(set_aside)} uncleanable" + (f" ({', '.join(uncleanable)}{', ...' if len(set_aside) > 5 else ''})" if uncleanable else ""),
    ]
    shown = worst_partitions(status.partitions, worst)
    lines = [f"cleaner: {'; '.join(headline)}; {len(status.partitions):,} partitions of compacted topics, the {len(shown)} worst listed below", ""]
    lines += replace(status, partitions=shown).describe()
    if len(status.partitions) > len(shown):
        lines.append(f"... {len(status.partitions) - len(shown):,} partitions less dirty not listed (`logcompact status` lists every partition)")
    return lines


def _name(partition: PartitionStatus) -> str:
    return f"{partition.topic}/{partition.partition}"
