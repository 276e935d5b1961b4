"""The catalog: which files are live, the topics and their next offsets, in SQLite or PostgreSQL.

`Catalog` (`catalog.py`) holds the public API and the transactions; each role's statements are functions over a
connection in a module of its own, which `Catalog` calls inside its transactions:

* `versions`: the version row writers serialize on, and the commit log;
* `topics`: topics and partitions, and the topic rows each transaction reads and locks;
* `files`: the files and sections rows a commit adds; `appends`: an append's bulk statements;
* `producers`: idempotent producers' state; `compactions`: a compaction's commit;
* `cleaning`: leases, plan seals and uncleanable marks; `garbage`: what gc reads and deletes;
* `agents`: the Kafka agents' registrations; `groups`: consumer groups' offsets and coordinator rows;
* `transactions`: Kafka's transactions (producer ids and epochs, markers, aborted ranges, the LSO's rows);
* `migrations`: schema upgrades; `cluster` and `identity`: the catalog bound to its store's marker.

Beneath them `database` (engines, errors), `schema` (tables), `model` (value types) and `summaries` (partition
summaries); beside them `snapshot` (readers pinned to a version) and `planning` (what planners read).

The value types load eagerly; `Catalog` and `Snapshot` (and SQLAlchemy with them) on first use, so a
Spark task that only reads a plan's files never pays for the database layer it does not touch.
"""

from typing import TYPE_CHECKING, Any

from logcompact.catalog.model import (
    CatalogSection,
    CommitResult,
    DataFile,
    FileSummary,
    Lease,
    LevelSection,
    NewFile,
    PartitionSection,
    PartitionSummary,
    SectionFigures,
    SetAside,
    TopicPartition,
    Uncleanable,
)
from logcompact.catalog.planning import PlanningSnapshot

if TYPE_CHECKING:
    from logcompact.catalog.catalog import DEFAULT_KEEP_VERSIONS, Catalog
    from logcompact.catalog.snapshot import Snapshot

_LAZY = {
    "Catalog": "logcompact.catalog.catalog",
    "DEFAULT_KEEP_VERSIONS": "logcompact.catalog.catalog",
    "Snapshot": "logcompact.catalog.snapshot",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "Catalog",
    "CatalogSection",
    "CommitResult",
    "DataFile",
    "FileSummary",
    "Lease",
    "LevelSection",
    "NewFile",
    "PartitionSection",
    "PartitionSummary",
    "PlanningSnapshot",
    "SectionFigures",
    "SetAside",
    "Snapshot",
    "TopicPartition",
    "Uncleanable",
]
