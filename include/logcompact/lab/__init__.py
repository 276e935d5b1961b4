"""The lab: what shows logcompact and what measures it, in a wing apart from the product it uses. `demo` is `make demo`'s
data, report and check; `tour` is `logcompact tour`, the library alone on the same topics; `simulate` runs ingest, the
real planner and the engine's cost model over simulated days; `synthetic` writes compacted logs straight to segment
files for the benchmarks; `reference_model` is an independent model of Kafka's compaction semantics that the engine
is checked against; `servers` starts throw-away PostgreSQL and Ceph RGW servers on 127.0.0.1; `campaign` is the kill
and corruption campaigns' harness. The tests and the benchmarks stand on it; of the product, only the command line's
`simulate` and `tour` import it, when they run."""
