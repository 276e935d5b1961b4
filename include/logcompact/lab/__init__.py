"""The lab: what shows logcompact and what measures it, in a wing apart from the product it uses. `demo` is `make demo`'s
data, report and check; `tour` is `logcompact tour`, the library alone on the same topics; `simulate` runs ingest, the
real planner and the engine's cost model over simulated days; `synthetic` writes compacted logs straight to segment
files for the benchmarks. Nothing of the product imports the lab."""
