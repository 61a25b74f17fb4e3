"""Keep freed host memory in the process for the next step, instead of handing it back to the OS.

glibc's malloc serves large blocks with mmap and unmaps them when freed, and trims the top of its
heap, so each training step maps its big tensors anew and faults in and zeroes every page (~1.1 us a
page here: a fresh 47 MB buffer costs 15 ms, a reused one 2.5 ms). How many depends on the
process's history, not on the job: the same default MiniLM steps took ~6,000 minor faults per step
in a plain Trainer script and 20,000-41,000 under train.py, 2-7 % of a step on 2 cores. Its
adaptive mmap threshold stops at 32 MiB, so MiniLM's 47 MB embedding gradient is mapped afresh
every step whatever came before. Here every block comes from the heap (no mmap) and the heap is not
trimmed: freed memory is reused by the next step (about 4,000 faults per step are left, from heap
growth). The process keeps its peak instead of returning it (~3 % more peak RSS on MiniLM).

It cannot be undone within a process (glibc's adaptive thresholds stay off once set), so
`in_effect()` says what the process really runs with, whatever the current job asked for.
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: ~2 GiB free at the heap top before any trim

_applied = False


def keep_freed_memory() -> bool:
    """No mmap, no trim, once per process; False where there is no glibc mallopt (macOS, musl)."""
    global _applied
    if _applied:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _applied


def in_effect() -> bool:
    return _applied
