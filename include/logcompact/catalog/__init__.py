"""The catalog: which files are live, the topics and their next offsets, committed optimistically."""

from logcompact.catalog.catalog import Catalog, manifest_key
from logcompact.catalog.manifest import CatalogSection, DataFile, Manifest, NewFile

__all__ = ["Catalog", "CatalogSection", "DataFile", "Manifest", "NewFile", "manifest_key"]
