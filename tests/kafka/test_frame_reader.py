"""The agent's frame reader on real sockets, plain and TLS: frames of any size, sent in pieces of any size and
together, read back byte for byte, whether a frame is read straight into its own buffer (most of it still to arrive)
or completes in the stream's buffer; read-only; a frame cut off by the client's close gives its partial bytes."""

from __future__ import annotations

import asyncio
import ssl

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcompact.kafka.server import DIRECT_READ_BYTES, READ_BUFFER_BYTES, SCRATCH_READ_BYTES, FrameReader, FrameStreamProtocol

# Around the reads' boundaries: the direct-read threshold, the scratch buffer, the stream's pause limit.
SIZES = st.one_of(
    st.integers(0, 64),
    st.integers(DIRECT_READ_BYTES - 64, DIRECT_READ_BYTES + 64),
    st.integers(SCRATCH_READ_BYTES - 64, SCRATCH_READ_BYTES + 64),
    st.integers(0, 3 * READ_BUFFER_BYTES),
)


def _frames(sizes: list[int], seed: int) -> list[bytes]:
    """Frames of a byte pattern (251, prime, so no piece of a power-of-two size repeats another) shifted per frame."""
    pattern = bytes(range(251)) * (max(sizes) // 251 + 2)
    return [pattern[(seed + n) % 251 :][:size] for n, size in enumerate(sizes)]


async def _read_frames(reader: FrameReader, count: int) -> list[bytes | memoryview]:
    """As the agent's connection loop reads them: the size prefix from the stream's buffer, then the frame."""
    frames = []
    for _ in range(count):
        size = int.from_bytes(await reader.readexactly(4), "big")
        arrived = reader.start_frame(size)
        while arrived < size:
            assert await reader.more(), "the client closed mid-frame"
            arrived = reader.frame_arrived
        frames.append(reader.end_frame())
    return frames


async def _exchange(frames: list[bytes], pieces: list[int], tls: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> list[bytes | memoryview]:
    loop = asyncio.get_running_loop()
    scratch = memoryview(bytearray(SCRATCH_READ_BYTES))
    read: asyncio.Future[list[bytes | memoryview]] = loop.create_future()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert isinstance(reader, FrameReader)
        try:
            if tls is not None:
                await writer.start_tls(tls[0])
            read.set_result(await _read_frames(reader, len(frames)))
        except Exception as exc:  # the test's failure, handed to it
            read.set_exception(exc)
        writer.close()

    server = await loop.create_server(lambda: FrameStreamProtocol(FrameReader(READ_BUFFER_BYTES, loop, scratch), accepted, loop), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    if tls is not None:
        await writer.start_tls(tls[1], server_hostname="localhost")
    stream = b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames)
    at = 0
    for piece in pieces:
        writer.write(stream[at : at + piece])
        await writer.drain()
        at += piece
    writer.write(stream[at:])
    await writer.drain()
    try:
        return await asyncio.wait_for(read, 60)
    finally:
        writer.close()
        server.close()


def _tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    authority.configure_trust(client)
    return server, client


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "tls"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(SIZES, min_size=1, max_size=6), pieces=st.lists(st.integers(1, 400_000), max_size=8), seed=st.integers(0, 250))
def test_frames_sent_in_any_pieces_are_read_back_byte_for_byte_and_read_only(secure: bool, sizes: list[int], pieces: list[int], seed: int) -> None:
    frames = _frames(sizes, seed)
    read = asyncio.run(_exchange(frames, pieces, _tls_contexts() if secure else None))
    assert [bytes(frame) for frame in read] == frames
    assert not any(isinstance(frame, memoryview) and not frame.readonly for frame in read)


@pytest.mark.parametrize("size", [100, 10 * DIRECT_READ_BYTES], ids=["in the stream's buffer", "read straight into its own"])
def test_a_frame_cut_off_by_the_clients_close_gives_the_bytes_that_arrived(size: int) -> None:
    async def cut_off() -> tuple[bool, bytes]:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[tuple[bool, bytes]] = loop.create_future()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert isinstance(reader, FrameReader)
            size_read = int.from_bytes(await reader.readexactly(4), "big")
            arrived = reader.start_frame(size_read)
            more = True
            while arrived < size_read and (more := await reader.more()):
                arrived = reader.frame_arrived
            outcome.set_result((more, reader.partial_frame()))
            writer.close()

        scratch = memoryview(bytearray(SCRATCH_READ_BYTES))
        server = await loop.create_server(lambda: FrameStreamProtocol(FrameReader(READ_BUFFER_BYTES, loop, scratch), accepted, loop), "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(size.to_bytes(4, "big") + b"x" * (size // 2))
        await writer.drain()
        writer.close()
        try:
            return await asyncio.wait_for(outcome, 30)
        finally:
            server.close()

    more, partial = asyncio.run(cut_off())
    assert (more, partial) == (False, b"x" * (size // 2))
