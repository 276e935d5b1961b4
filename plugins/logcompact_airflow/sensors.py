"""Wait until a level of the catalog holds enough files to compact (reschedule mode: no slot held while waiting)."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from logcompact.jobs import check_thresholds
from logcompact.planner import PlannerConfig
from logcompact_airflow.hooks import LogcompactHook


class LogcompactThresholdSensor(BaseSensorOperator):
    """Done when some level L0..L3 holds at least its `min_files` files not leased to an in-flight plan."""

    def __init__(
        self,
        *,
        logcompact_conn_id: str = LogcompactHook.default_conn_name,
        min_files: tuple[int, int, int, int] = PlannerConfig.min_files,
        mode: str = "reschedule",
        **kwargs: Any,
    ) -> None:
        super().__init__(mode=mode, **kwargs)
        self.logcompact_conn_id = logcompact_conn_id
        self.min_files = tuple(min_files)

    def poke(self, context: Any) -> PokeReturnValue:
        snapshot = LogcompactHook(self.logcompact_conn_id).get_catalog().snapshot()
        status = check_thresholds(snapshot, int(time.time() * 1000), PlannerConfig(min_files=self.min_files))
        self.log.info("%s", status.describe())
        return PokeReturnValue(is_done=status.reached, xcom_value={f"L{k}": v for k, v in status.counts.items()})
