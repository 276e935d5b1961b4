"""What every command shares: the context (store, catalog and clock, opened on first use), the --now option, JSON
output. Nothing heavy is imported here, so `logcompact --help` loads click and this package only."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from logcompact.exceptions import InvalidStoreUriError
from logcompact.units import LONG_MAX, wall_clock_ms

if TYPE_CHECKING:
    from logcompact.catalog import Catalog
    from logcompact.store import ObjectStore


class Context:
    def __init__(self, store_uri: str | None, catalog_url: str | None, now_ms: int | None, aws_conn_id: str | None) -> None:
        self._store_uri = store_uri
        self._catalog_url = catalog_url
        self._aws_conn_id = aws_conn_id
        self._store: ObjectStore | None = None
        self._catalog: Catalog | None = None
        self.now_ms = now_ms

    @property
    def aws_conn_id(self) -> str | None:
        return self._aws_conn_id

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            if not self._store_uri:
                raise click.UsageError("no store given: pass --store URI or set LOGCOMPACT_STORE")
            from logcompact.store import LocalStore, open_store

            store = open_store(self._store_uri, aws_conn_id=self._aws_conn_id)
            if isinstance(store, LocalStore) and (problem := directory_problem(store.root)):
                raise InvalidStoreUriError(f"store {self._store_uri}: {problem}; pass the directory of a store (file:///path/to/store)")
            self._store = store
        return self._store

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            from logcompact.catalog import Catalog

            self._catalog = Catalog(self.store, self._catalog_url)
        return self._catalog

    def clock(self) -> int:
        return self.now_ms if self.now_ms is not None else wall_clock_ms()


pass_context = click.make_pass_decorator(Context)
# Times in ms and offsets: the catalog keeps them as 64-bit integers, never negative.
NON_NEGATIVE_INT64 = click.IntRange(0, LONG_MAX)


def directory_problem(directory: Path) -> str | None:
    """Why `directory` cannot be used or created (a file at it or above it, a name too long), or None."""
    for path in (directory, *directory.parents):
        try:
            found = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):  # look further up, for the file in the way
            continue
        except OSError as exc:
            return f"{exc.strerror}: {path}"
        return None if stat.S_ISDIR(found.st_mode) else f"{path} is a file, not a directory"
    return None


def _set_now(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is not None:
        ctx.ensure_object(Context).now_ms = value


# Every command that depends on time takes --now itself too (`logcompact compact --now MS`).
now_option = click.option(
    "--now", type=NON_NEGATIVE_INT64, metavar="MS", expose_value=False, callback=_set_now,
    help="Clock in epoch ms (overrides the global --now).",
)


def emit(document: Any) -> None:
    """One JSON line on stdout."""
    click.echo(json.dumps(document, separators=(",", ":")))


def parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    """KEY=VALUE pairs of --config."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (for example cleanup.policy=compact)", param_hint="--config")
        settings[name.strip()] = value.strip()
    return settings
