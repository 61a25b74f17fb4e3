"""Micro-batches from two traces, at a fixed depth.

Why it holds: the traced step at micro-batch m (accumulation a process's batch / m, so two micro-batches measured
as the trace measures any accumulation of 2 or more) runs the same ops in the same order for every m of 2
or more, and every tensor it allocates is either of the model (weights, gradients, optimizer state: the same
bytes at every m) or of the batch (activations, logits, the batch itself: bytes proportional to m), so each
allocation's bytes, each op's FLOPs and bytes moved, and each product's operand sizes, lie on a line in m.
The step at another m is then the events of two traces (BASES) with each size read off its line, replayed
through the allocator model as a traced step's are: peak, reserved and the roofline come out as the trace
would give them.

A reduction's kernel scratch (estimate/scratch.py) is not on a line: how it splits into blocks depends on
the size and the GPU. Its input shape is, and the scratch is sized from that for the GPU (trace.for_gpu).

Where it does not: at m = 1 some views over the batch dimension are contiguous already and a copy is not
made (the events differ), and accumulation 1 measures one micro-batch, not two; those are traced. Where the
two traces' events do not line up (the same allocations and frees in the same order) or a size is not on an
integer line, the job is traced as it is. tests/test_planner.py checks a derived step against its full trace.
"""
import dataclasses
import time
from collections import Counter

from ..config.schema import Config, HardwareConf
from ..estimate import capture
from ..estimate.core import assemble, device_key, estimate_job
from ..estimate.events import Event
from ..estimate.op_record import CountedOp, OpCost
from ..estimate.products import CountedProduct, Operand, TensorSpec
from ..estimate.trace import for_gpu
from ..estimate.traced import Trace
from ..run.setup import build_setup
from .space import at_micro_batch, per_rank

BASES = (2, 4)


