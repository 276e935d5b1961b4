"""logcompact: key-based compaction for a Kafka-style log whose segment files live in object storage."""

__version__ = "0.1.0"
