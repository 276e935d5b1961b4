"""Produce and consume throughput through the library API, on the local store and on S3 (Ceph RGW).

    .venv/bin/python bench/produce_consume.py                      # both backends, RGW started here
    .venv/bin/python bench/produce_consume.py --backends file --records 2000000

Runs on one core (the process is pinned to CPU 0 and Arrow to one thread). Each case repeats `--repeat`
times on a fresh cluster and prints the median. Produce: Python `Record`s through an `Agent` into L0 files
(Arrow building, key hashing, LZ4, PUT and catalog commit included). Consume: every partition read back
as Arrow batches, and record by record. The local store keeps its catalog in its embedded SQLite; the S3
store's catalog is a fresh database on a throw-away PostgreSQL server started here (as the tests start
it). Targets on the local store: consume as Arrow at least 5 million records/s, produce at least 500,000
records/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from results import recorded

# The lab (lab/: throw-away servers, the campaigns' harness, the reference model) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logcompact.catalog import Catalog
from logcompact.consume import read_batches, read_records
from logcompact.ingest import Agent, Record
from logcompact.store import LocalStore
from logcompact.topics import Topic

PARTITIONS = 8
KEY_BYTES = 36
CATALOG_OF = {"file": "file+sqlite", "s3": "s3+postgres"}
NOW = 1_700_000_000_000


def make_records(count: int, value_bytes: int) -> list[Record]:
    # Random values, cycling further apart than LZ4's 64 KiB window: the data does not compress away.
    values = [os.urandom(value_bytes) for _ in range(1024)]
    return [Record(i % PARTITIONS, b"%036d" % (i % 1_000_000), values[i % 1024], NOW + i) for i in range(count)]


def produce(catalog: Catalog, records: list[Record]) -> float:
    catalog.ensure_created(NOW)
    catalog.create_topic(Topic.create("bench", PARTITIONS, {"cleanup.policy": "compact"}, NOW), NOW)
    started = time.perf_counter()
    with Agent(catalog, background=False) as agent:
        futures = [agent.produce("bench", records[i : i + 10_000]) for i in range(0, len(records), 10_000)]
    for future in futures:
        future.result()
    return time.perf_counter() - started


def consume_arrow(catalog: Catalog) -> tuple[float, int]:
    started = time.perf_counter()
    snapshot = catalog.snapshot()
    rows = sum(t.num_rows for p in range(PARTITIONS) for t in read_batches(catalog.store, snapshot, "bench", p))
    return time.perf_counter() - started, rows


def consume_records(catalog: Catalog) -> tuple[float, int]:
    started = time.perf_counter()
    snapshot = catalog.snapshot()
    rows = sum(1 for p in range(PARTITIONS) for _ in read_records(catalog.store, snapshot, "bench", p))
    return time.perf_counter() - started, rows


def open_backend(backend: str, workdir: Path, s3_client, postgres) -> Catalog:
    """A fresh cluster: a local store with its embedded catalog, or a bucket with a new PostgreSQL database."""
    if backend == "file":
        return Catalog(LocalStore(workdir / uuid.uuid4().hex))
    from logcompact.store.s3 import S3Store

    bucket = f"bench-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    return Catalog(S3Store(bucket, "cluster", client=s3_client), postgres.create_database())


def start_s3(workdir: Path):
    """A boto3 client for the S3 backend (AWS_ENDPOINT_URL if set, otherwise a Ceph RGW started here) and a
    PostgreSQL server for its catalogs."""
    from lab.servers.postgres import start_postgres
    from logcompact.store.s3 import default_client

    postgres, stop_postgres = start_postgres(workdir / "postgres")
    if os.environ.get("AWS_ENDPOINT_URL"):
        return default_client(), postgres, stop_postgres
    from lab.servers.rgw import start_rgw

    server, stop_rgw = start_rgw(workdir / "rgw")

    def stop() -> None:
        stop_rgw()
        stop_postgres()

    return server.client(), postgres, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="file,s3", help="comma-separated: file, s3")
    parser.add_argument("--records", type=int, default=1_000_000, help="records per case with 100-byte values")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    cases = [(100, args.records), (1024, max(args.records // 5, 1))]
    with tempfile.TemporaryDirectory(prefix="logcompact-bench-") as tmp:
        workdir = Path(tmp)
        # The servers start before the pinning, so their daemons keep the other core.
        s3_client, postgres, stop_s3 = start_s3(workdir) if "s3" in args.backends.split(",") else (None, None, lambda: None)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        try:
            print(f"{'store+catalog':13} {'value':>6} {'records':>9} | {'produce rec/s':>14} {'MB/s':>7} | "
                  f"{'consume Arrow rec/s':>20} {'MB/s':>7} | {'consume records rec/s':>22}")
            for backend in args.backends.split(","):
                for value_bytes, count in cases:
                    records = make_records(count, value_bytes)
                    megabytes = count * (KEY_BYTES + value_bytes) / 1e6
                    produce_s, arrow_s, record_s = [], [], []
                    for _ in range(args.repeat):
                        catalog = open_backend(backend, workdir, s3_client, postgres)
                        produce_s.append(produce(catalog, records))
                        seconds, rows = consume_arrow(catalog)
                        assert rows == count, f"read {rows} records, produced {count}"
                        arrow_s.append(seconds)
                        record_s.append(consume_records(catalog)[0])
                    p, a, r = (statistics.median(x) for x in (produce_s, arrow_s, record_s))
                    print(f"{CATALOG_OF[backend]:13} {value_bytes:>5}B {count:>9,} | {count / p:>14,.0f} {megabytes / p:>7.1f} | "
                          f"{count / a:>20,.0f} {megabytes / a:>7.1f} | {count / r:>22,.0f}", flush=True)
        finally:
            stop_s3()


if __name__ == "__main__":
    with recorded():
        main()
