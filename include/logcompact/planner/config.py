"""The planner's knobs, with WarpStream's values as defaults."""

from __future__ import annotations

from dataclasses import dataclass

from logcompact.exceptions import InvalidPlanError
from logcompact.limits import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_GROUP_BYTES,
    DEFAULT_MAX_LAG_PASS_INTERVAL_MS,
    DEFAULT_MAX_PARTITION_BYTES,
    DEFAULT_MIN_FILES,
    DEFAULT_TARGET_FILE_BYTES,
    MAX_BUFFER_BYTES,
    MAX_BYTE_COUNT,
    MAX_PLAN_AGE_MS,
    MAX_TARGET_FILE_BYTES,
    MIN_BUFFER_BYTES,
)
from logcompact.units import MINUTE_MS


@dataclass(frozen=True)
class PlannerConfig:
    # A level is compacted into the next once it holds this many files (L0, L1, L2, L3): four counts of at
    # least 1, given as a tuple or a list (as Airflow renders them and JSON holds them).
    min_files: tuple[int, ...] = (DEFAULT_MIN_FILES,) * 4
    # Records are deduplicated from this level up; L0 to L1 only copies and splits.
    dedup_from_level: int = 2
    # A small cluster's top level is L2; a big one's is L4. A cluster is big once it holds at least
    # `big_cluster_files` live files at L1 and above (the count grows with ingest rate and time between
    # sweeps); a level that already holds files is never abandoned.
    small_cluster_top: int = 2
    big_cluster_top: int = 4
    big_cluster_files: int = 512
    # Size tiers at the top level: `tier_min_files` files whose sizes are within `tier_size_ratio` of
    # the tier's smallest are merged; files of very different sizes are not, except by the full sweep.
    # 2x, not wider: the simulator measured 31% more write amplification at 4x (docs/planner.md).
    tier_min_files: int = 10
    tier_size_ratio: float = 2.0
    # Max-lag pass: how often it runs, and how long after a record becomes dirty it must be compacted.
    max_lag_pass_interval_ms: int = DEFAULT_MAX_LAG_PASS_INTERVAL_MS
    max_lag_deadline_ms: int = 30 * MINUTE_MS
    # A plan's files stay leased this long unless it commits or fails first.
    lease_ms: int = 60 * MINUTE_MS
    # A plan whose inputs hold more than this (uncompressed) is split into groups of topic-partitions for
    # parallel workers, once, when it is made.
    group_bytes: int = DEFAULT_GROUP_BYTES
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES

    def __post_init__(self) -> None:
        # The bounds every plan is checked against (docs/plan.md): a planner never makes a plan its engine refuses,
        # nor leases files for longer than its plans may run and commit.
        for name, low, high in (
            ("lease_ms", 1, MAX_PLAN_AGE_MS),
            ("buffer_bytes", MIN_BUFFER_BYTES, MAX_BUFFER_BYTES),
            ("target_file_bytes", 1, MAX_TARGET_FILE_BYTES),
            ("max_partition_bytes", 1, MAX_BYTE_COUNT),
            ("group_bytes", 1, MAX_BYTE_COUNT),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidPlanError(f"planner setting {name} is {value!r}: must be an integer, {low} to {high}")
        counts = self.min_files
        if not isinstance(counts, tuple | list) or len(counts) != 4 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts
        ):
            raise InvalidPlanError(f"planner setting min_files is {counts!r}: must be 4 file counts of at least 1 (L0 to L3)")
        object.__setattr__(self, "min_files", tuple(counts))
