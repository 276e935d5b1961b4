"""logcompact's Airflow operators, one module per task family, as the providers keep them: the compaction chain
(`compaction`), gc, metrics. Every one runs under the clock and error policy of `logcompact_airflow.policy`."""

from logcompact_airflow.operators.compaction import (
    COMPACTED_TOPICS,
    MIN_PARAM_BUFFER_BYTES,
    LogcompactCommitOperator,
    LogcompactDryRunOperator,
    LogcompactPlanOperator,
    LogcompactUncleanableOperator,
    forced_config,
)
from logcompact_airflow.operators.gc import LogcompactGcOperator
from logcompact_airflow.operators.metrics import LogcompactMetricsOperator

__all__ = [
    "COMPACTED_TOPICS",
    "MIN_PARAM_BUFFER_BYTES",
    "LogcompactCommitOperator",
    "LogcompactDryRunOperator",
    "LogcompactGcOperator",
    "LogcompactMetricsOperator",
    "LogcompactPlanOperator",
    "LogcompactUncleanableOperator",
    "forced_config",
]
