"""glibc's malloc: freed memory kept for reuse (the index is in :mod:`rl_app.upstream`)."""

from __future__ import annotations

import ctypes

# glibc's malloc settings (mallopt): blocks up to this size come from its heap, and it
# keeps up to twice this much freed memory instead of handing it back to the system.
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1
KEPT_BYTES = 1 << 30


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse: by default it returns every block
    over 128 kB to the system when freed, so each iteration's sampled batches (tens of MB
    of frames on Atari) are faulted back in page by page; frame stacks are rebuilt faster
    with it (docs/speed.md). Nothing changes without glibc. Test:
    ``test_glibc_still_returns_a_freed_large_block_to_the_system``."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, KEPT_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, 2 * KEPT_BYTES)
