"""The catalog's optimistic commits, conflicts and bounded history, on both backends."""

from __future__ import annotations

import pytest

from logcompact.catalog import Catalog, DataFile, NewFile, manifest_key
from logcompact.exceptions import (
    ClusterNotFoundError,
    CommitConflictError,
    ManifestVersionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from logcompact.format.layout import SectionInfo
from logcompact.store import LocalStore, ObjectStore
from tests.helpers import NOW, create_topic


def _new_file(key: str, *sections: tuple[str, int, int]) -> NewFile:
    infos = tuple(
        SectionInfo(topic, partition, count, count - 1, 0, 0, 0, 0, "none", 0, 16, 1) for topic, partition, count in sections
    )
    return NewFile(key, 0, 100, NOW, infos)


def _append(catalog: Catalog, new_file: NewFile):
    return catalog.commit("append", lambda m: m.with_appended_files([new_file]), NOW)


def test_an_empty_store_has_no_cluster(store: ObjectStore) -> None:
    with pytest.raises(ClusterNotFoundError, match="no logcompact cluster in"):
        Catalog(store).load()


def test_appends_get_consecutive_offsets_per_partition(store: ObjectStore) -> None:
    catalog = Catalog(store)
    create_topic(catalog, "t", partitions=2)
    _, first = _append(catalog, _new_file("f1", ("t", 0, 5), ("t", 1, 2)))
    _, second = _append(catalog, _new_file("f2", ("t", 0, 3)))
    manifest = catalog.load()
    assert (first, second) == ([[0, 0]], [[5]])
    assert manifest.next_offsets["t"] == (8, 2)
    assert [(f.key, s.first_offset, s.last_offset) for f, s in manifest.sections_of("t", 0)] == [("f1", 0, 4), ("f2", 5, 7)]


def test_a_writer_that_lost_the_race_reapplies_its_change_on_the_winner(store: ObjectStore) -> None:
    create_topic(Catalog(store), "t")
    slow, fast = Catalog(store), Catalog(store)
    applied_to = []

    def append_after_being_overtaken(manifest):
        applied_to.append(manifest.version)
        if len(applied_to) == 1:  # while we were busy, another writer committed
            _append(fast, _new_file("fast", ("t", 0, 10)))
        return manifest.with_appended_files([_new_file("slow", ("t", 0, 1))])

    manifest, assigned = slow.commit("append", append_after_being_overtaken, NOW)
    assert applied_to == [applied_to[0], applied_to[0] + 1]
    assert assigned == [[10]] and manifest.version == applied_to[0] + 2
    assert sorted(manifest.files) == ["fast", "slow"]


def test_replacing_files_that_are_gone_is_a_conflict_that_writes_nothing(store: ObjectStore) -> None:
    catalog = Catalog(store)
    create_topic(catalog, "t")
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    planned = catalog.load()
    output = DataFile("l1", 1, 50, NOW, planned.files["f1"].sections)
    catalog.commit("compact", lambda m: (m.with_replaced_files(["f1"], [output], planned.version), None), NOW)
    version = catalog.latest_version()
    with pytest.raises(CommitConflictError, match=rf"expected 1 input files live as in manifest version {planned.version}, found 1 of them gone in version {version} \(first: f1\)"):
        catalog.commit("compact again", lambda m: (m.with_replaced_files(["f1"], [output], planned.version), None), NOW)
    assert catalog.latest_version() == version


def test_appends_never_conflict_with_a_compaction_of_other_files(store: ObjectStore) -> None:
    catalog = Catalog(store)
    create_topic(catalog, "t")
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    planned = catalog.load()
    output = DataFile("l1", 1, 50, NOW, planned.files["f1"].sections)
    _append(Catalog(store), _new_file("f2", ("t", 0, 5)))  # lands between planning and committing
    manifest, _ = catalog.commit("compact", lambda m: (m.with_replaced_files(["f1"], [output], planned.version), None), NOW)
    assert sorted(manifest.files) == ["f2", "l1"]
    assert [s.first_offset for _, s in manifest.sections_of("t", 0)] == [0, 5]


def test_topic_rules_in_commits(store: ObjectStore) -> None:
    catalog = Catalog(store)
    create_topic(catalog, "t")
    with pytest.raises(TopicExistsError, match="topic 't' already exists"):
        create_topic(catalog, "t")
    with pytest.raises(TopicNotFoundError, match="topic 'nope' does not exist"):
        _append(catalog, _new_file("f", ("nope", 0, 1)))


def test_history_is_bounded_and_old_readers_get_a_clear_error(store: ObjectStore) -> None:
    catalog = Catalog(store, keep_versions=3)
    create_topic(catalog, "t")
    for n in range(6):
        _append(catalog, _new_file(f"f{n}", ("t", 0, 1)))
    latest = catalog.latest_version()
    assert catalog.versions() == [latest - 2, latest - 1, latest]
    assert len(catalog.load(latest - 2).files) == 4  # an older kept version still reads whole
    with pytest.raises(ManifestVersionNotFoundError, match=rf"manifest version 2 is not in .* \(kept versions are {latest - 2} to {latest}\)"):
        catalog.load(2)


class _LostAnswerStore(LocalStore):
    """A store whose first create-only PUT succeeds but answers as if it lost (a dropped response)."""

    dropped = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = super().put_if_absent(key, data)
        if created and not self.dropped and "manifests" in key:
            self.dropped = True
            return False
        return created


def test_a_commit_whose_answer_was_lost_is_not_applied_twice(tmp_path) -> None:
    store = LocalStore(tmp_path)
    create_topic(Catalog(store), "t")
    catalog = Catalog(_LostAnswerStore(tmp_path))
    manifest, assigned = _append(catalog, _new_file("f1", ("t", 0, 5)))
    assert assigned == [[0]] and catalog.store.dropped
    assert catalog.latest_version() == manifest.version
    assert catalog.load().next_offsets["t"] == (5,)
    assert store.stat(manifest_key(manifest.version + 1)) is None
