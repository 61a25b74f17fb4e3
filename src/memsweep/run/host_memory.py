"""Keep freed host memory in the process for the next step, instead of handing it back to the OS.

glibc's malloc serves large blocks with mmap and unmaps them when freed, and trims the top of its
heap, so a training step that frees its big tensors maps them anew in the next step, and the kernel
faults in and zeroes every page again (about a microsecond a page: a few percent of a small model's
step on 2 cores). How often depends on what the process did before, not on the job, and glibc's
adaptive mmap threshold stops at 32 MiB, so a larger tensor (MiniLM's 47 MB embedding gradient) is
mapped afresh every step whatever came before. With no mmap and no trim every block comes from the
heap and freed memory is reused by the next step; the price is that the process keeps its peak
instead of returning it. `time.minor_faults_per_step` in results.json shows the effect.

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
