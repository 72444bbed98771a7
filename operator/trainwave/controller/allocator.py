"""glibc's allocator, told to keep less: fewer arenas, and free pages handed back.

The operator runs dozens of threads (the API calls' executor, the informers), and
glibc gives threads arenas of their own, up to 8 per core; memory freed in one
stays with it. A LIST page decoded on an informer thread or a large response read
on an executor thread leaves such islands behind, counted in RSS though nothing
uses them. Two arenas (the main one and one shared by the threads) bound that
waste; the operator's threads spend their time waiting on the API server, not
contending for the allocator. `trim()` returns the free pages at the top of each
arena after the burst of the first LISTs.

Where the C library is not glibc (musl has no mallopt), both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Call before threads start (arenas already made stay); whether glibc took it."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """malloc_trim(0): free pages back to the kernel; whether any were released."""
    libc = _libc()
    malloc_trim = getattr(libc, "malloc_trim", None)
    if malloc_trim is None:
        return False
    return bool(malloc_trim(0))
