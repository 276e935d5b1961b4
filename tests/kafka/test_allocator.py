"""An agent's process keeps freed buffers for the next ones: once warm, rounds that hold then free a flush's worth of
numpy and Arrow buffers fault in almost no new pages, where glibc's defaults trim the freed heap back to the kernel
and mimalloc purges its pages, and every round faults each page in again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

BUFFERS, BUFFER_BYTES = 64, 1 << 20
ROUND_PAGES = 2 * BUFFERS * BUFFER_BYTES // 4096  # numpy's and Arrow's

PROBE = textwrap.dedent(f"""
    import resource, sys, time
    import numpy as np, pyarrow as pa
    from logcompact.kafka.allocator import keep_freed_memory

    if sys.argv[1] == "kept":
        assert keep_freed_memory()

    def one_round():
        held = []
        for _ in range({BUFFERS}):
            array = np.empty({BUFFER_BYTES}, np.uint8)
            array.fill(1)
            buffer = pa.allocate_buffer({BUFFER_BYTES})
            np.frombuffer(buffer, np.uint8)[:] = array
            held += [array, buffer]
        del held
        time.sleep(0.05)  # past mimalloc's purge delay

    for _ in range(2):
        one_round()
    counted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        one_round()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - counted)
""")


def faults_over_four_rounds(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_freed_buffers_are_kept_for_the_next_ones() -> None:
    assert faults_over_four_rounds("kept") < ROUND_PAGES // 20


IPC_PROBE = textwrap.dedent("""
    import sys
    from logcompact.kafka.allocator import arrow_allocates_from_the_system, keep_freed_memory

    if sys.argv[1] == "before":
        assert arrow_allocates_from_the_system()
    import pyarrow as pa
    if sys.argv[1] == "after":
        assert not arrow_allocates_from_the_system()  # too late: Arrow chose its pool as it loaded
    assert keep_freed_memory()
    batch = pa.record_batch([pa.array([bytes(range(256)) * 4] * 4096)], names=["value"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)) as writer:
        writer.write_batch(batch)
    print(pa.default_memory_pool().backend_name, pa.mimalloc_memory_pool().max_memory())
""")


def test_the_agent_names_the_system_pool_before_arrow_loads_so_that_its_ipc_writer_allocates_from_it() -> None:
    """Arrow's IPC writer takes its compressed buffers from the pool Arrow chose as it loaded, not pyarrow's default:
    named in the environment before pyarrow loads, none come from mimalloc; named after, they still do."""
    environment = {name: value for name, value in os.environ.items() if name != "ARROW_DEFAULT_MEMORY_POOL"}

    def pool_and_mimalloc_bytes(mode: str) -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-c", IPC_PROBE, mode], capture_output=True, text=True, check=True, env=environment)
        name, held = done.stdout.split()
        return name, int(held)

    assert pool_and_mimalloc_bytes("before") == ("system", 0)
    name, held = pool_and_mimalloc_bytes("after")
    assert name == "system" and held > 0  # pyarrow's default set by keep_freed_memory; the IPC writer's still mimalloc
