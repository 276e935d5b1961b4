"""The segment file format (specified in docs/format.md): sections of many topic-partitions in one file."""

from logcompact.format.layout import FORMAT_VERSION, SECTION_SCHEMA, SectionInfo
from logcompact.format.reader import Footer, PayloadWanted, Section, SectionStream, read_footer, read_section, read_section_from
from logcompact.format.writer import PartsSink, SegmentWriter, key_hashes, section_table, write_segment

__all__ = [
    "FORMAT_VERSION",
    "SECTION_SCHEMA",
    "Footer",
    "PartsSink",
    "PayloadWanted",
    "Section",
    "SectionStream",
    "SectionInfo",
    "SegmentWriter",
    "key_hashes",
    "read_footer",
    "read_section",
    "read_section_from",
    "section_table",
    "write_segment",
]