def derivable(job: Config, m: int) -> bool:
    """m is not a base, and it and both bases measure two micro-batches (m >= 2, accumulation >= 2)."""
    share = per_rank(job)
    return m not in BASES and m >= 2 and all(share % k == 0 and share // k >= 2 for k in (*BASES, m))


def estimate_at_micro_batch(job: Config, profile: HardwareConf, memo: dict):
    """The estimate of `job` on `profile`: from its bases' traces where derivable and they line up, else traced."""
    started, m, key = time.perf_counter(), per_rank(job) // job.accumulation.steps, device_key(job, profile)
    if key in memo or job.accumulation.steps * m != per_rank(job) or not derivable(job, m):
        return estimate_job(job, profile, memo)
    bases = [at_micro_batch(job, k) for k in BASES]
    for base in bases:
        estimate_job(base, profile, memo)
    low, high = (memo[device_key(b, profile)] for b in bases)
    traced = on_line(low, high, m)
    flops = between(*(t.flops_per_step // b.accumulation.steps for t, b in zip((low, high), bases)), m)
    if traced is None or flops is None:
        return estimate_job(job, profile, memo)
    derived_trace = dataclasses.replace(traced, flops_per_step=flops * job.accumulation.steps, derived_from=BASES)
    memo[key] = for_gpu(derived_trace, profile)
    return assemble(job, profile, build_setup(job, profile), memo[key], started)


def derived(job: Config, profile: HardwareConf, memo: dict) -> bool:
    traced = memo.get(device_key(job, profile))
    return traced is not None and bool(traced.derived_from)


def between(a, b, m: int) -> int | None:
    """The value at m on the line through a at BASES[0] and b at BASES[1]; None off the integers."""
    lo, hi = BASES
    num = a * (hi - m) + b * (m - lo)
    return num // (hi - lo) if num % (hi - lo) == 0 and num >= 0 else None


def on_line(low: Trace, high: Trace, m: int) -> Trace | None:
    """The traced step at m from the bases' traced steps, or None where they do not line up."""
    if low.events is None or high.events is None or low.categories != high.categories:
        return None
    events = events_at(low.events, high.events, m)
    sequence = sequence_at(low.roofline_sequence, high.roofline_sequence, m)
    products = products_at(low.roofline_products, high.roofline_products, m)
    if events is None or sequence is None or products is None:
        return None
    reductions = {key: reduction._replace(shape=shape_at(reduction.shape, high.reductions[key].shape, m))
                  for key, reduction in low.reductions.items()}
    if any(reduction.shape is None for reduction in reductions.values()):
        return None
    # the allocator's reading is made for the GPU at hand (trace.for_gpu): its kernels' scratch depends on it
    traced = dataclasses.replace(
        low.for_any_gpu(), **dataclasses.asdict(capture.tensor_reading(events, low.categories)), events=events,
        reductions=reductions, roofline_sequence=sequence, roofline_products=products,
        roofline_ops=[CountedOp(*cost, n) for cost, n in sorted(Counter(sequence).items())])
    traced.optimizer_bytes = low.optimizer_bytes  # the optimizer's own state, the same at every m
    traced.recorded_peak_bytes = traced.peak_bytes
    return traced


def products_at(low: list[CountedProduct], high: list[CountedProduct], m: int) -> list[CountedProduct] | None:
    """The step's products (estimate/products.reading) at m: each operand's sizes and strides, FLOPs and bytes
    on their lines; None where the two lists do not line up."""
    if len(low) != len(high):
        return None
    out = []
    for a, b in zip(low, high):
        if (a.phase, a.op, a.dtype, a.times) != (b.phase, b.op, b.dtype, b.times) or len(a.operands) != len(b.operands):
            return None
        operands = operands_at(a.operands, b.operands, m)
        flops, moved = between(a.flops, b.flops, m), between(a.moved, b.moved, m)
        if operands is None or flops is None or moved is None:
            return None
        out.append(a._replace(operands=operands, flops=flops, moved=moved))
    return out


def operands_at(low: tuple[Operand, ...], high: tuple[Operand, ...], m: int) -> tuple[Operand, ...] | None:
    """A product's operands at m: each tensor's shape and strides on their lines, the rest the same at both
    bases; None where they are not."""
    out = []
    for a, b in zip(low, high):
        tensor = isinstance(a.value, TensorSpec)
        if a.name != b.name or tensor != isinstance(b.value, TensorSpec) or (not tensor and a.value != b.value):
            return None
        if tensor:
            shape, strides = shape_at(a.value.shape, b.value.shape, m), shape_at(a.value.strides, b.value.strides, m)
            if shape is None or strides is None or a.value.dtype != b.value.dtype:
                return None
            a = a._replace(value=a.value._replace(shape=shape, strides=strides))
        out.append(a)
    return tuple(out)


def shape_at(low: tuple, high: tuple, m: int) -> tuple | None:
    """A shape (or strides) at m from its values at the bases (its batch dimensions on their lines)."""
    sizes = tuple(between(a, b, m) for a, b in zip(low, high))
    return None if len(low) != len(high) or None in sizes else sizes


def events_at(low: list[Event], high: list[Event], m: int) -> list[Event] | None:
    """The recorded step at m: each allocation's bytes on its line; None where the two recordings differ in
    anything else (the same events, blocks and marks in the same order)."""
    if len(low) != len(high):
        return None
    out = []
    for a, b in zip(low, high):
        nbytes = between(a.nbytes, b.nbytes, m)
        if a._replace(nbytes=0) != b._replace(nbytes=0) or nbytes is None:
            return None
        out.append(a._replace(nbytes=nbytes))
    return out


def sequence_at(low: list[OpCost], high: list[OpCost], m: int) -> list[OpCost] | None:
    """The step's ops in order at m: each op's FLOPs and bytes moved on their lines; None where the two
    sequences differ in anything else (the same ops, phases and dtypes in the same order)."""
    if len(low) != len(high):
        return None
    out = []
    for a, b in zip(low, high):
        flops, moved = between(a.flops, b.flops, m), between(a.moved, b.moved, m)
        if (a.phase, a.dtype) != (b.phase, b.dtype) or flops is None or moved is None:
            return None
        out.append(a._replace(flops=flops, moved=moved))
    return out
