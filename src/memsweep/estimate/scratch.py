"""Kernel scratch: blocks a CUDA op takes from the caching allocator and gives back before it returns. Not
tensors, so the dispatch mode sees none of them, but the allocator does, and where the step peaks inside such
an op they are part of the peak. Modelled: the staging buffer and semaphores of PyTorch's reduction kernel
(Reduce.cuh), sized per GPU (its SM count and resident threads per SM). The kernel's rule, the snapshots it
was checked against and what is not modelled: docs/estimator/allocator.md.
"""
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .events import Event

# The CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": maximum resident
# threads per SM.
THREADS_PER_SM = {7.0: 2048, 7.5: 1024, 8.0: 2048, 8.6: 1536, 8.7: 2048, 8.9: 1536, 9.0: 2048, 10.0: 2048,
                  12.0: 1536}
WARP = 32
MAX_THREADS = 512  # mnt_wrapper<T>::MAX_NUM_THREADS (256 for complex double only)
MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD = 16, 256  # setReduceConfig, CUDA (ROCm differs)
REDUCTIONS = {"sum.dim_IntList", "sum.default", "mean.dim", "mean.default"}


class Reduction(NamedTuple):
    """A sum or mean the reduction kernel runs on a contiguous tensor: its shape, the reduced dims (sorted) and
    the accumulator's bytes; once recorded, the key of its semaphores' block (its staging buffer's key is the
    one the recorder files it under)."""
    shape: tuple[int, ...]
    dims: tuple[int, ...]
    acc: int
    semaphore: Hashable = None


@dataclass(frozen=True)
class Gpu:
    sm_count: int
    threads_per_sm: int


def gpu_of(profile) -> Gpu | None:
    """The reduction kernel's view of the profile's GPU; None off CUDA or where the profile lacks it."""
    threads = THREADS_PER_SM.get(profile.compute_capability)
    if profile.device != "cuda" or not profile.sm_count or threads is None:
        return None
    return Gpu(profile.sm_count, threads)


def op_reduction(func, args, kwargs) -> Reduction | None:
    """The reduction a sum or mean `func` (the op just run) makes the kernel run, else None."""
    name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
    if name not in REDUCTIONS or not isinstance(args[0], torch.Tensor) or not args[0].is_contiguous():
        return None
    x = args[0]
    dims = args[1] if len(args) > 1 and args[1] is not None else kwargs.get("dim")
    dims = range(x.dim()) if not dims else [d % x.dim() for d in dims]
    acc = 8 if x.dtype == torch.float64 else 4  # arg_t: float accumulates float, half and bfloat16
    return Reduction(tuple(x.shape), tuple(sorted(set(dims))), acc)


def sized(events: list[Event], reductions: dict[Hashable, Reduction], gpu: Gpu | None) -> list[Event]:
    """The step's events with each reduction's scratch (recorded as 0-byte placeholders, `reductions`:
    {staging key: Reduction}) sized for `gpu`; a block of 0 bytes left out."""
    sizes = {}
    for key, reduction in reductions.items():
        made = reduction_scratch(reduction.shape, reduction.dims, reduction.acc, gpu) if gpu else []
        staging, semaphores = made if made else (0, 0)
        sizes.update({key: staging, reduction.semaphore: semaphores})
    out = []
    for event in events:
        if event.kind in ("alloc", "free") and event.key in sizes:
            if not sizes[event.key]:
                continue
            event = event._replace(nbytes=sizes[event.key]) if event.kind == "alloc" else event
        out.append(event)
    return out


def reduction_scratch(shape: tuple, dims: tuple, acc: int, gpu: Gpu) -> list[int]:
    """[staging buffer, semaphores] of gpu_reduce_kernel reducing `dims` of a contiguous tensor of `shape`
    (accumulating in `acc`-byte values), or [] where it reduces without them or the layout is not one this
    reading of TensorIterator covers."""
    dims = list(dims)
    if 0 in shape:
        return []
    kept = [d for d in range(len(shape)) if d not in dims]
    outputs, inputs = math.prod(shape[d] for d in kept), math.prod(shape[d] for d in dims)
    along_output = bool(kept) and dims == list(range(len(dims)))  # outputs the fastest: "vectorize along output"
    if inputs <= 1 or (kept and not along_output and dims != list(range(len(shape) - len(dims), len(shape)))):
        return []
    vec = next(v for v in (4, 2, 1) if outputs % v == 0) if along_output else 1
    dim0, dim1 = (outputs // vec, inputs) if along_output else (inputs, outputs)
    if not along_output and dim0 >= 128:
        dim0 //= 4  # "vectorize along input" (input_vec_size = vt0 = 4)
    width, height = block(dim0, dim1, MAX_THREADS // vec)
    step_in, step_out = (1, width) if along_output else (width, 1)
    if -(-inputs // step_in) < min(height * 16, MAX_VALUES_PER_THREAD):
        return []  # each warp its own outputs: no split across warps, so none across blocks
    step_in *= height
    grid_x = -(-(outputs // vec) // step_out)
    target = gpu.sm_count * (gpu.threads_per_sm // (width * height))
    values = -(-inputs // step_in)
    if values < MAX_VALUES_PER_THREAD or grid_x > target:
        return []
    ctas = max(min(-(-target // grid_x), -(-values // MIN_VALUES_PER_THREAD)), -(-values // MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return []
    return [acc * outputs * ctas * (width * vec if along_output else 1), 4 * grid_x]


def block(dim0: int, dim1: int, max_threads: int) -> tuple[int, int]:
    """ReduceConfig::set_block_dimension: (block width, block height)."""
    def pow2(n):
        return max_threads if n >= max_threads else max(1, 1 << (int(n).bit_length() - 1))

    p0, p1 = pow2(dim0), pow2(dim1)
    width = min(p0, WARP)
    height = min(p1, max_threads // width)
    return min(p0, max_threads // height), height
