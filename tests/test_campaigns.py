"""The fast parts of the kill -9 and corruption campaigns; the long runs are
`.venv/bin/python bench/kill_campaign.py` and `.venv/bin/python bench/corruption_campaign.py`.

Also: the campaigns' check, shown to count what it says it counts on hand-made consumer views, so a campaign
that reports zeros is not a check that cannot fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.corruption_campaign import BaseStore, Case, build_store, run_corruption_campaign, targets, totals
from bench.kill_campaign import run_kill_campaign, summary
from bench.kill_campaign import targets as kill_targets
from lab.campaign import Sent, TopicSpec, check_partition, phase_of

SEED = 11
COMPACTED = TopicSpec("accounts", 1, {"cleanup.policy": "compact"})
EXPIRING = TopicSpec("clicks", 1, {"cleanup.policy": "delete", "retention.ms": "1000"})
NOW = 1_000_000


def test_a_subset_of_the_kill_campaign_loses_nothing_and_converges(tmp_path: Path) -> None:
    lines: list[str] = []
    results = run_kill_campaign(tmp_path, runs=1, kills=5, seed=SEED, echo=lines.append)
    counts = summary(results)
    report = "\n".join([*lines, *(f"{name}: {value}" for name, value in counts.items())])
    print(report)
    assert counts["kills during compaction"] + counts["kills during produce"] >= 5, report
    assert counts["wrong-catalog gcs"] >= 2, report  # one every fourth round, one after the convergence
    wrong = {name: counts[name] for name in ("lost", "resurrected", "changed offsets", "repeated offsets", "not converged", "leftover workdirs",
                                             "leaked seals", "wrong-catalog gcs not refused", "objects lost", "unexpected failures", "tracebacks")}
    assert wrong == dict.fromkeys(wrong, 0), report
    assert kill_targets(counts) == {"lost": 0, "silent wrong reads": 0, "tracebacks": 0, "leaked seals": 0}, report


@pytest.fixture(scope="module")
def corruption_base(tmp_path_factory: pytest.TempPathFactory) -> BaseStore:
    """The corruption campaign's store, 20 partitions, built once for the tests that damage copies of it."""
    return build_store(tmp_path_factory.mktemp("corruption") / "base", partitions=20, seed=SEED)


def test_targeted_corruptions_and_a_few_flips_give_clear_errors_and_no_wrong_rows(tmp_path: Path, corruption_base: BaseStore) -> None:
    lines: list[str] = []
    results = run_corruption_campaign(tmp_path, partitions=20, flips=3, seed=SEED, levels=("L0",), echo=lines.append,
                                      select=lambda case: isinstance(case, Case), base=corruption_base)
    total = totals(results)["total"]
    report = "\n".join([*lines, str(total)])
    print(report)
    assert total["cases"] == 25
    assert (total["tracebacks"], total["corrupt_rows"], total["silent_losses"]) == (0, 0, 0), report


def test_another_cluster_s_catalog_and_a_lowered_next_offset_are_refused_in_one_line_losing_nothing(
    tmp_path: Path, corruption_base: BaseStore
) -> None:
    """The wrong-catalog and catalog-row cases, one of each class: `--catalog` naming another cluster's catalog (every
    command refuses, nothing written or deleted in the store or either catalog), and a lowered
    `partitions.next_offset` (produce refuses and commits nothing, consume of that partition refuses)."""
    lines: list[str] = []
    chosen = ("partitions.next_offset of 10 lowered", "--catalog names another cluster's catalog")
    results = run_corruption_campaign(tmp_path, partitions=20, flips=0, seed=SEED, levels=("L0",), echo=lines.append,
                                      select=lambda case: case.name.startswith(chosen), base=corruption_base)
    total = totals(results)["total"]
    found = targets(results)
    report = "\n".join([*lines, str(total), str(found)])
    print(report)
    assert [(r.case.kind, r.case.name.startswith(name)) for r, name in zip(results, chosen)] == [("catalog check", True), ("wrong catalog", True)]
    assert found == {"lost": 0, "silent wrong reads": 0, "tracebacks": 0, "leaked seals": 0}, report
    assert (total["unmet"], total["multiline_errors"], total["corrupt_rows"]) == (0, 0, 0), report
    lowered, wrong = results
    assert lowered.unreadable == 1 and wrong.unreadable == 20, report  # what refused at the end: the one partition, then all


# -- the check itself ------------------------------------------------------------------------------------------


def records(*values: tuple[int, str | None, str | None, int]) -> dict[int, Sent]:
    return {offset: Sent(0, key, value, timestamp) for offset, key, value, timestamp in values}


