"""The catalog: which files are live, the topics and their next offsets, in SQLite or PostgreSQL."""

from logcompact.catalog.catalog import DEFAULT_KEEP_VERSIONS, Catalog
from logcompact.catalog.model import CatalogSection, CommitResult, DataFile, FileSummary, Lease, NewFile, PartitionSection
from logcompact.catalog.snapshot import Snapshot

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "Catalog",
    "CatalogSection",
    "CommitResult",
    "DataFile",
    "FileSummary",
    "Lease",
    "NewFile",
    "PartitionSection",
    "Snapshot",
]
