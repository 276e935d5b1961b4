"""`logcompact simulate` and `tour`: the planner simulated over days of a workload, and a tour of the library."""

from __future__ import annotations

from pathlib import Path

import click

from logcompact.cli.common import Context, now_option, pass_context


@click.command()
@click.option("--agents", type=click.IntRange(min=1), multiple=True, default=(1, 10), show_default=True,
              help="Agent counts to simulate, one workload each (repeatable).")
@click.option("--hours", type=click.FloatRange(min=0.1), default=24.0, show_default=True, help="Simulated hours.")
@click.option("--rate", type=click.FloatRange(min=0.001), default=1000.0, show_default=True, help="Records per second per agent.")
@click.option("--record-bytes", type=click.IntRange(min=1), default=136, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True, help="Key cardinality.")
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Zipf exponent of key popularity (0: uniform).")
@click.option("--tombstone-rate", type=click.FloatRange(0, 1), default=0.01, show_default=True)
@click.option("--topics", type=click.IntRange(min=1), default=1, show_default=True, help="Compacted topics.")
@click.option("--partitions", type=click.IntRange(min=1), default=8, show_default=True, help="Partitions per topic.")
@click.option("--max-lag-ms", type=click.IntRange(min=1), default=2 * 3_600_000, show_default=True)
@click.option("--min-lag-ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="The topics' min.compaction.lag.ms: records younger are kept whole, as the engine keeps them.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".simulate", show_default=True,
              help="Where the JSON summaries and PNG plots go.")
def simulate(agents: tuple[int, ...], hours: float, rate: float, record_bytes: int, keys: int, skew: float,
             tombstone_rate: float, topics: int, partitions: int, max_lag_ms: int, min_lag_ms: int, out_dir: str) -> None:
    """Simulate ingest, the planner and the engine's cost model; compare logcompact's planner, with
    min.cleanable.dirty.ratio at Kafka's default and off, with the reference's literal rules on the same workload."""
    from logcompact.lab.simulate import RUNS, Workload, compare
    from logcompact.lab.simulate.report import table, write

    for count in agents:
        workload = Workload(agents=count, records_per_s=rate, record_bytes=record_bytes, keys=keys, key_skew=skew,
                            tombstone_rate=tombstone_rate, topics=topics, partitions=partitions, hours=hours,
                            max_lag_ms=max_lag_ms, min_lag_ms=min_lag_ms)
        results = compare(workload, RUNS)
        name = f"{count}-agent{'s' if count > 1 else ''}"
        click.echo(table(f"{name}, {hours:g} simulated hours, {rate:g} records/s per agent, {keys:,} keys:", results))
        for path in write(Path(out_dir), name, results):
            click.echo(f"  wrote {path}")


@click.command()
@now_option
@click.option("--records", type=click.IntRange(min=3), default=1_000_000, show_default=True, help="Records to produce in all.")
@pass_context
def tour(ctx: Context, records: int) -> None:
    """The library without Airflow or Spark: create three topics (compact, delete, compact,delete), produce,
    consume back, sweep, verify, summarize."""
    from logcompact.lab.tour import run_tour

    run_tour(ctx.catalog, records, ctx.clock, echo=click.echo)
