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
import time
from collections import Counter

from ..config.schema import Config, HardwareConf
from ..estimate import capture
from ..estimate.core import assemble, device_key, estimate_job
from ..estimate.trace import PER_GPU, for_gpu
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
    traced = on_line(*(memo[device_key(b, profile)] for b in bases), m)
    flops = between(*(memo[device_key(b, profile)]["flops_per_step"] // b.accumulation.steps for b in bases), m)
    if traced is None or flops is None:
        return estimate_job(job, profile, memo)
    memo[key] = for_gpu({**traced, "flops_per_step": flops * job.accumulation.steps, "derived_from": BASES}, profile)
    return assemble(job, profile, build_setup(job, profile), memo[key], started)


def derived(job: Config, profile: HardwareConf, memo: dict) -> bool:
    return bool(memo.get(device_key(job, profile), {}).get("derived_from"))


def between(a, b, m: int) -> int | None:
    """The value at m on the line through a at BASES[0] and b at BASES[1]; None off the integers."""
    lo, hi = BASES
    num = a * (hi - m) + b * (m - lo)
    return num // (hi - lo) if num % (hi - lo) == 0 and num >= 0 else None


def on_line(low: dict, high: dict, m: int) -> dict | None:
    """The traced step at m from the bases' traced steps, or None where they do not line up."""
    if "events" not in low or "events" not in high or low["categories"] != high["categories"]:
        return None
    events = lined_up(low["events"], high["events"], m, key=lambda e: e[:2])
    sequence = lined_up(low["roofline_sequence"], high["roofline_sequence"], m, key=lambda op: op[:2], sizes=(2, 3))
    products = products_at(low.get("roofline_products") or [], high.get("roofline_products") or [], m)
    if events is None or sequence is None or products is None:
        return None
    reductions = {key: (shape_at(spec[0], high["reductions"][key][0], m), *spec[1:])
                  for key, spec in low.get("reductions", {}).items()}
    if any(spec[0] is None for spec in reductions.values()):
        return None
    reading = capture.tensor_reading(events, low["categories"])
    # the allocator's reading is made for the GPU at hand (trace.for_gpu): its kernels' scratch depends on it
    kept = {k: v for k, v in low.items() if k not in PER_GPU}
    return {**kept, **reading, "optimizer_bytes": low["optimizer_bytes"], "recorded_peak_bytes": reading["peak_bytes"],
            "events": events, "reductions": reductions, "roofline_sequence": sequence, "roofline_products": products,
            "roofline_ops": [[*k, n] for k, n in sorted(Counter(sequence).items())]}


def products_at(low: list, high: list, m: int) -> list | None:
    """The step's products (estimate/products.reading) at m: each operand's sizes and strides, FLOPs and bytes
    on their lines; None where the two lists do not line up."""
    if len(low) != len(high):
        return None
    out = []
    for a, b in zip(low, high):
        if a[:2] != b[:2] or a[3] != b[3] or a[6] != b[6] or len(a[2]) != len(b[2]):
            return None
        operands = []
        for (name, x), (other, y) in zip(a[2], b[2]):
            if name != other or isinstance(x, tuple) != isinstance(y, tuple) or (not isinstance(x, tuple) and x != y):
                return None
            tensor = isinstance(x, tuple)
            sizes = [shape_at(x[i], y[i], m) if len(x[i]) == len(y[i]) else None for i in (1, 2)] if tensor else []
            if None in sizes or (tensor and x[3] != y[3]):
                return None
            operands.append((name, (x[0], *sizes, x[3]) if tensor else x))
        flops, moved = between(a[4], b[4], m), between(a[5], b[5], m)
        if flops is None or moved is None:
            return None
        out.append([a[0], a[1], tuple(operands), a[3], flops, moved, a[6]])
    return out


def shape_at(low: tuple, high: tuple, m: int) -> tuple | None:
    """A reduction's input shape at m from its shapes at the bases (its batch dimensions on their lines)."""
    sizes = tuple(between(a, b, m) for a, b in zip(low, high))
    return None if len(low) != len(high) or None in sizes else sizes


def lined_up(low: list, high: list, m: int, key, sizes=(2,)) -> list | None:
    """The entries at m, each size (at the positions `sizes` of an entry with them) on its line; None where
    the two lists differ in anything but those sizes."""
    if len(low) != len(high):
        return None
    out = []
    for a, b in zip(low, high):
        if key(a) != key(b) or len(a) != len(b):
            return None
        entry = list(a)
        for i in sizes:
            if i < len(a):
                entry[i] = between(a[i], b[i], m)
                if entry[i] is None:
                    return None
        out.append(tuple(entry))
    return out
