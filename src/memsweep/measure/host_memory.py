"""Keep freed host memory in the process for the next step, instead of handing it back to the OS.

glibc's malloc unmaps large freed blocks and trims its heap, so each step faults its big tensors in afresh.
With no mmap and no trim, freed memory is reused by the next step, at the price of keeping the peak
(`time.minor_faults_per_step` in results.json shows the effect). It cannot be undone within a process, so
`in_effect()` says what the process runs with; a capped job maps each block instead (`each_block_mapped`).

Why, and the measurements: docs/guide/measuring.md.
"""
import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: ~2 GiB free at the heap top before any trim
MMAP_THRESHOLD_MIN = 128 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MIN: its mmap threshold before any adapting
MMAP_MAX_DEFAULT = 65536  # glibc's DEFAULT_MMAP_MAX
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (4 MiB x sizeof(long)): the adaptive threshold stops here, so without
# reuse a larger block is mapped, and its 4 KiB pages faulted in, each time it is made
MMAP_THRESHOLD_MAX = 32 * 2**20
PAGE = 4096

_applied = False
_mapping_each_block = False


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """No mmap, no trim, once per process; False where there is no glibc mallopt (macOS, musl)."""
    global _applied
    if _applied:
        return True
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _applied = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _applied


@contextmanager
def each_block_mapped() -> Iterator[bool]:
    """Inside: every block of 128 KiB or more is mapped on its own and unmapped when freed.

    The address space then follows the live blocks, not the heap's fragments, as a capped address space
    (measure/memcap.py) needs. After the block, reuse is restored where it was in effect; glibc's adaptive
    threshold stays off, at 128 KiB. Measurements: docs/guide/measuring.md.
    """
    global _mapping_each_block
    mallopt = _mallopt()
    if mallopt is None or _mapping_each_block:  # no glibc, or an outer block already maps them
        yield _mapping_each_block
        return
    _mapping_each_block = mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT) == 1 and \
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MIN) == 1
    try:
        yield _mapping_each_block
    finally:
        _mapping_each_block = False
        if _applied:
            mallopt(M_MMAP_MAX, 0)


def in_effect() -> bool:
    """Whether freed memory is kept for reuse now: not inside `each_block_mapped`."""
    return _applied and not _mapping_each_block
