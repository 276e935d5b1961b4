"""The lab: what tests and measures logcompact from the checkout, never installed with it. `servers` starts
throw-away PostgreSQL and Ceph RGW servers on 127.0.0.1; `campaign` is the kill and corruption campaigns' harness;
`reference_model` is an independent model of Kafka's compaction semantics that the engine is checked against;
`synthetic` writes compacted logs straight to segment files for the benchmarks. The tests import it through pytest's
`pythonpath` (the repository's root), the benchmarks by putting the repository on `sys.path`; it imports the product,
never the other way round. What the product's own commands show (`make demo`, `logcompact tour`, `logcompact
simulate`) is in `logcompact.lab`."""
