"""The compaction engine: plans in, survivors out (see `cleaner` for the algorithm's contract)."""
