"""The event loop's plumbing: what crosses into the server's event loop from the catalog and from other threads.
`LoopResults` hands futures completed on the ingest thread and the flusher to the loop in bursts; `CommitWatch` is
the one poller of the catalog's version that waiting fetches share."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future

from logcompact.catalog import Catalog

log = logging.getLogger(__name__)


class LoopResults:
    """Futures completed on other threads, delivered to the event loop in bursts: one wakeup of the loop for all that
    completed since the last, where asyncio.wrap_future costs one each (a callback and a byte on the loop's wakeup
    socket), two per Produce request: thousands a second under fifty producers, a fifth of the loop's time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._completed: list[tuple[asyncio.Future, Future]] = []

    def wrap(self, future: Future) -> asyncio.Future:
        """An asyncio future of the event loop this is called on, taking `future`'s result or exception."""
        loop = asyncio.get_running_loop()
        waiting = loop.create_future()
        future.add_done_callback(lambda done: self._complete(loop, waiting, done))
        return waiting

    def _complete(self, loop: asyncio.AbstractEventLoop, waiting: asyncio.Future, done: Future) -> None:
        with self._lock:
            self._completed.append((waiting, done))
            if len(self._completed) > 1:  # a delivery is scheduled and has not begun: it takes this one too
                return
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            completed, self._completed = self._completed, []
        for waiting, done in completed:
            if waiting.cancelled():
                continue
            if done.cancelled():
                waiting.cancel()
            elif (error := done.exception()) is not None:
                waiting.set_exception(error)
            else:
                waiting.set_result(done.result())


class CommitWatch:
    """The catalog's newest version, polled every `interval_seconds` by one task while any fetch waits for a
    commit: a thousand long-polling consumers cost one catalog read per interval, not a thousand. Runs on the
    server's event loop."""

    def __init__(self, catalog: Catalog, interval_seconds: float) -> None:
        self._catalog = catalog
        self._interval = interval_seconds
        self._version = -1
        self._waiters = 0
        self._changed = asyncio.Event()
        self._poller: asyncio.Task | None = None
        self._released = False

    @property
    def newest(self) -> int:
        """The newest version polled (-1 before the first poll): once `wait_past(version)` returned True, newer than
        `version` and read after that wait began."""
        return self._version

    async def wait_past(self, version: int, timeout_seconds: float) -> bool:
        """Whether a version newer than `version` is committed within the timeout (False at once once released)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        self._waiters += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            while self._version <= version:
                if self._released:
                    return False
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    return False
            return True
        finally:
            self._waiters -= 1

    async def _poll(self) -> None:
        while self._waiters:
            try:
                version = await asyncio.to_thread(self._catalog.latest_version)
            except Exception as exc:  # the catalog down: waiting fetches time out, their next read fails
                log.warning("cannot read the catalog's version for waiting fetches: %s", exc)
            else:
                if version != self._version:
                    self._version = version
                    self._changed.set()
                    self._changed = asyncio.Event()
            await asyncio.sleep(self._interval)

    def release(self) -> None:
        """Stop every wait now and for good (the server is stopping): waiting fetches answer with what they have."""
        self._released = True
        self._changed.set()

    async def close(self) -> None:
        """Stop polling (the server stops once its connections are answered)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
