"""How often a DAG runs, as the max-lag planner must assume it.

The max-lag pass plans a partition when, by the next pass, it would have been dirty longer than the deadline;
so the planner's pass interval must be the DAG's real one. A schedule with gaps of different lengths (a cron
such as "0 9,17 * * *") gives its longest gap: an interval longer than the real one only compacts earlier,
a shorter one lets records stay dirty past the deadline.
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime, timedelta
from typing import Any

import pendulum
from croniter import croniter

# The gaps of a cron schedule are read over its next runs, up to this many or this far ahead: a year of a
# daily or weekly pattern, a month of an hourly one.
_CRON_RUNS = 1000
_CRON_HORIZON = timedelta(days=366)


def pass_interval_ms(timetable: Any, now: datetime | None = None) -> int:
    """The longest time between two runs of an Airflow timetable (cron or timedelta schedules), in milliseconds."""
    start = pendulum.instance(now) if now else pendulum.now("UTC")
    if hasattr(timetable, "delta"):  # DeltaTriggerTimetable, DeltaDataIntervalTimetable
        return int(((start + timetable.delta) - start).total_seconds() * 1000)
    if hasattr(timetable, "expression"):  # CronTriggerTimetable, CronDataIntervalTimetable
        crons = [timetable]
    elif hasattr(timetable, "timetables"):  # MultipleCronTriggerTimetable
        crons = list(timetable.timetables)
    else:
        raise ValueError(
            f"the max-lag DAG's schedule ({type(timetable).__name__}) has no regular interval; "
            "give it a cron or timedelta schedule such as '@hourly', which its planner assumes between passes"
        )
    return _longest_gap_ms(crons, start)


def _longest_gap_ms(crons: list[Any], start: pendulum.DateTime) -> int:
    runs = heapq.merge(*(
        croniter(cron.expression, start.in_timezone(pendulum.timezone(str(cron.timezone))), ret_type=datetime).all_next()
        for cron in crons
    ))
    times = list(itertools.takewhile(lambda t: t <= start + _CRON_HORIZON, itertools.islice(runs, _CRON_RUNS)))
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return int(max(gaps).total_seconds() * 1000)
