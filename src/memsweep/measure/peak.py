"""This CPU's peak rates, measured once per process: what the roofline (estimate/roofline.py) times a CPU
step at, as `make bench` measures its matmul ceiling (benchmarks/hw_efficiency.py): a large square
`torch.mm` per dtype, and a large copy for memory bandwidth. Measured at the thread count torch runs
with, so a prediction and a job of the same process compare like with like."""
import functools
import statistics
import time

import torch


def median_rate(run, work: float, seconds: float, sync=lambda: None) -> float:
    """Median of work / time over about `seconds` of calls, after two warm-up calls; `sync` waits for the
    device after each (torch.cuda.synchronize where the work runs on a GPU)."""
    for _ in range(2):
        run()
    sync()
    rates, spent = [], 0.0
    while spent < seconds or len(rates) < 5:
        start = time.perf_counter()
        run()
        sync()
        took = time.perf_counter() - start
        rates.append(work / took)
        spent += took
    return statistics.median(rates)


def matmul_flops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return median_rate(lambda: torch.mm(a, b), 2 * n ** 3, seconds)


def copy_bytes_s(numel: int = 2 ** 24, seconds: float = 0.5) -> float:
    """Bytes read plus written per second by a copy far larger than the caches (64 MiB each way)."""
    src, dst = torch.randn(numel), torch.empty(numel)
    return median_rate(lambda: dst.copy_(src), 2 * numel * 4, seconds)


@functools.lru_cache(maxsize=1)
def cpu_rates() -> dict:
    """FLOP/s for fp32 (and bf16 where it runs natively), memory GB/s, the thread count."""
    from ..config.hardware import cpu_native_precisions

    flops = {"fp32": matmul_flops(torch.float32)}
    bf16, _ = cpu_native_precisions()
    if bf16:
        flops["bf16"] = matmul_flops(torch.bfloat16)
    return {"flops": flops, "memory_gbs": copy_bytes_s() / 1e9, "threads": torch.get_num_threads()}
