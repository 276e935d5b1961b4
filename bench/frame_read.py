"""The CPU of reading request frames off a socket: the agent's `FrameReader` (a large frame read straight into a buffer
of its own) against asyncio's own `StreamReader.readexactly` (each read a new bytes object, copied into the stream's
buffer and out again), the reader the agent used before.

    .venv/bin/python bench/frame_read.py [--sizes 300,16000,100000,1000000] [--megabytes 500] [--rounds 4]

For each frame size, a client process pinned to core 0 sends --megabytes of frames (a 4-byte size, then the bytes),
about 1 MB a send, as fast as its socket takes them, to an asyncio server in this process pinned to core 1, which reads each frame
whole the way the agent's connection loop does, old and new reader alternating for --rounds each; printed is the
server's CPU time (user + system) per GB read, median and min, and the ratio. The agent's Produce requests from
librdkafka are frames of up to its batch.size (1 MB); Fetch and group requests are tens of bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from results import recorded

from logcompact.kafka.server import READ_BUFFER_BYTES, SCRATCH_READ_BYTES, FrameReader, FrameStreamProtocol

_CLIENT = """
import socket, sys
size, count, port = map(int, sys.argv[1:])
connection = socket.create_connection(("127.0.0.1", port))
frames = max(1, 1_000_000 // (size + 4))  # a send of about 1 MB at a time: the server, not the client's sends, binds
chunk = (size.to_bytes(4, "big") + bytes(size)) * frames
for _ in range(count // frames):
    connection.sendall(chunk)
connection.sendall(chunk[: (count % frames) * (size + 4)])
connection.close()
"""


async def _read(reader: asyncio.StreamReader, old: bool, count: int) -> None:
    for _ in range(count):
        size = int.from_bytes(await reader.readexactly(4), "big")
        if old:
            await reader.readexactly(size)
            continue
        assert isinstance(reader, FrameReader)
        arrived = reader.start_frame(size)
        while arrived < size:
            if not await reader.more():
                raise EOFError("the client closed mid-frame")
            arrived = reader.frame_arrived
        reader.end_frame()


async def _cpu_to_read(size: int, count: int, old: bool) -> float:
    """Seconds of this process's CPU to read `count` frames of `size` bytes from a client process."""
    loop = asyncio.get_running_loop()
    cpu: asyncio.Future[float] = loop.create_future()
    scratch = memoryview(bytearray(SCRATCH_READ_BYTES))

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = time.process_time()
        try:
            await _read(reader, old, count)
            cpu.set_result(time.process_time() - started)
        except Exception as exc:  # the run's failure, handed to it
            cpu.set_exception(exc)
        writer.close()

    if old:
        server = await loop.create_server(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(READ_BUFFER_BYTES, loop), accepted, loop), "127.0.0.1", 0)
    else:
        server = await loop.create_server(lambda: FrameStreamProtocol(FrameReader(READ_BUFFER_BYTES, loop, scratch), accepted, loop), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.create_subprocess_exec("taskset", "-c", "0", sys.executable, "-c", _CLIENT, str(size), str(count), str(port))
    try:
        return await cpu
    finally:
        await client.wait()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="300,16000,100000,1000000", help="frame sizes in bytes, comma-separated")
    parser.add_argument("--megabytes", type=int, default=500, help="read per run")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    with recorded():
        print("server CPU per GB of frames read (user + system, pinned to core 1; the client on core 0), old and new alternating")
        print("| frame | asyncio StreamReader: median (min) | FrameReader: median (min) | new / old |")
        print("|---|---|---|---|")
        for size in map(int, args.sizes.split(",")):
            count = max(1, args.megabytes * 1_000_000 // size)
            per_gb = 1e9 / (size * count)
            runs: dict[bool, list[float]] = {True: [], False: []}
            for round_ in range(args.rounds):
                for old in (True, False) if round_ % 2 == 0 else (False, True):
                    runs[old].append(asyncio.run(_cpu_to_read(size, count, old)) * per_gb)
            old_s, new_s = statistics.median(runs[True]), statistics.median(runs[False])
            print(f"| {size:,} B | {old_s:.3f} s ({min(runs[True]):.3f}) | {new_s:.3f} s ({min(runs[False]):.3f}) | {new_s / old_s:.2f} |")
        print(f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())} (1, 5, 15 min) at the end")


if __name__ == "__main__":
    main()
