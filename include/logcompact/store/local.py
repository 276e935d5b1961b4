"""The embedded object store: a local directory, `file:///path`.

Writes go to a temporary file first, so a reader never sees a partial object. A create-only write
publishes its temporary file with `link()`, which fails if the name exists: that is atomic on every POSIX
file system, so exactly one of several racing writers wins.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from logcompact.exceptions import InvalidStoreUriError, ObjectNotFoundError
from logcompact.store.base import CountingReader, ObjectInfo, ObjectStore

_TEMP_SUFFIX = ".tmp-logcompact"


class LocalStore(ObjectStore):
    def __init__(self, root: str | Path) -> None:
        super().__init__()
        try:
            self.root = Path(root).resolve()
        except RuntimeError:  # a loop of symbolic links
            raise InvalidStoreUriError(f"store path {root} is a loop of symbolic links: give a directory") from None
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"object key {key!r} must be a relative path without '..'")
        return self.root / key

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
        with open(temp, "wb") as out:
            out.write(data)
        return temp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(self._write_temp(path, data), path)
        self.counters.add(put=1, bytes_written=len(data))

    def put_file(self, key: str, path: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
        shutil.copyfile(path, temp)
        os.replace(temp, target)
        self.counters.add(put=1, bytes_written=target.stat().st_size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        temp = self._write_temp(path, data)
        self.counters.add(put=1, bytes_written=len(data))
        try:
            os.link(temp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)

    def get(self, key: str) -> bytes:
        with self.open_stream(key) as stream:
            return stream.read()

    def open_stream(self, key: str, start: int = 0) -> CountingReader:
        try:
            raw = open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from None
        raw.seek(start)
        self.counters.add(get=1)
        return CountingReader(raw, self.counters, os.fstat(raw.fileno()).st_size)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                data = f.read(length)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from None
        self.counters.add(get=1, bytes_read=len(data))
        return data

    def delete_abandoned_writes(self, prefix: str, before_ms: int) -> list[str]:
        """The temporary files of writes killed before their rename (a finished write leaves none)."""
        removed = []
        for path in self._path(prefix.rstrip("/") or ".").rglob(f"*{_TEMP_SUFFIX}"):
            try:
                if path.stat().st_mtime * 1000 < before_ms:
                    path.unlink()
                    removed.append(str(path.relative_to(self.root)))
            except FileNotFoundError:
                continue  # its writer finished or another gc took it meanwhile
        return removed

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        self.counters.add(list=1)
        # Walk only the directory the prefix names, not the whole store.
        directory = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        found = []
        for dirpath, _dirnames, filenames in os.walk(directory):
            for name in filenames:
                if name.endswith(_TEMP_SUFFIX):
                    continue
                full = Path(dirpath, name)
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                    continue
                try:
                    stat = full.stat()
                    found.append(ObjectInfo(key, stat.st_size, stat.st_mtime_ns // 1_000_000))
                except FileNotFoundError:
                    continue  # deleted between the walk and the stat: it is no longer listed, as in S3
        return iter(sorted(found, key=lambda info: info.key))

    def delete(self, key: str) -> None:
        self.counters.add(delete=1)
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def stat(self, key: str) -> ObjectInfo | None:
        self.counters.add(head=1)
        try:
            stat = self._path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, stat.st_size, stat.st_mtime_ns // 1_000_000)
