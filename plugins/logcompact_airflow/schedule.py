"""When a DAG runs next, as the max-lag planner must assume it.

The max-lag pass plans a partition when, by the next pass, it would have been dirty longer than the deadline;
so the planner's pass interval is the time from this pass to the DAG's next run, read from its schedule at each
pass. That is exact for schedules whose gaps differ (a cron such as "0 9-17 * * 1-5": an hour on weekdays, 64
hours over the weekend): the pass before a long gap compacts what would be late by its end, and the others do
not compact hours early.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pendulum
from croniter import croniter


def next_pass_in_ms(timetable: Any, now: datetime | None = None) -> int | None:
    """Milliseconds from `now` to the next run of an Airflow timetable: a cron, several crons or a timedelta
    (the task SDK's timetables and the scheduler's both). None for a schedule without runs of its own (None,
    "@once", assets, "@continuous")."""
    start = pendulum.instance(now) if now else pendulum.now("UTC")
    delta = _attribute(timetable, "delta")
    if delta is not None:  # DeltaTriggerTimetable, DeltaDataIntervalTimetable: every `delta` from the last run
        return int(((start + delta) - start).total_seconds() * 1000)
    crons = [timetable] if _attribute(timetable, "expression") else list(getattr(timetable, "timetables", ()))
    runs = [_next_run(cron, start) for cron in crons if _attribute(cron, "expression")]
    if not runs:
        return None
    return int((min(runs) - start).total_seconds() * 1000)


def _next_run(cron: Any, start: pendulum.DateTime) -> datetime:
    timezone = pendulum.timezone(str(_attribute(cron, "timezone") or "UTC"))
    return croniter(_attribute(cron, "expression"), start.in_timezone(timezone), ret_type=datetime).get_next()


def _attribute(timetable: Any, name: str) -> Any:
    """The task SDK's timetables name their settings plainly; the scheduler's keep them with a leading _."""
    return getattr(timetable, name, None) or getattr(timetable, f"_{name}", None)
