"""The catalog: which files are live, the topics and their next offsets, in SQLite or PostgreSQL.

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