PRODUCED = records((0, "a", "a1", NOW), (1, "b", "b1", NOW), (2, "a", "a2", NOW), (3, "b", None, NOW), (4, "c", "c1", NOW))


def visible(*offsets: int, produced: dict[int, Sent] = PRODUCED) -> list[tuple[int, Sent]]:
    return [(offset, produced[offset]) for offset in offsets]


def test_the_check_accepts_what_compaction_may_leave() -> None:
    for shown in [(0, 1, 2, 3, 4), (2, 3, 4), (2, 4), (0, 2, 4)]:
        check = check_partition(COMPACTED, PRODUCED, visible(*shown), NOW)
        assert (check.lost, check.resurrected, check.changed) == (0, 0, 0), shown


def test_the_check_counts_a_lost_latest_value_a_resurrected_key_and_a_changed_record() -> None:
    lost = check_partition(COMPACTED, PRODUCED, visible(0, 4), NOW)  # a2 gone, a1 shows as the latest
    assert (lost.lost, lost.resurrected) == (1, 1)

    resurrected = check_partition(COMPACTED, PRODUCED, visible(1, 2, 4), NOW)  # b's tombstone gone, b1 back
    assert (resurrected.lost, resurrected.resurrected) == (0, 1)

    moved = [(2, PRODUCED[2]), (5, PRODUCED[4])]  # c1 at another offset
    changed = check_partition(COMPACTED, PRODUCED, moved, NOW)
    assert (changed.changed, changed.lost) == (1, 1)

    altered = check_partition(COMPACTED, PRODUCED, [(2, Sent(0, "a", "a2!", NOW)), (4, PRODUCED[4])], NOW)
    assert (altered.changed, altered.lost) == (1, 1)


def test_the_check_counts_what_the_final_sweeps_should_have_removed() -> None:
    check = check_partition(COMPACTED, PRODUCED, visible(0, 2, 3, 4), NOW)
    assert (check.duplicate_keys, check.tombstones) == (1, 1)


def test_in_a_delete_topic_every_record_within_retention_must_stay() -> None:
    produced = records((0, None, "old", NOW - 5000), (1, "k", "new", NOW), (2, "k", "newer", NOW))
    assert check_partition(EXPIRING, produced, visible(1, 2, produced=produced), NOW).lost == 0
    kept_expired = check_partition(EXPIRING, produced, visible(0, 1, 2, produced=produced), NOW)
    assert (kept_expired.lost, kept_expired.expired) == (0, 1)
    assert check_partition(EXPIRING, produced, visible(2, produced=produced), NOW).lost == 1


def test_where_a_kill_landed_is_read_from_the_stack_sampled_before_it() -> None:
    def sample(*frames: tuple[str, str]) -> str:
        lines = [f'  File "{path}", line 1 in {function}' for path, function in frames]
        return "\n".join(["Current thread 0x00007f0000000000 (most recent call first):", *lines])

    boot = ("<string>", "<module>")
    cli = ("/x/logcompact/cli/compaction.py", "compact")
    cleaner = ("/x/logcompact/engine/cleaner.py", "run")
    committing = sample(("/x/logcompact/catalog/catalog.py", "replace_files"), ("/x/logcompact/jobs/commit.py", "commit_plan"), cli, boot)
    assert phase_of(committing) == "committing"
    assert phase_of(sample(("/x/logcompact/format/writer.py", "_emit_block"), cleaner, cli, boot)) == "writing"
    assert phase_of(sample(("/x/logcompact/format/reader.py", "next_batch"), cleaner, cli, boot)) == "reading"
    assert phase_of(sample(("/x/logcompact/planner/levels.py", "plan_regular"), cli, boot)) == "planning"
    # The CLI importing the writer is loading, at its own import or its command's; the engine's lazy import of numba
    # happens inside the job.
    assert phase_of(sample(("/x/logcompact/format/writer.py", "<module>"), ("/x/logcompact/cli/__init__.py", "<module>"), boot)) == "loading"
    assert phase_of(sample(("/x/logcompact/format/writer.py", "<module>"), cli, boot)) == "loading"
    # Printing a command's JSON lines is its exit.
    assert phase_of(sample(("/x/logcompact/cli/common.py", "emit"), ("/x/logcompact/cli/records.py", "consume"), boot)) == "exiting"
    numba = sample(("/x/numba/__init__.py", "<module>"), ("/x/logcompact/engine/cleaner.py", "run_plan"), cli, boot)
    assert phase_of(numba) == "reading"
    assert phase_of("Current thread 0x00007f0000000000 (most recent call first):\n  <no Python frame>") == "exiting"
