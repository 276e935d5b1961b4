"""What one compaction job did, as JSON: records and bytes in and out, the key map, tombstones, requests;
and its result, the output files with those stats (a Spark driver reads results without loading the engine).
`summarize` adds a plan's jobs up into Kafka's per-run cleaner figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from operator import attrgetter

from logcompact.catalog import DataFile, SetAside
from logcompact.plans.json_form import file_from_json, file_to_json
from logcompact.units import mib


@dataclass
class CompactionStats:
    plan_id: str
    group: int = 0
    target_level: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0  # stored bytes of the job's input sections (a plan's summary counts its whole input files)
    bytes_out: int = 0  # bytes of the files it wrote
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
    aborted_removed: int = 0  # records of aborted transactions (the plan's `aborted` ranges) removed
    aborted_bytes_removed: int = 0  # their uncompressed bytes
    oversized_partitions: list[str] = field(default_factory=list)
    gets: int = 0
    puts: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    # Partitions set aside as uncleanable (SetAside as dicts): their sections stay where they are.
    uncleanable: list[dict] = field(default_factory=list)
    # Each topic's own figures (TOPIC_FIGURES): what a topic's asset event and the commit's table report.
    topics: dict[str, dict[str, int]] = field(default_factory=dict)

    def warnings_once(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def checkpoint(self) -> tuple:
        """The counts before a partition, to `rewind` to if it is set aside (its partial counts would mislead)."""
        return _PARTITION_COUNTS(self), self.buffer_utilization, len(self.oversized_partitions), len(self.warnings)

    def rewind(self, checkpoint: tuple) -> None:
        counts, self.buffer_utilization, oversized, warnings = checkpoint
        for name, value in zip(PARTITION_COUNTS, counts):
            setattr(self, name, value)
        del self.oversized_partitions[oversized:]
        del self.warnings[warnings:]

    def set_aside(self, partition: SetAside) -> None:
        self.uncleanable.append(partition.to_dict())

    def partition_done(self, topic: str, checkpoint: tuple, uncompressed_bytes_in: int) -> None:
        """Credit `topic` with what its partition added since `checkpoint` (a partition set aside is rewound instead)."""
        figures = self.topics.setdefault(topic, dict.fromkeys(TOPIC_FIGURES, 0))
        for name, before, after in zip(PARTITION_COUNTS, checkpoint[0], _PARTITION_COUNTS(self)):
            figures[name] += after - before
        figures["partitions"] += 1
        figures["uncompressed_bytes_in"] += uncompressed_bytes_in

    def outputs_written(self, outputs: list[DataFile]) -> None:
        self.bytes_out = sum(f.size for f in outputs)
        self.files_out = len(outputs)
        for data_file in outputs:
            for section in data_file.sections:
                self.topics[section.topic]["uncompressed_bytes_out"] += section.info.uncompressed_bytes

    def describe(self) -> str:
        """One line for a job's log."""
        return (
            f"plan {self.plan_id} group {self.group} > L{self.target_level}: {self.records_in:,} records in, "
            f"{self.records_out:,} out ({self.duplicates_removed:,} duplicates, {self.tombstones_removed:,} tombstones, "
            f"{self.expired_removed:,} expired, {self.aborted_removed:,} aborted removed); {mib(self.bytes_in)} stored in "
            f"({mib(uncompressed_in(self.topics))} uncompressed), {mib(self.bytes_out)} stored out in {self.files_out} file(s); "
            f"{self.gets} GETs, {self.puts} PUTs; key map {100 * self.buffer_utilization:.0f}% "
            f"full ({self.distinct_keys:,} keys, room for {self.key_capacity:,}); {self.seconds:.1f} s"
            + (f"; {len(self.uncleanable)} partition(s) set aside as uncleanable" if self.uncleanable else "")
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class JobResult:
    plan_id: str
    group: int
    outputs: list[DataFile]
    stats: CompactionStats

    def to_dict(self) -> dict:
        return {"plan_id": self.plan_id, "group": self.group, "outputs": [file_to_json(f) for f in self.outputs], "stats": self.stats.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> JobResult:
        outputs = [file_from_json(f, f"result of plan {data['plan_id']} group {data['group']}") for f in data["outputs"]]
        return cls(data["plan_id"], data["group"], outputs, CompactionStats(**data["stats"]))


# What each partition a job cleans adds to (rewound when it is set aside), and what the job as a whole adds:
# together, the counts that add up across the jobs of a plan.
PARTITION_COUNTS = (
    "records_in", "records_out", "distinct_keys", "overflows", "duplicates_removed", "expired_removed",
    "tombstones_kept", "tombstones_stamped", "tombstones_removed", "invalid_records", "young_kept", "aborted_removed",
    "aborted_bytes_removed",
)
JOB_COUNTS = ("bytes_out", "files_out", "gets", "puts")
# A topic's figures: its partitions' counts, how many it had, and their sections' uncompressed bytes (a file's
# bytes are not split by topic).
TOPIC_FIGURES = (*PARTITION_COUNTS, "partitions", "uncompressed_bytes_in", "uncompressed_bytes_out")
_PARTITION_COUNTS = attrgetter(*PARTITION_COUNTS)


def add_topic_figures(into: dict[str, dict[str, int]], topics: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """`into` with each topic's figures in `topics` added."""
    for topic, figures in topics.items():
        total = into.setdefault(topic, dict.fromkeys(TOPIC_FIGURES, 0))
        for name in TOPIC_FIGURES:
            total[name] += figures.get(name, 0)
    return into


def _topic_totals(jobs: list[CompactionStats]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for job in jobs:
        add_topic_figures(totals, job.topics)
    return totals


def uncompressed_in(topics: dict[str, dict[str, int]]) -> int:
    """The uncompressed bytes of the sections a job, or jobs, read: their topics' figures added up."""
    return sum(figures["uncompressed_bytes_in"] for figures in topics.values())


def summarize(jobs: list[CompactionStats], bytes_in: int) -> dict:
    """One plan's figures from its jobs' (groups' or their slices'): counts added up, `bytes_in` the plan's input
    files (a file read by several jobs counts once), and Kafka's per-run cleaner figures: the key map's fullest
    buffer (max-buffer-utilization-percent) and the bytes written per byte read (cleaner-recopy-percent)."""
    first = jobs[0]
    totals = {name: sum(getattr(job, name) for job in jobs) for name in PARTITION_COUNTS + JOB_COUNTS}
    utilization = max(job.buffer_utilization for job in jobs)
    return {
        **first.to_dict(),
        **totals,
        "bytes_in": bytes_in,
        "buffer_utilization": utilization,
        "buffer_utilization_percent": round(100 * utilization, 1),
        "recopy_percent": round(100 * totals["bytes_out"] / max(bytes_in, 1), 1),
        "seconds": round(sum(job.seconds for job in jobs), 3),
        "max_job_seconds": max(job.seconds for job in jobs),
        "oversized_partitions": [p for job in jobs for p in job.oversized_partitions],
        "warnings": sorted({w for job in jobs for w in job.warnings}),
        "uncleanable": [p for job in jobs for p in job.uncleanable],
        "topics": _topic_totals(jobs),
        "groups": len({job.group for job in jobs}),
        "jobs": len(jobs),
    }
