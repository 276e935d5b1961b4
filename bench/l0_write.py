"""The CPU of an agent's L0 file write, by part: the regime's file (1,000 partitions of 10 topics, one 100-byte record
each, as bench/regime.py's agents produce it) and bench/produce_consume.py's produce file (8 partitions, 100-byte
values, batches of 10,000 records up to the 8 MiB flush).

    .venv/bin/python bench/l0_write.py                       # this checkout, both files
    .venv/bin/python bench/l0_write.py --against OLD_INCLUDE  # and another checkout's include/, alternating

Each part runs in a process of its own, pinned to one core with Arrow on one thread, `--rounds` times; with
--against the two checkouts alternate, round by round, so both see the same load. Figures are CPU microseconds
(process time) per file, the median over the rounds:

* write: `Agent._write` whole (the table, `SegmentWriter.write_sections` and `finish`, the PUT to a local store);
* sections: `write_sections` and `finish` alone, on the same table;
* produce: what an agent's produce of one file's batches costs (`produce_columns` for the regime's, `produce` of
  `Record`s for produce_consume's), including its `fill_null` of null timestamps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("write", "sections", "produce")


def _measure(case: str, files: int) -> dict[str, float]:
    """In this process (the include/ chosen by PYTHONPATH): CPU microseconds per file of each part."""
    import io

    import numpy as np
    import pyarrow as pa

    from logcompact.catalog import Catalog
    from logcompact.format import SegmentWriter
    from logcompact.format.layout import HEADERS_TYPE
    from logcompact.format.xxh3 import compile_hasher
    from logcompact.ingest import PRODUCE_SCHEMA, Agent, Record
    from logcompact.sketch import compile_sketcher
    from logcompact.store import LocalStore
    from logcompact.topics import Topic

    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    compile_hasher()
    compile_sketcher()
    now = 1_700_000_000_000
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="logcompact-l0-write-") as tmp:
        catalog = Catalog(LocalStore(tmp))
        catalog.ensure_created(now)
        if case == "regime":
            topics, per_topic = [f"regime-{n}" for n in range(10)], 100
            for name in topics:
                catalog.create_topic(Topic.create(name, per_topic, {"cleanup.policy": "compact"}, now), now)
            partitions = np.arange(per_topic, dtype=np.int64)
            keys = pa.array([b"key-%03d" % 7] * per_topic, pa.binary())
            no_timestamps, no_headers = pa.nulls(per_topic, pa.int64()), pa.nulls(per_topic, HEADERS_TYPE)

            values = [pa.array([rng.bytes(100) for _ in range(per_topic)], pa.binary()) for _ in topics]
            batches = [pa.RecordBatch.from_arrays([no_timestamps, keys, topic_values, no_headers], schema=PRODUCE_SCHEMA) for topic_values in values]

            def produce(agent: Agent) -> None:
                for name, batch in zip(topics, batches):
                    agent.produce_columns(name, partitions, batch)
        else:
            catalog.create_topic(Topic.create("bench", 8, {"cleanup.policy": "compact"}, now), now)
            values = [os.urandom(100) for _ in range(1024)]
            records = [Record(i % 8, b"%036d" % i, values[i % 1024], now + i) for i in range(60_000)]

            def produce(agent: Agent) -> None:
                for start in range(0, len(records), 10_000):
                    agent.produce("bench", records[start : start + 10_000])

        agent = Agent(catalog, background=False, flush_bytes=1 << 40)
        cpu = dict.fromkeys(PARTS, 0.0)
        for _ in range(files):
            began = time.process_time()
            produce(agent)
            cpu["produce"] += time.process_time() - began
            buffer = agent._buffer
            agent._buffer = type(buffer)()
            began = time.process_time()
            agent._write(buffer, time.monotonic())
            cpu["write"] += time.process_time() - began
        # write_sections and finish alone, on the table _write builds (captured from its call).
        captured: list = []
        original = SegmentWriter.write_sections

        def capture(self, slots, table, counts):
            captured.append((slots, table, counts))
            return original(self, slots, table, counts)

        SegmentWriter.write_sections = capture  # type: ignore[method-assign]
        produce(agent)
        buffer, agent._buffer = agent._buffer, type(agent._buffer)()
        agent._write(buffer, time.monotonic())
        SegmentWriter.write_sections = original  # type: ignore[method-assign]
        slots, table, counts = captured[0]
        began = time.process_time()
        for _ in range(files):
            writer = SegmentWriter(io.BytesIO(), "lz4")
            writer.write_sections(slots, table, counts)
            writer.finish()
        cpu["sections"] = time.process_time() - began
    return {part: 1e6 * seconds / files for part, seconds in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="another checkout's include/ directory, measured alternately with this one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="regime,produce")
    parser.add_argument("--measure", nargs=2, metavar=("CASE", "FILES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(_measure(args.measure[0], int(args.measure[1]))))
        return
    checkouts = {"this": str(ROOT / "include")}
    if args.against:
        checkouts["against"] = str(Path(args.against).resolve())
    print(f"CPU: {next(line.split(':', 1)[1].strip() for line in Path('/proc/cpuinfo').read_text().splitlines() if line.startswith('model name'))}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for case in args.cases.split(","):
        files = 200 if case == "regime" else 10
        figures: dict[str, dict[str, list[float]]] = {name: {part: [] for part in PARTS} for name in checkouts}
        for _ in range(args.rounds):
            for name, include in checkouts.items():
                env = dict(os.environ, PYTHONPATH=include + os.pathsep + os.environ.get("PYTHONPATH", ""))
                out = subprocess.run([sys.executable, __file__, "--measure", case, str(files)], env=env, check=True,
                                     capture_output=True, text=True).stdout
                for part, value in json.loads(out.splitlines()[-1]).items():
                    figures[name][part].append(value)
        for name, parts in figures.items():
            print(f"{case:8} {name:8} " + "  ".join(f"{part} {statistics.median(v):8,.0f} us" for part, v in parts.items()))
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
