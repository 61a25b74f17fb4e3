"""A real out-of-memory on the CPU, on purpose: cap the job's address space with RLIMIT_AS.

`hardware.memory_gib` on a CPU profile is the capacity of an imaginary device that already holds the model:
once the job is built, training and evaluation may map that much more address space less the weights and
buffers; past it the allocation fails and job.py records `status: oom` (the CPU counterpart of the CUDA cap in
hardware.py). Address space over-counts resident memory: use it to force and bracket OOMs. Linux only.

What fails and how, what the cap counts, and its limits: docs/guide/measuring.md.
"""
import os
import resource
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from ..config.schema import HardwareConf
from . import host_memory

ONEDNN_FAILED = "could not create a primitive"


def address_space_bytes() -> int:
    """This process's mapped address space now (VmSize)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def cap(extra_bytes: int) -> Iterator[int]:
    """Allow `extra_bytes` more address space inside the block; restore the soft limit after it.

    A tighter limit already in force is kept (caps nest), and the hard limit is never touched, so
    the soft limit can always be raised back: the next job of a sweep runs uncapped.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with host_memory.each_block_mapped():
        limit = address_space_bytes() + int(extra_bytes)
        for bound in (soft, hard):
            if bound != resource.RLIM_INFINITY:
                limit = min(limit, bound)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            yield limit
        except RuntimeError as exc:
            if ONEDNN_FAILED not in str(exc):
                raise
            raise MemoryError(f"oneDNN could not map a primitive under the {limit / 2**20:,.0f} MiB address-space "
                              f"cap: {exc}") from exc
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def cap_for(profile: HardwareConf, held_bytes: int = 0) -> AbstractContextManager:
    """The cap a resolved hardware profile asks for: only a CPU profile with `memory_gib` set.

    `held_bytes` is what the device already holds (the built model), so the job gets the rest.
    """
    if profile.device != "cpu" or profile.memory_gib is None:
        return nullcontext()
    if not os.path.exists("/proc/self/statm"):
        warnings.warn("hardware.memory_gib on the CPU needs Linux (/proc); running without a cap", stacklevel=2)
        return nullcontext()
    room = int(profile.memory_gib * 2**30) - held_bytes
    if room <= 0:
        raise MemoryError(f"the model alone ({held_bytes / 2**20:,.0f} MiB) exceeds hardware.memory_gib="
                          f"{profile.memory_gib}")
    return cap(room)
