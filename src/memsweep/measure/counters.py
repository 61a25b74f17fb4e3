"""Process-wide memory counters a job records whatever it ran: the host's peak resident set and the
CUDA caching allocator's peaks (reset per job: the jobs of a sweep can share one process).

torch is only asked if the process already imported it: a job refused before any work never loads it,
and has allocated nothing on a GPU.
"""
import resource
import sys


def process_peak_rss() -> int:
    """Peak resident set size of this process, in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _cuda():
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() else None


def reset_cuda_peak() -> None:
    if (cuda := _cuda()) is not None:
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()


def device_used() -> int | None:
    """What nvidia-smi shows this process using on its GPU (its CUDA context and what its allocator
    reserved: the "used" a prediction of reserved + context stands for), read through NVML; None without
    CUDA or NVML. The process's own figure, else (a container's PID namespace) the v2 device figure; read
    before empty_cache, it is the job's peak. Why not the device-wide figure: docs/guide/measuring.md."""
    if (cuda := _cuda()) is None:
        return None
    try:
        import os

        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(_pci_bus_id(cuda))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (a driver without it, a container): the figure is unknown
        return None


def device_used_peak() -> tuple[int | None, int | None]:
    """(the job's peak "used", the part of "used" that is not the caching allocator's: the CUDA context
    and the libraries' own memory); (None, None) without CUDA or NVML. NVML reads the present only, and
    Trainer empties the allocator's cache after training (accelerate's free_memory), so "used" at the end
    is below its peak: the peak is max_memory_reserved plus what "used" holds beside the allocator,
    read at one moment (that part is made at the first kernels and handles and does not shrink)."""
    if (used := device_used()) is None:
        return None, None
    cuda = _cuda()
    beside = max(0, used - cuda.memory_reserved())
    return cuda.max_memory_reserved() + beside, beside


def _pci_bus_id(cuda) -> str:
    """The device's PCI address as NVML spells it: CUDA and NVML number devices differently (and
    CUDA_VISIBLE_DEVICES renumbers them), the bus address is the same in both."""
    props = cuda.get_device_properties(cuda.current_device())
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


def cuda_peaks() -> tuple[int | None, int | None]:
    """(max_memory_allocated, max_memory_reserved) since the last reset; (None, None) without CUDA."""
    if (cuda := _cuda()) is None:
        return None, None
    return cuda.max_memory_allocated(), cuda.max_memory_reserved()
