"""The embedded object store: a local directory, `file:///path`.

Writes go to a temporary file first, so a reader never sees a partial object. A create-only write
publishes its temporary file with `link()`, which fails if the name exists: that is atomic on every POSIX
file system, so exactly one of several racing writers wins.

As on S3, a directory is not an object: a directory where an object's name is (someone's `mkdir`, a restore gone
wrong) reads as no object there (ObjectNotFoundError, and `stat` None), and is not deleted. Any other failure of
the file system (permissions, I/O errors, a full disk) is a one-line StoreError naming the object.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from logcompact.exceptions import InvalidStoreUriError, ObjectNotFoundError, StoreError
from logcompact.store.base import BufferLike, CountingReader, ObjectInfo, ObjectStore

_TEMP_SUFFIX = ".tmp-logcompact"
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the most buffers one writev takes (1024 on Linux)
# The most bytes one writev is given. The page cache backs a write with folios as large as the write is long, and on a
# virtual machine that hands its free memory back to its host (free page reporting, as Firecracker's balloon does) the
# large ones come from memory the host must fault in again, while small ones come first from the small free blocks
# the guest still holds: 200 MB written 1 MiB a call took 0.48 s of kernel time on this project's Intel Xeon VM,
# 256 KiB a call 0.04 s (bench/README.md, Produce against Apache Kafka). Kafka writes a batch a call, under 1 MiB.
WRITE_BYTES = 256 << 10


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

    def _write_temp(self, path: Path, parts: Sequence[BufferLike]) -> tuple[Path, int]:
        """A new temporary file beside `path` holding `parts` in order, and its size."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
        with open(temp, "wb", buffering=0) as out:
            return temp, _write_all(out.fileno(), parts)

    def _not_found(self, key: str) -> ObjectNotFoundError:
        if self._path(key).is_dir():
            return ObjectNotFoundError(
                f"no object {key!r} in {self.uri}: a directory is in its place; move it away and restore the object from a copy"
            )
        return ObjectNotFoundError(f"no object {key!r} in {self.uri}")

    def _failed(self, operation: str, key: str, exc: OSError) -> StoreError:
        if isinstance(exc, IsADirectoryError) or (operation != "read" and self._path(key).is_dir()):
            return StoreError(f"{operation} {self.uri}/{key} failed: a directory is in its place; move it away")
        return StoreError(
            f"{operation} {self.uri}/{key} failed ({exc.strerror or exc}); check the store directory's permissions, disk and space"
        )

    def put(self, key: str, data: bytes) -> None:
        self._put(key, (data,))

    def put_parts(self, key: str, parts: Sequence[BufferLike]) -> None:
        self._put(key, parts)

    def _put(self, key: str, parts: Sequence[BufferLike]) -> None:
        path = self._path(key)
        temp = None
        try:
            temp, size = self._write_temp(path, parts)
            os.replace(temp, path)
        except OSError as exc:
            if temp is not None:
                _discard(temp)
            raise self._failed("write", key, exc) from None
        self.counters.add(put=1, bytes_written=size)

    def put_file(self, key: str, path: str) -> None:
        target = self._path(key)
        temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(path, temp)
            os.replace(temp, target)
            size = target.stat().st_size
        except OSError as exc:
            _discard(temp)
            raise self._failed("write", key, exc) from None
        self.counters.add(put=1, bytes_written=size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            temp, size = self._write_temp(path, (data,))
        except OSError as exc:
            raise self._failed("write", key, exc) from None
        self.counters.add(put=1, bytes_written=size)
        try:
            os.link(temp, path)
            return True
        except FileExistsError:
            if path.is_dir():  # not an object that another writer created
                raise self._failed("write", key, IsADirectoryError(path)) from None
            return False
        except OSError as exc:
            raise self._failed("write", key, exc) from None
        finally:
            os.unlink(temp)

    def get(self, key: str) -> bytes:
        with self.open_stream(key) as stream:
            try:
                return stream.read()
            except OSError as exc:
                raise self._failed("read", key, exc) from None

    def _open(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise self._not_found(key) from None
        except OSError as exc:
            raise self._failed("read", key, exc) from None

    def open_stream(self, key: str, start: int = 0) -> CountingReader:
        raw = self._open(key)
        try:
            raw.seek(start)
            size = os.fstat(raw.fileno()).st_size
        except OSError as exc:
            raw.close()
            raise self._failed("read", key, exc) from None
        self.counters.add(get=1)
        return CountingReader(raw, self.counters, size)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._open(key) as f:
            try:
                f.seek(start)
                data = f.read(length)
            except OSError as exc:
                raise self._failed("read", key, exc) from None
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
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            if path.is_dir():
                return  # no object there, as on S3: the directory is not the store's to delete
            raise self._failed("delete", key, exc) from None

    def stat(self, key: str) -> ObjectInfo | None:
        self.counters.add(head=1)
        try:
            found = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._failed("stat", key, exc) from None
        if stat.S_ISDIR(found.st_mode):
            return None  # a directory is not an object
        return ObjectInfo(key, found.st_size, found.st_mtime_ns // 1_000_000)


# The mode of an object `put` writes (open's 0o666 less the process's umask), which a linked object is given too.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_OBJECT_MODE = 0o666 & ~_UMASK
# Why a hard link cannot be made where a copy can: another filesystem, or one without links.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


def _link_or_copy(path: str, temp: Path) -> None:
    """The staged file's bytes under `temp`: a hard link on the store's filesystem, so a compaction's output is
    written once, not written and copied (callers stage a file, upload it and delete it, never writing to it
    after the upload), given the mode `put` gives an object (a staged temporary file is its owner's only); a copy
    elsewhere."""
    try:
        os.link(path, temp)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        shutil.copyfile(path, temp)
    else:
        os.chmod(temp, _OBJECT_MODE)


def _write_all(fd: int, parts: Sequence[BufferLike]) -> int:
    """Write `parts` to `fd` in order, each as it is (no copy joins them), at most _IOV_MAX buffers and WRITE_BYTES a
    writev, and on after a partial write; the bytes written."""
    views = [
        view[at : at + WRITE_BYTES]
        for view in (memoryview(part).cast("B") for part in parts)
        for at in range(0, view.nbytes, WRITE_BYTES)
    ]
    total = sum(view.nbytes for view in views)
    first = 0  # the first view not written whole
    while first < len(views):
        end, size = first, 0
        while end < len(views) and end - first < _IOV_MAX and size + views[end].nbytes <= WRITE_BYTES:
            size += views[end].nbytes
            end += 1
        written = os.writev(fd, views[first:end])
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:
            views[first] = views[first][written:]
    return total


def _discard(temp: Path) -> None:
    """Remove a failed write's temporary file, if it was made."""
    try:
        temp.unlink()
    except OSError:
        pass
