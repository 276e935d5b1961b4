"""The memory allocators of an agent's process: freed buffers kept for the next request instead of handed back to the
kernel.

An agent allocates and frees buffers of 64 KiB to tens of MiB many times a second (frames read, records decoded, L0
files encoded). glibc's malloc gives such chunks back to the kernel as they are freed (`munmap` above its mmap
threshold; an arena's free top trimmed above its trim threshold), and Arrow's default pool, mimalloc, purges freed
pages 10 ms after, so the kernel faults and zeroes every page of the next buffer again: a quarter of an agent's CPU
producing 1 KiB records (`perf`: `clear_page_erms` under the page faults of copies into new buffers and of socket
reads). Here glibc keeps them, and Arrow allocates from glibc too. The process's memory stays at its peak, which the
agent's budgets bound, as a JVM keeps its heap.

Arrow's C++ library chooses its default pool once, as it loads, from ARROW_DEFAULT_MEMORY_POOL, and its IPC writer
and reader take their buffers from that pool whatever pyarrow's own default is: the compressed parts of every L0
file's blocks came from mimalloc, purged and faulted in again in 2 MiB pages (`perf`: 7% of the flusher's CPU under
1 KiB records). `logcompact agent` therefore names the system pool in its environment before pyarrow loads
(`arrow_allocates_from_the_system`), for itself and the processes it starts.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): chunks below it come from the arenas and are reused.
MMAP_THRESHOLD_BYTES = 32 << 20
# An arena's free top kept up to this much: several flushes' and fetches' buffers.
TRIM_THRESHOLD_BYTES = 512 << 20
# Arrow's own choice of pool, which a user's setting of it keeps.
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_allocates_from_the_system() -> bool:
    """Name the system pool as Arrow's default in this process's environment, which the processes it starts inherit,
    unless ARROW_DEFAULT_MEMORY_POOL names one already; whether this call made it the system pool for this process
    too: False once pyarrow has loaded (the variable is read once, as it loads) or when another pool is named. Call it
    before anything imports pyarrow; this module imports it only in keep_freed_memory. Another C library than glibc
    is left as it is, as keep_freed_memory leaves it."""
    if platform.libc_ver()[0] != "glibc":
        return False
    os.environ.setdefault(ARROW_POOL_ENV, "system")
    return os.environ[ARROW_POOL_ENV] == "system" and "pyarrow" not in sys.modules


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed chunks below MMAP_THRESHOLD_BYTES in its arenas, trimming an arena's top only
    past TRIM_THRESHOLD_BYTES, and Arrow to allocate from it (unless ARROW_DEFAULT_MEMORY_POOL names another pool); whether
    it applies: on another C library both allocators are left as they are."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    for parameter, value, name in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "M_MMAP_THRESHOLD"), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "M_TRIM_THRESHOLD")):
        if libc.mallopt(parameter, value) != 1:
            log.warning("glibc's mallopt refused %s=%d: freed buffers go back to the kernel and are faulted in again", name, value)
            return False
    import pyarrow as pa  # here: arrow_allocates_from_the_system must run before pyarrow loads

    if os.environ.get(ARROW_POOL_ENV, "system") == "system":  # pyarrow loaded before it was named, or it is unnamed
        pa.set_memory_pool(pa.system_memory_pool())
    return True
