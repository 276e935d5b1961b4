"""What shows logcompact, in a wing apart from the product it uses: `demo` is `make demo`'s data, report and check;
`tour` is `logcompact tour`, the library alone on the same topics; `simulate` runs ingest, the real planner and the
engine's cost model over simulated days (`logcompact simulate`). Of the product, only the command line imports it,
when those commands run. What tests and measures the product (throw-away servers, the campaigns' harness, the
reference model, synthetic logs) is the checkout's `lab/` package, which the wheel leaves out."""
