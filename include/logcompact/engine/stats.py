"""What one compaction job did, as JSON: records and bytes in and out, the key map, tombstones, requests."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class CompactionStats:
    plan_id: str
    group: int = 0
    target_level: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    files_out: int = 0
    distinct_keys: int = 0
    key_capacity: int = 0
    buffer_utilization: float = 0.0
    overflows: int = 0
    duplicates_removed: int = 0
    expired_removed: int = 0
    tombstones_kept: int = 0
    tombstones_stamped: int = 0
    tombstones_removed: int = 0
    invalid_records: int = 0
    young_kept: int = 0
    oversized_partitions: list[str] = field(default_factory=list)
    gets: int = 0
    puts: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def warnings_once(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))
