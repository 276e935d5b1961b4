"""Writing a response frame given as parts (`codec.encode_response_parts`: the fields, and a Fetch's record batches
as the buffers they were encoded in) without joining them into one buffer.

On a plain TCP connection whose transport holds nothing unsent, the parts go to the socket in one `writev` (what
asyncio's own `write` does for one buffer: send at once, from the caller's memory); whatever the socket does not take
then, and every part on a TLS connection or behind bytes still queued, goes through the transport's `write`, which
keeps the order and copies only what it must hold. Python 3.11's `transport.writelines` would join the parts first
(a copy of the whole frame), and 3.12's sendmsg there is not yet ours.
"""

from __future__ import annotations

import asyncio
import os

from logcompact.kafka.codec import FrameParts

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers one writev takes


def write_frame(transport: asyncio.WriteTransport, parts: FrameParts) -> None:
    """Write `parts` in order on `transport`, in one system call where the socket takes them all."""
    if len(parts) > 1 and (fd := _plain_socket(transport)) is not None:
        while parts and transport.get_write_buffer_size() == 0:
            batch = parts[:IOV_MAX]
            try:
                sent = os.writev(fd, batch)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the connection failed: the transport's own write meets it and closes as for any write
                break
            parts = _after(parts, sent)
            if sent < sum(memoryview(part).nbytes for part in batch):
                break
    for part in parts:
        transport.write(part)


def _plain_socket(transport: asyncio.WriteTransport) -> int | None:
    """The socket's descriptor of a plain TCP transport still open; None under TLS (its bytes must be encrypted)."""
    if transport.is_closing() or transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else sock.fileno()


def _after(parts: FrameParts, sent: int) -> FrameParts:
    """The parts still to write once `sent` bytes of them are."""
    for index, part in enumerate(parts):
        size = memoryview(part).nbytes
        if sent < size:
            return [memoryview(part).cast("B")[sent:], *parts[index + 1:]] if sent else parts[index:]
        sent -= size
    return []
