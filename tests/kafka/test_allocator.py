"""An agent's process keeps freed buffers for the next ones: once warm, rounds that hold then free a flush's worth of
numpy and Arrow buffers fault in almost no new pages, where glibc's defaults trim the freed heap back to the kernel
and mimalloc purges its pages, and every round faults each page in again."""

from __future__ import annotations

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
