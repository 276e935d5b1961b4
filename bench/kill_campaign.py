"""Kill -9 campaign: compactions and produces killed with SIGKILL at random points, then convergence and gc,
checked against an independent model of Kafka's semantics.

    .venv/bin/python bench/kill_campaign.py                        # 10 runs of 12 kills: 120 kills, 15 to 25 minutes on 2 busy cores
    .venv/bin/python bench/kill_campaign.py --runs 1 --kills 5 --seed 7

Each run is a fresh local store (SQLite catalog) with three topics: `accounts` (compact, 4 partitions, min lag
2 min, tombstones kept 10 min), `clicks` (delete, 3 partitions, 90 min retention, some records without a key)
and `sessions` (compact,delete, 3 partitions, 3 h retention, tombstones kept 5 min); keys are reused
(Zipf-like over 400 a topic), 8% of a compacted topic's records are tombstones, a fifth carry timestamps up to
30 s out of order. Every round advances the clock 1 to 20 minutes, produces one batch and waits for it, then
runs a compaction (`compact --until-idle --min-files 2`, or `compact --full` one time in three) and another
produce side by side, and kills one of them with SIGKILL at a random point: the campaign picks at random one
of the phases that kind of command went through when it last ran to the end (loading, planning, reading,
writing outputs, committing, exiting), and kills it a random delay after it enters that phase, within the
phase's length then (the commands mark on stderr when they enter each phase); so short phases such as a
commit get their share. A stack sampled just before each kill says where it really landed (faulthandler).
Every fourth round runs `gc`, and then `gc --grace-ms 0` at a clock past every object's time pointed
(`--catalog`) at another cluster's catalog (a second store with a topic of the same name, made at the start): it
must refuse with one line and leave every object of the store as it was, byte for byte, whatever the kills
left in flight; the same once more after the convergence below.

A produce is acknowledged when it exited 0 and printed its offsets. A killed produce either committed (its
partitions' next offsets moved by exactly its records, `topic describe`) or left no trace; both are fine, and a
committed one joins the model at the offsets it was given.

After the kills: `compact --until-idle` past the killed plans' leases, `compact --full` twice (the second past
`delete.retention.ms`, so tombstones may go), `plan` must find nothing, and `gc` past the grace
(DEFAULT_GC_GRACE_MS). Then every partition is consumed through the CLI and checked (lab/campaign.py):

* lost: a key's latest value (or, in the delete topic, a record within retention) not visible;
* resurrected: a key whose last visible record is not its latest (an older value, or a deleted key);
* changed: a visible record that differs from the one produced at that offset;
* repeated: a record shown at an offset already shown, or below one;
* not converged: compaction not idle; or left behind what gc or compaction should have removed: objects under
  data/ without a catalog row, catalog rows gc should have collected, plan documents, the store's temporary
  files, `logcompact-job-*` work directories in the jobs' TMPDIR; or keys still visible twice, tombstones or
  expired records after the final sweeps;
* leaked seals: after the convergence, rows of the catalog's `plan_seals` whose plan holds no lease (a seal goes
  with its plan's last lease, however the lease ended);
* wrong-catalog gc: a gc pointed at the other cluster's catalog that did not refuse with one line (exit 1), and
  objects lost: objects of the store it deleted or changed;
* unexpected failures: a command the campaign did not kill that exited non-zero, with its first stderr line.

Targets, printed last with what was found: 0 lost (records and objects), 0 silent wrong reads
(resurrected, changed and repeated offsets), 0 tracebacks, 0 leaked seals; and every wrong-catalog gc refused.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import zlib
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

# The lab (lab/: throw-away servers, the campaigns' harness, the reference model) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.campaign import (
    PHASES,
    Cli,
    Done,
    Sent,
    TopicSpec,
    acknowledged_offsets,
    check_partition,
    consumed_records,
    leaked_seals,
    phase_durations,
    produce_input,
    store_objects,
)
from logcompact.catalog import DEFAULT_KEEP_VERSIONS
from logcompact.jobs import DEFAULT_GC_GRACE_MS
from logcompact.jobs.workdir import WORKDIR_PREFIX
from logcompact.planner import PlannerConfig

TOPICS = (
    TopicSpec("accounts", 4, {"cleanup.policy": "compact", "min.compaction.lag.ms": "120000", "delete.retention.ms": "600000"}),
    TopicSpec("clicks", 3, {"cleanup.policy": "delete", "retention.ms": "5400000"}),
    TopicSpec("sessions", 3, {"cleanup.policy": "compact,delete", "retention.ms": "10800000", "delete.retention.ms": "300000"}),
)
KEYS_PER_TOPIC = 400
MIN_FILES = 2
MINUTE_MS = 60_000
# LocalStore writes an object under a temporary name and renames it (store/local.py): a kill in between leaves one.
STORE_TEMP_SUFFIX = ".tmp-logcompact"


@dataclass
class RunResult:
    seed: int
    compaction_kills: Counter = field(default_factory=Counter)  # by phase
    produce_kills: Counter = field(default_factory=Counter)
    lost: int = 0
    resurrected: int = 0
    changed: int = 0
    repeated: int = 0  # records shown twice, or out of offset order
    not_converged: list[str] = field(default_factory=list)  # the reasons
    leaked_seals: int = 0
    wrong_catalog_gcs: int = 0
    wrong_catalog_not_refused: int = 0  # gcs pointed at another cluster's catalog that did not refuse with one line
    objects_lost: int = 0  # objects of the store those gcs deleted or changed
    leftover_workdirs: int = 0
    failures: list[str] = field(default_factory=list)
    tracebacks: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(self.compaction_kills.values()) + sum(self.produce_kills.values())


class KillRun:
    """One store, `kills` kills, then convergence and the check."""

    def __init__(self, directory: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.result = RunResult(seed)
        self.cli = Cli(directory / "store", directory / "tmp")
        # Another cluster with a topic of the same name and a record, whose catalog a wrong-catalog gc is pointed at.
        self.other = Cli(directory / "other", directory / "other-tmp")
        self.clock = time.time_ns() // 1_000_000
        self.compacted_at = self.clock  # the newest clock a compaction ran at: what may have expired
        self.produced: dict[tuple[str, int], dict[int, Sent]] = {(t.name, p): {} for t in TOPICS for p in range(t.partitions)}
        self.next_offsets = {t.name: [0] * t.partitions for t in TOPICS}
        self.sequence = 0
        # How long each command took when not killed, and its phases' lengths (per kind: produce, compact --full,
        # compact --until-idle): where the next kills are aimed.
        self.seconds = {"compact": 1.5, "produce": 1.0}
        self.durations: dict[str, dict[str, float]] = {}

    # -- commands ------------------------------------------------------------------------------------------

    def _expect_success(self, done: Done) -> bool:
        if done.traceback:
            self.result.tracebacks += 1
        if done.returncode != 0:
            self.result.failures.append(f"{' '.join(done.args)} (exit {done.returncode}): {done.first_error_line()}")
            return False
        return True

    def _batch(self) -> tuple[TopicSpec, list[Sent]]:
        spec = self.rng.choice(TOPICS)
        records = []
        for _ in range(self.rng.randint(500, 4000)):
            self.sequence += 1
            rank = min(int(self.rng.paretovariate(1.2)), KEYS_PER_TOPIC)
            key: str | None = f"{spec.name}-k{rank}-{self.rng.randrange(KEYS_PER_TOPIC // rank + 1)}"
            partition = zlib.crc32(key.encode()) % spec.partitions  # a key stays in one partition, as in Kafka
            if not spec.compacted and self.rng.random() < 0.1:
                key = None
            tombstone = spec.compacted and self.rng.random() < 0.08
            value = None if tombstone else f"v{self.sequence}-" + "x" * self.rng.randint(10, 300)
            late = self.rng.randint(0, 30_000) if self.rng.random() < 0.2 else 0
            records.append(Sent(partition, key, value, self.clock - late))
        return spec, records

    def _record(self, spec: TopicSpec, records: list[Sent], offsets: list[int]) -> None:
        for record, offset in zip(records, offsets, strict=True):
            self.produced[(spec.name, record.partition)][offset] = record
            self.next_offsets[spec.name][record.partition] = max(self.next_offsets[spec.name][record.partition], offset + 1)

    def produce(self) -> None:
        spec, records = self._batch()
        done = self.cli.start("produce", spec.name, now=self.clock, stdin=produce_input(records)).finish()
        if self._expect_success(done):
            self._acknowledged(spec, records, done)
            self.durations["produce"] = phase_durations(done)

    def _acknowledged(self, spec: TopicSpec, records: list[Sent], done: Done) -> None:
        offsets = acknowledged_offsets(done, records)
        if offsets is None:
            self.result.failures.append(f"produce {spec.name} exited 0 but did not print an offset per record")
            return
        self._record(spec, records, offsets)

    def _resolve_killed_produce(self, spec: TopicSpec, records: list[Sent]) -> None:
        """Whether the killed produce committed: its partitions' next offsets moved by exactly its records, or not
        at all (the records then got the offsets from the old next offsets on, in input order)."""
        described = self.cli.run("topic", "describe", spec.name, now=self.clock)
        if not self._expect_success(described):
            return
        found = _json_line(described.stdout)["next_offsets"]
        before = self.next_offsets[spec.name]
        if found == before:
            return
        counts = Counter(r.partition for r in records)
        if found != [before[p] + counts[p] for p in range(spec.partitions)]:
            self.result.failures.append(f"killed produce to {spec.name}: next offsets went from {before} to {found}, "
                                        f"neither unchanged nor advanced by its {len(records)} records")
            return
        given = dict(enumerate(before))
        offsets = []
        for record in records:
            offsets.append(given[record.partition])
            given[record.partition] += 1
        self._record(spec, records, offsets)

    def _compact_args(self) -> list[str]:
        if self.rng.random() < 1 / 3:
            return ["compact", "--full"]
        return ["compact", "--until-idle", "--min-files", str(MIN_FILES)]

    def _aim(self, kind: str) -> tuple[str, float]:
        """Where to kill a command: a phase drawn at random among those its kind went through when last run
        unkilled, and a random moment inside it (the phase's length then), so short phases such as a commit
        get as many kills as long ones."""
        durations = self.durations.get(kind)
        if not durations:
            return "loading", self.rng.uniform(0.1, 1.1 * self.seconds[kind.split()[0]])
        phase = self.rng.choice(sorted(durations))
        low = 0.05 if phase == "loading" else 0.0
        return phase, self.rng.uniform(low, max(low, durations[phase]))

    def kill_round(self) -> None:
        """A compaction and a produce side by side; one of them is killed."""
        self.clock += self.rng.randint(1, 20) * MINUTE_MS
        self.produce()
        compact_args = self._compact_args()
        kinds = {"compact": " ".join(compact_args[:2]), "produce": "produce"}
        victim = "compact" if self.rng.random() < 0.6 else "produce"
        phase, after = self._aim(kinds[victim])
        compaction = self.cli.start(*compact_args, now=self.clock)
        self.compacted_at = self.clock
        spec, records = self._batch()
        producing = self.cli.start("produce", spec.name, now=self.clock, stdin=produce_input(records))
        if victim == "compact":
            compacted, produced = compaction.kill_in(phase, after), producing.finish()
        else:
            produced, compacted = producing.kill_in(phase, after), compaction.finish()

        for kind, done in (("compact", compacted), ("produce", produced)):
            if not done.kill_sent and done.returncode == 0:
                self.durations[kinds[kind]] = phase_durations(done)
                self.seconds[kind] = done.seconds
        if compacted.killed:
            self.result.compaction_kills[compacted.phase] += 1
        else:
            self._expect_success(compacted)
        if produced.killed:
            self.result.produce_kills[produced.phase] += 1
            self._resolve_killed_produce(spec, records)
        elif self._expect_success(produced):
            self._acknowledged(spec, records, produced)

    # -- the run -------------------------------------------------------------------------------------------

    def run(self, kills: int) -> RunResult:
        for spec in TOPICS:
            self._expect_success(self.cli.run(*spec.create_args(), now=self.clock))
        self._expect_success(self.other.run(*TOPICS[0].create_args(), now=self.clock))
        self._expect_success(self.other.run("produce", TOPICS[0].name, now=self.clock,
                                            stdin=produce_input([Sent(0, "other-cluster", "o1", self.clock)])))
        for _ in range(3):
            self.produce()
        rounds = 0
        while self.result.kills < kills and rounds < 4 * kills:  # a command may end before its kill
            rounds += 1
            self.kill_round()
            if rounds % 4 == 0:
                self._expect_success(self.cli.run("gc", now=self.clock))
                self.wrong_catalog_gc()
        self.converge_and_check()
        return self.result

    def wrong_catalog_gc(self) -> None:
        """gc pointed at the other cluster's catalog, at a clock past every object's time: one line, nothing
        deleted or changed (with whatever the kills left in flight in the store)."""
        before = store_objects(self.cli.store_dir)
        later = max(self.clock, time.time_ns() // 1_000_000) + PlannerConfig.lease_ms + DEFAULT_GC_GRACE_MS
        done = self.cli.run("--catalog", f"sqlite:///{self.other.store_dir / 'catalog.db'}", "gc", "--grace-ms", "0", "--now", str(later),
                            now=later)
        after = store_objects(self.cli.store_dir)
        self.result.wrong_catalog_gcs += 1
        if done.traceback:
            self.result.tracebacks += 1
        if done.returncode != 1 or len(done.error_lines()) != 1:
            self.result.wrong_catalog_not_refused += 1
            self.result.failures.append(f"gc with another cluster's catalog exited {done.returncode}: {done.first_error_line()} "
                                        f"({len(done.error_lines())} stderr lines)")
        lost = sorted(key for key, data in before.items() if after.get(key) != data)
        self.result.objects_lost += len(lost)
        if lost:
            self.result.failures.append(f"gc with another cluster's catalog deleted or changed {len(lost)} objects, first {lost[0]}")

    def converge_and_check(self) -> None:
        # Past the leases of the plans killed in flight, so their files are planned again.
        start = max(self.clock, time.time_ns() // 1_000_000) + PlannerConfig.lease_ms + MINUTE_MS
        if not self._expect_success(self.cli.run("compact", "--until-idle", "--min-files", str(MIN_FILES), now=start)):
            self.result.not_converged.append("compact --until-idle failed")
        self._expect_success(self.cli.run("compact", "--full", now=start))
        # Past every tombstone's delete horizon, stamped by the sweep before at the latest.
        swept = start + max(int(t.settings.get("delete.retention.ms", 86_400_000)) for t in TOPICS) + MINUTE_MS
        self._expect_success(self.cli.run("compact", "--full", now=swept))
        self.compacted_at = swept
        planned = self.cli.run("plan", "--min-files", str(MIN_FILES), now=swept)
        if self._expect_success(planned) and planned.stdout.strip():
            self.result.not_converged.append(f"not idle: plan still finds {len(planned.stdout.splitlines())} plans")
        collected = max(swept, time.time_ns() // 1_000_000) + DEFAULT_GC_GRACE_MS + MINUTE_MS
        self._expect_success(self.cli.run("gc", now=collected))
        self.wrong_catalog_gc()  # and once more on the converged store, so every run has one
        self._check_leftovers(collected)
        self.result.leaked_seals = leaked_seals(self.cli.store_dir / "catalog.db")
        if self.result.leaked_seals:
            self.result.not_converged.append(f"{self.result.leaked_seals} leaked seals (plan_seals rows of plans holding no lease)")
        self._check_records()

    def _check_leftovers(self, collected_at: int) -> None:
        store = self.cli.store_dir
        with closing(sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)) as catalog:
            rows = {key for (key,) in catalog.execute("SELECT key FROM files")}
            newest = catalog.execute("SELECT version FROM catalog_info").fetchone()[0]
            oldest_kept = max(1, newest - DEFAULT_KEEP_VERSIONS + 1)
            collectable = catalog.execute(
                "SELECT count(*) FROM files WHERE removed_version <= ? AND removed_ms <= ?",
                (oldest_kept, collected_at - DEFAULT_GC_GRACE_MS),
            ).fetchone()[0]
        stored = [p.relative_to(store).as_posix() for p in (store / "data").rglob("*") if p.is_file()]
        temporary = [key for key in stored if key.endswith(STORE_TEMP_SUFFIX)]
        orphans = [key for key in stored if key not in rows and not key.endswith(STORE_TEMP_SUFFIX)]
        plans = [p for p in (store / "plans").rglob("*") if p.is_file()] if (store / "plans").is_dir() else []
        workdirs = [name for name in os.listdir(self.cli.tmpdir) if name.startswith(WORKDIR_PREFIX)]
        self.result.leftover_workdirs = len(workdirs)
        for count, what in ((len(orphans), "objects under data/ without a catalog row"), (collectable, "catalog rows gc should have collected"),
                            (len(plans), "plan documents"), (len(temporary), "temporary files in the store"),
                            (len(workdirs), f"{WORKDIR_PREFIX}* work directories")):
            if count:
                self.result.not_converged.append(f"{count} {what} left")

    def _check_records(self) -> None:
        pairs = sorted(self.produced)
        consumed = self.cli.consume_all(pairs, self.compacted_at)
        left = Counter()
        for spec in TOPICS:
            for partition in range(spec.partitions):
                done = consumed[(spec.name, partition)]
                if not self._expect_success(done):
                    continue
                check = check_partition(spec, self.produced[(spec.name, partition)], consumed_records(done), self.compacted_at)
                self.result.lost += check.lost
                self.result.resurrected += check.resurrected
                self.result.changed += check.changed
                self.result.repeated += check.repeated
                left.update(duplicate_keys=check.duplicate_keys, tombstones=check.tombstones, expired=check.expired)
                self.result.examples.extend(f"{spec.name}/{partition}: {e}" for e in check.examples)
        for what, count in sorted(left.items()):
            if count:
                self.result.not_converged.append(f"{count} {what.replace('_', ' ')} visible after the final sweeps")


def _json_line(text: str) -> dict:
    return json.loads(text.splitlines()[0])


def run_kill_campaign(directory: Path, runs: int, kills: int, seed: int, echo=print) -> list[RunResult]:
    results = []
    for number in range(runs):
        run_seed = seed + number
        result = KillRun(directory / f"run{number:03d}", run_seed).run(kills)
        results.append(result)
        state = "converged" if not result.not_converged else "NOT converged: " + "; ".join(result.not_converged)
        echo(f"run {number} (seed {run_seed}): {result.kills} kills ({sum(result.compaction_kills.values())} compaction, "
             f"{sum(result.produce_kills.values())} produce), lost {result.lost}, resurrected {result.resurrected}, "
             f"changed {result.changed}, repeated {result.repeated}, leaked seals {result.leaked_seals}, "
             f"wrong-catalog gcs {result.wrong_catalog_gcs} ({result.wrong_catalog_not_refused} not refused, "
             f"{result.objects_lost} objects lost), {state}")
        for line in result.failures + result.examples:
            echo(f"  {line}")
    return results


def summary(results: list[RunResult]) -> dict[str, int]:
    return {
        "runs": len(results),
        "kills during compaction": sum(sum(r.compaction_kills.values()) for r in results),
        "kills during produce": sum(sum(r.produce_kills.values()) for r in results),
        "lost": sum(r.lost for r in results),
        "resurrected": sum(r.resurrected for r in results),
        "changed offsets": sum(r.changed for r in results),
        "repeated offsets": sum(r.repeated for r in results),
        "not converged": sum(1 for r in results if r.not_converged),
        "leftover workdirs": sum(r.leftover_workdirs for r in results),
        "leaked seals": sum(r.leaked_seals for r in results),
        "wrong-catalog gcs": sum(r.wrong_catalog_gcs for r in results),
        "wrong-catalog gcs not refused": sum(r.wrong_catalog_not_refused for r in results),
        "objects lost": sum(r.objects_lost for r in results),
        "unexpected failures": sum(len(r.failures) for r in results),
        "tracebacks": sum(r.tracebacks for r in results),
    }


def targets(totals: dict[str, int]) -> dict[str, int]:
    """The targets, each to be 0: lost (records and objects), silent wrong reads, tracebacks, leaked seals."""
    return {
        "lost": totals["lost"] + totals["objects lost"],
        "silent wrong reads": totals["resurrected"] + totals["changed offsets"] + totals["repeated offsets"],
        "tracebacks": totals["tracebacks"],
        "leaked seals": totals["leaked seals"],
    }


def _phases(counter: Counter) -> str:
    return ", ".join(f"{phase} {counter[phase]}" for phase in PHASES if counter[phase])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh stores, each with its kills and the final check")
    parser.add_argument("--kills", type=int, default=12, help="kills per run")
    parser.add_argument("--seed", type=int, default=None, help="first run's seed (printed; run N uses seed + N)")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (kept); a temporary directory otherwise")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"kill campaign: {args.runs} runs of {args.kills} kills, seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kill-campaign-") as scratch:
        results = run_kill_campaign(args.dir or Path(scratch), args.runs, args.kills, seed, echo=lambda line: print(line, flush=True))
    totals = summary(results)
    compaction, produce = Counter(), Counter()
    for r in results:
        compaction.update(r.compaction_kills)
        produce.update(r.produce_kills)
    for name, value in totals.items():
        detail = {"kills during compaction": _phases(compaction), "kills during produce": _phases(produce)}.get(name)
        print(f"{name}: {value}" + (f" ({detail})" if detail else ""))
    found = targets(totals)
    print("targets: " + ", ".join(f"0 {name}" for name in found) + " | found: " + ", ".join(f"{value} {name}" for name, value in found.items())
          + (" | met" if not any(found.values()) else " | NOT met"))


if __name__ == "__main__":
    main()
