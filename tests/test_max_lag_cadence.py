"""The max-lag pass's interval is the time to its DAG's next run, and at that cadence no record stays dirty more than 30 minutes
past its topic's max.compaction.lag.ms (the simulator follows every record to its deduplication).

The planner plans a partition when, by the next pass, it would be dirty longer than the deadline; told a shorter
interval than the real one (the bug this guards: an hourly DAG planning as if passes came every 15 minutes),
records wait up to an hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from logcompact.lab.simulate import Simulation, Workload
from logcompact.planner import PlannerConfig
from logcompact_airflow.schedule import next_pass_in_ms

MINUTE_MS = 60_000
DAGS = Path(__file__).resolve().parents[1] / "dags"
# Few records over many partitions: levels fill slowly, so partitions reach their 2 h max lag with data not yet
# deduplicated against their older data, and the max-lag pass is what compacts them (min.cleanable.dirty.ratio
# off: at Kafka's 0.5 the regular passes would deduplicate them first).
SLOW_LEVELS = Workload(agents=1, records_per_s=50, partitions=32, keys=20_000, hours=6.0, max_lag_ms=2 * 60 * MINUTE_MS,
                       min_cleanable_dirty_ratio=1.0)


def _timetable(schedule):
    from airflow.sdk import DAG

    return DAG(dag_id="cadence", schedule=schedule).timetable


WEDNESDAY = datetime(2026, 11, 25, 10, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "now", "minutes"),
    [("@hourly", WEDNESDAY, 53), ("*/20 * * * *", WEDNESDAY, 13), (timedelta(minutes=45), WEDNESDAY, 45),
     ("@daily", WEDNESDAY, 13 * 60 + 53), ("0 9,17 * * *", WEDNESDAY, 6 * 60 + 53),
     ("0 9-17 * * 1-5", WEDNESDAY, 53), ("0 9-17 * * 1-5", datetime(2026, 11, 27, 17, 30, tzinfo=UTC), 63 * 60 + 30),
     ("@yearly", WEDNESDAY, 36 * 24 * 60 + 13 * 60 + 53)],  # the weekend gap only on Friday evening
)
def test_the_pass_interval_is_the_time_to_the_next_run(schedule, now: datetime, minutes: int) -> None:
    assert next_pass_in_ms(_timetable(schedule), now) == minutes * MINUTE_MS


def test_the_schedulers_own_timetables_are_read_too() -> None:
    from airflow.timetables.interval import CronDataIntervalTimetable
    from airflow.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable

    assert next_pass_in_ms(CronTriggerTimetable("0 * * * *", timezone="UTC"), WEDNESDAY) == 53 * MINUTE_MS
    assert next_pass_in_ms(CronDataIntervalTimetable("*/20 * * * *", timezone="UTC"), WEDNESDAY) == 13 * MINUTE_MS
    assert next_pass_in_ms(DeltaTriggerTimetable(timedelta(minutes=45)), WEDNESDAY) == 45 * MINUTE_MS


@pytest.mark.parametrize("schedule", [None, "@once"])
def test_a_schedule_without_runs_of_its_own_leaves_the_interval_to_the_connection(schedule) -> None:
    assert next_pass_in_ms(_timetable(schedule), WEDNESDAY) is None


def _simulate(every_minutes: int, planner_told_minutes: int) -> dict:
    config = PlannerConfig(max_lag_pass_interval_ms=planner_told_minutes * MINUTE_MS)
    return Simulation("cadence", SLOW_LEVELS, config, max_lag_every_ms=every_minutes * MINUTE_MS).run().summary()


@pytest.mark.parametrize("minutes", [15, 60, 20])
def test_passes_at_the_interval_the_planner_assumes_keep_every_record_within_30_minutes_of_its_lag(minutes: int) -> None:
    summary = _simulate(minutes, minutes)
    assert summary["max_lag_violations"] == 0 and summary["max_minutes_past_lag"] <= 30


def test_an_hourly_pass_planned_as_if_every_15_minutes_leaves_records_dirty_an_hour() -> None:
    summary = _simulate(60, 15)
    assert summary["max_lag_violations"] > 0 and summary["max_minutes_past_lag"] > 30


def test_the_max_lag_dag_tells_its_planner_its_own_schedule_and_holds_the_deadline(airflow_db) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / "logcompact_max_lag_hourly.py")).dags["logcompact_max_lag_hourly"]
    interval = next_pass_in_ms(dag.timetable, datetime(2026, 11, 25, 10, 0, tzinfo=UTC))  # a pass on the hour
    assert interval == 60 * MINUTE_MS
    summary = _simulate(interval // MINUTE_MS, interval // MINUTE_MS)
    assert summary["max_lag_violations"] == 0 and summary["max_minutes_past_lag"] <= 30
