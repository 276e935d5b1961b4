"""The catalog: numbered manifest versions in the object store, committed optimistically.

Version N lives at `catalog/manifests/v{N:020d}.json` and is written with a create-only PUT, so of several
writers racing for N exactly one wins; the store's atomic create is the whole commit protocol. A writer
that loses re-reads the winner and re-applies its change (a pure function of the manifest); a change that
is no longer valid raises CommitConflictError saying what it expected and what it found.

Every commit deletes the version `keep_versions` below it, so the last `keep_versions` versions stay
readable for readers that started on an older one.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import replace
from typing import Callable, TypeVar

from logcompact.catalog.manifest import Manifest
from logcompact.exceptions import (
    ClusterNotFoundError,
    CommitRetriesExhaustedError,
    ManifestVersionNotFoundError,
    ObjectNotFoundError,
)
from logcompact.store.base import ObjectStore

MANIFEST_PREFIX = "catalog/manifests/v"
DEFAULT_KEEP_VERSIONS = 100
DEFAULT_MAX_ATTEMPTS = 200

Result = TypeVar("Result")


def manifest_key(version: int) -> str:
    return f"{MANIFEST_PREFIX}{version:020d}.json"


def _version_of(key: str) -> int:
    return int(key[len(MANIFEST_PREFIX) : -len(".json")])


class Catalog:
    def __init__(
        self, store: ObjectStore, keep_versions: int = DEFAULT_KEEP_VERSIONS, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be at least 1")
        self.store = store
        self.keep_versions = keep_versions
        self.max_attempts = max_attempts
        self._known_version = 0

    def latest_version(self) -> int:
        """The newest committed version (one LIST), or 0 when the store has no catalog."""
        start_after = manifest_key(self._known_version) if self._known_version else None
        newest = self._known_version
        for info in self.store.list(MANIFEST_PREFIX, start_after=start_after):
            newest = max(newest, _version_of(info.key))
        self._known_version = newest
        return newest

    def load(self, version: int | None = None) -> Manifest:
        """A manifest version (default: the latest)."""
        if version is None:
            version = self.latest_version()
            if version == 0:
                raise ClusterNotFoundError(
                    f"no logcompact cluster in {self.store.uri}: create a topic there first (`logcompact topic create`)"
                )
        key = manifest_key(version)
        try:
            return Manifest.from_bytes(self.store.get(key), key)
        except ObjectNotFoundError:
            versions = self.versions()
            kept = f"kept versions are {versions[0]} to {versions[-1]}" if versions else "no version is kept"
            raise ManifestVersionNotFoundError(
                f"manifest version {version} is not in {self.store.uri} ({kept}); read the latest version instead"
            ) from None

    def versions(self) -> list[int]:
        return [_version_of(info.key) for info in self.store.list(MANIFEST_PREFIX)]

    def ensure_created(self, now_ms: int) -> Manifest:
        """The latest manifest, creating version 1 of an empty cluster first if the store has none."""
        if self.latest_version() == 0:
            empty = Manifest(
                cluster_id=str(uuid.uuid4()), version=1, commit_id=str(uuid.uuid4()), created_ms=now_ms, operation="create"
            )
            self.store.put_if_absent(manifest_key(1), empty.to_bytes())  # a racing creator may win; both are empty
        return self.load()

    def commit(
        self, operation: str, change: Callable[[Manifest], tuple[Manifest, Result]], now_ms: int
    ) -> tuple[Manifest, Result]:
        """Apply `change` to the latest manifest and write the result as the next version.

        `change` must be pure: it is re-applied to the newer manifest after every lost race. It raises
        (typically CommitConflictError) when the change no longer makes sense; nothing is written then.
        """
        commit_id = str(uuid.uuid4())
        base = self.load()
        for attempt in range(self.max_attempts):
            changed, result = change(base)
            candidate = replace(changed, version=base.version + 1, commit_id=commit_id, created_ms=now_ms, operation=operation)
            key = manifest_key(candidate.version)
            if self.store.put_if_absent(key, candidate.to_bytes()) or self._written_by(candidate.version, commit_id):
                self._known_version = max(self._known_version, candidate.version)
                if candidate.version > self.keep_versions:
                    self.store.delete(manifest_key(candidate.version - self.keep_versions))
                return candidate, result
            # Lost the race for this version: back off a little (jittered, so losers spread out) and retry
            # on top of whatever is newest now.
            time.sleep(random.uniform(0, min(0.05, 0.002 * (attempt + 1))))
            base = self.load()
        raise CommitRetriesExhaustedError(
            f"commit {operation!r} lost the race for a new manifest version {self.max_attempts} times "
            f"(last tried version {base.version + 1}); too many concurrent writers, retry later"
        )

    def _written_by(self, version: int, commit_id: str) -> bool:
        """True when `version` holds our commit: the create-only PUT succeeded but its answer was lost."""
        return self.load(version).commit_id == commit_id
