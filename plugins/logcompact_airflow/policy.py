"""What every logcompact task shares: its clock and its error policy, used alike by the operators and the sensor.

The clock is the wall clock: each task acts on the catalog as it is when it runs, never at the run's logical date,
so a backfill or a re-run of an old date cannot undo newer work.

Which errors are retried: a retry runs the same task again, so only an error that the world may have fixed by
then is worth one. Those are `TRANSIENT_ERRORS`, the store or the catalog database not answering. Every other
`LogcompactError` (unknown topic, bad plan or connection settings, damaged data, a schema mismatch) and every
`ValueError` (bad params) fails the task at once, as `AirflowFailException` with the same one-line message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from logcompact.exceptions import CatalogUnavailableError, LogcompactError, StoreError
from logcompact.units import wall_clock_ms

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (StoreError, CatalogUnavailableError)


# The tasks' clock: logcompact's own (epoch milliseconds, as the catalog keeps times).
now_ms = wall_clock_ms


@contextmanager
def failing_at_once(retried: tuple[type[Exception], ...] = TRANSIENT_ERRORS) -> Iterator[None]:
    """Errors no retry can fix raise AirflowFailException (the task fails without its retries); `retried` pass."""
    try:
        yield
    except retried:
        raise
    except (ValueError, LogcompactError) as exc:
        raise AirflowFailException(str(exc)) from exc


def checked_flag(name: str, value: Any) -> bool:
    """A bool param, checked: templates render strings unless the DAG renders native objects."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, not {value!r}; pass a bool (with templates, set the DAG's render_template_as_native_obj=True)")
    return value
