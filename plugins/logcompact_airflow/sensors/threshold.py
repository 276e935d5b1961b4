"""Wait until a level of the catalog holds enough files to compact (reschedule mode: no slot held while waiting)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

from logcompact.jobs import check_thresholds
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.policy import checked_flag, failing_at_once, now_ms


class LogcompactThresholdSensor(BaseSensorOperator):
    """Done when some level L0..L3 holds at least its `min_files` files not leased to an in-flight plan, or at
    once when `force` is true. `min_files` defaults to the connection's planner settings (32 per level).

    With `skip_on_timeout`, a wait that reaches `timeout` skips the run (nothing was due) instead of failing it.
    Not Airflow's `soft_fail`: that skips on every failure, so a bad param or a broken connection would skip
    every run in silence."""

    template_fields = ("force",)

    def __init__(
        self,
        *,
        logcompact_conn_id: str = LogcompactHook.default_conn_name,
        min_files: tuple[int, ...] | None = None,
        force: Any = False,
        skip_on_timeout: bool = False,
        mode: str = "reschedule",
        **kwargs: Any,
    ) -> None:
        super().__init__(mode=mode, **kwargs)
        self.logcompact_conn_id = logcompact_conn_id
        self.min_files = min_files
        self.force = force
        self.skip_on_timeout = skip_on_timeout

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowSensorTimeout as timeout:
            if not self.skip_on_timeout:
                raise
            raise AirflowSkipException(f"no level reached its threshold within {self.timeout:.0f} s; nothing to compact this run") from timeout

    def poke(self, context: Any) -> PokeReturnValue:
        with failing_at_once():
            if checked_flag("force", self.force):
                self.log.info("forced (force=true): not waiting for any threshold; the plan compacts what it can now")
                return PokeReturnValue(is_done=True)
            hook = LogcompactHook(self.logcompact_conn_id)
            config = hook.get_planner_config()
            if self.min_files is not None:
                config = replace(config, min_files=self.min_files)
            now = now_ms()
            # As the planner counts: files held only by set-aside (uncleanable) partitions are left out.
            status = check_thresholds(hook.get_catalog().planning_snapshot(now), now, config)
        if not status.reached:
            self.log.info(
                "waiting for a level to reach its threshold (poked every %d s, for up to %d s); trigger with force=true to run now",
                self.poke_interval, self.timeout,
            )
        self.log.info("%s", status.describe())
        return PokeReturnValue(is_done=status.reached, xcom_value={f"L{k}": v for k, v in status.counts.items()})
