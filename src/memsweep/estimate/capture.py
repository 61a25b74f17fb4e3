"""The allocations and frees of a step run on fake tensors, in order, for the allocator model.

`Recorder`, a TorchDispatchMode inside the FakeTensorMode, makes an allocation of every tensor storage it
sees first and a free of its death, as MemTracker counts them; what the dispatch mode cannot see is added by
hand (cuBLAS's workspaces, a reduction kernel's scratch, Storage.resize_). Every block has the ledger's
category, so the events (events.Event) can be adjusted (adjust.py) and read as the ledger reads a step
(`tensor_reading`) or as the GPU's allocator sees them (`allocator_reading`). The method, what is not seen,
and the measurements behind the workspaces and the packing envelope: docs/estimator/allocator.md.
"""
import itertools
import math
import os
import re
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from ..measure.ledger import LedgerReading
from ..measure.optimizer_state import plain_tensors
from . import scratch, sharded
from .allocator import replay
from .allocator_conf import Options
from .events import Event
from .paged import pages


@dataclass(eq=False, slots=True)
class StorageBlock:
    """The block a storage holds now: its key while it holds one, None once freed (or while it holds 0 bytes).
    A storage resized in place keeps its StorageBlock and changes its key."""
    key: Hashable = None


class Recorder(TorchDispatchMode):
    """Records the step's events (allocations, frees, marks, gradients) in `self.events`, as
    allocator.replay takes them, and each block's category in `self.categories`."""

    def __init__(self, tensors=()):
        super().__init__()
        # each CUDA reduction's scratch, recorded as 0-byte placeholders: {staging key: scratch.Reduction},
        # sized per GPU by scratch.sized (one trace serves GPUs of different SM counts)
        self.reductions: dict[int, scratch.Reduction] = {}
        # the keys of the library workspaces seeded below (cuBLAS's), which a trace resizes per GPU
        self.workspaces: list[str] = []
        self.events: list[Event] = []
        # alive before recording, allocated first in this order: tensors, ints (a block no tensor stands
        # for: a library workspace), or (category, either) pairs
        self.seed = [t if isinstance(t, tuple) else ("params", t) for t in tensors]
        self.seen = WeakIdKeyDictionary()  # storage -> its StorageBlock; holds no storage alive
        self.early = WeakIdKeyDictionary()  # storages made before the step: see `outside`
        self.finalizers: list[weakref.finalize] = []
        self.keys = itertools.count()
        # block key -> category: the ledger's names (params, buffers, optimizer, grads, temp, activations),
        # workspace for a block no tensor stands for, host for a copy in host memory
        self.categories: dict = {}
        self.phase = "activations"  # the category of what is allocated now
        self.resize = None

    def __enter__(self):
        for n, (category, t) in enumerate(self.seed):
            if isinstance(t, int):
                self.events.append(Event.alloc(f"block{n}", t))
                self.categories[f"block{n}"] = category
                if category == "workspace":
                    self.workspaces.append(f"block{n}")
            else:
                self.see(t, category)
        self.seed = []
        self.resize = torch.UntypedStorage.resize_

        def resize_(storage, size):
            self.resize(storage, size)
            self.resized(storage)

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self.resize
        # what dies after recording is not part of it
        for f in self.finalizers:
            f.detach()
        return super().__exit__(*exc)

    def outside(self, tensors) -> None:
        """Tensors made before the step (a CPU job's collated batch): not a block when an op reads them,
        as MemTracker does not count them then; a block once an op returns a view of them, as it does."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.early[t.untyped_storage()] = True

    def viewed(self, t) -> bool:
        """Whether an op has returned a view of `t`, made before the step: MemTracker counts it from then."""
        return t.untyped_storage() in self.early and t.untyped_storage() in self.seen

    def see(self, t, category=None) -> None:
        # a wrapper subclass (FSDP's DTensor) holds no memory of its own: its inner tensors do, and
        # they are seen when its own dispatch runs the op on them
        if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t):
            self.see_storage(t.untyped_storage(), category)

    def see_storage(self, storage, category=None) -> StorageBlock:
        if storage not in self.seen:
            self.seen[storage] = block = StorageBlock()
            self.allocate(block, storage.nbytes(), category)
            self.finalizers.append(weakref.finalize(storage, self.release, block))
        return self.seen[storage]

    def allocate(self, block: StorageBlock, nbytes: int, category=None) -> None:
        if nbytes:  # an empty storage holds no block (the allocator returns no memory for 0 bytes)
            block.key = next(self.keys)
            self.events.append(Event.alloc(block.key, nbytes))
            self.categories[block.key] = category or self.phase

    def mark(self, name: str) -> None:
        """Where the step is: forward, backward, step (the optimizer's: what it allocates is temp), end."""
        self.events.append(Event.mark(name))
        self.phase = "temp" if name == "step" else "activations"

    def tag(self, t, category: str) -> None:
        """Give the block holding `t` a category (a gradient once backward has made it)."""
        block = self.seen.get(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
        if block is not None and block.key is not None:
            self.categories[block.key] = category

    def tag_grads(self, model) -> None:
        for p in model.parameters():
            if p.grad is not None:
                self.tag(sharded.local(p.grad), "grads")

    def grad_made(self, name: str, grad) -> None:
        """A parameter's gradient accumulated (its post-accumulate-grad hook, where DeepSpeed's own hook
        runs): a "grad" event with the block holding it, for adjust.py's ZeRO walk (zero.py)."""
        block = self.seen.get(grad.untyped_storage())
        self.events.append(Event.grad(name, block.key if block is not None else None))

    def release(self, block: StorageBlock) -> None:
        if block.key is not None:
            self.events.append(Event.free(block.key))
            block.key = None

    def resized(self, storage) -> None:
        if storage not in self.seen:
            self.see_storage(storage)  # first seen now, at its new size
            return
        block = self.seen[storage]
        self.release(block)
        self.allocate(block, storage.nbytes())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):  # made before recording and not given to __init__
            if not (self.early and isinstance(t, torch.Tensor) and t.untyped_storage() in self.early):
                self.see(t)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            self.see(t)
        spec = scratch.op_reduction(func, args, kwargs)  # a GPU's scratch, whatever device the fakes are on
        if spec is not None:
            self.reduction(spec)
        return out

    def reduction(self, spec: scratch.Reduction) -> None:
        """The reduction kernel's staging buffer and semaphores: allocated after its output, freed (the
        semaphores first) before the op returns."""
        staging, semaphores = next(self.keys), next(self.keys)
        self.events += [Event.alloc(staging, 0), Event.alloc(semaphores, 0), Event.free(semaphores),
                        Event.free(staging)]
        self.categories.update({staging: "workspace", semaphores: "workspace"})
        self.reductions[staging] = spec._replace(semaphore=semaphores)


# PyTorch's default CUBLAS_WORKSPACE_CONFIG (CublasHandlePool.cpp, getChosenWorkspaceSize): 8,519,680 bytes,
# 32 MiB on compute capability 9.0 (Hopper), as memory snapshots show them (docs/estimator/allocator.md).
DEFAULT_WORKSPACE_CONFIG = ":4096:2:16:8"
HOPPER_WORKSPACE_CONFIG = ":4096:8"


def cublas_workspace_bytes(compute_capability: float | None = None) -> int:
    """cuBLAS's workspace for the training stream: CUBLAS_WORKSPACE_CONFIG's ":KiB:count" pairs, else
    PyTorch's default for the GPU's compute capability."""
    default = HOPPER_WORKSPACE_CONFIG if compute_capability == 9.0 else DEFAULT_WORKSPACE_CONFIG
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", default)
    pairs = re.findall(r":(\d+):(\d+)", config)
    return sum(int(kib) * 1024 * int(count) for kib, count in pairs)


# One cuBLAS workspace per (thread's handle, stream): the training thread's (forward) and the autograd
# engine's device thread's (backward), as a public snapshot's two blocks show (docs/estimator/allocator.md).
CUDA_WORKSPACES_PER_STEP = 2


def alive_at_step(model, optimizer, workspace: int = 0, paged: bool = False) -> list[tuple[str, Any]]:
    """What a measured step starts with, by category, in the order it was allocated on a GPU: the weights
    and buffers as model.to("cuda") makes them (Module._apply: children first, then a module's own
    parameters, then its buffers), cuBLAS's workspaces (the first forward's and the first backward's first
    matmul; `workspace` bytes each, 0 for none),
    gradients if any are kept, then the optimizer's state (made by the first step), "paged" where `paged`
    (a paged bitsandbytes optimizer on a GPU: `pages`). Ints are blocks without a tensor."""
    def load_order(module):
        for child in module.children():
            yield from load_order(child)
        for t in module._parameters.values():
            if t is not None:
                yield "params", t
                yield from (("params", q) for q in quantization_state(t))
        yield from (("buffers", t) for t in module._buffers.values() if t is not None)

    loaded = [(category, sharded.local(t)) for category, t in load_order(model)]
    grads = [("grads", sharded.local(t.grad)) for category, t in load_order(model)
             if category == "params" and getattr(t, "grad", None) is not None]
    # bitsandbytes gives every parameter's state the same quantization maps: each tensor once. A DTensor's
    # memory is its shard, torchao's low-bit state's its codes, scales and map.
    state = {id(t): ("paged" if paged and pages(p, t) else "optimizer", t)
             for p, s in (optimizer.state.items() if optimizer else ()) for v in s.values() for t in plain_tensors(v)}
    workspaces = [("workspace", workspace)] * (CUDA_WORKSPACES_PER_STEP if workspace else 0)
    return loaded + workspaces + grads + list(state.values())


def quantization_state(weight) -> list:
    """A bitsandbytes 4-bit weight's QuantState tensors, made on the device as it is quantized there: its
    block scales and code (and with double quantization their own scales, code and offset). They are
    neither parameters nor buffers, so a CPU job's tracker does not see them; a GPU's allocator does."""
    qs = getattr(weight, "quant_state", None)
    if qs is None:
        return []
    tensors = [qs.absmax, qs.code]
    if qs.nested:
        tensors += [qs.offset, qs.state2.absmax, qs.state2.code]
    return [t for t in tensors if isinstance(t, torch.Tensor)]


def alloc_conf() -> str | None:
    """This process's allocator settings, which the job will run with: c10's AllocatorConfig::instance
    reads PYTORCH_ALLOC_CONF, else the older PYTORCH_CUDA_ALLOC_CONF."""
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")


def tensor_reading(events: list[Event], categories: dict) -> LedgerReading:
    """The events read as the ledger reads a step (the same storages MemTracker counts, in tensor bytes):
    the peak and what it is made of, what is held for backward when backward starts (the largest over
    micro-batches), the gradients' and the optimizer state's own maxima."""
    sizes, live, peak, at_peak, held, most = {}, {}, 0, {}, 0, {"grads": 0, "optimizer": 0}
    for event in events:
        if event.is_block() and categories.get(event.key) == "workspace":
            continue  # a library's or a kernel's block, not a tensor: the allocator's reading counts it
        if event.kind == "alloc":
            sizes[event.key] = event.nbytes
            category = categories.get(event.key, "activations")
            live[category] = live.get(category, 0) + event.nbytes
            if sum(live.values()) > peak:
                peak, at_peak = sum(live.values()), dict(live)
            most = {k: max(v, live.get(k, 0)) for k, v in most.items()}
        elif event.kind in ("free", "free_requested"):  # a tensor's bytes end at its free, whatever the streams
            category = categories.get(event.key, "activations")
            live[category] -= sizes.pop(event.key)
        elif event.is_mark("backward"):
            held = max(held, live.get("activations", 0))
    return LedgerReading(peak_bytes=peak, breakdown=at_peak, activations_bytes=held, grads_bytes=most["grads"],
                         optimizer_bytes=most["optimizer"])


@dataclass(frozen=True)
class PagedIn:
    """Bytes of the tensors a step makes in each phase that a CPU pages in anew (per micro-batch in forward and
    backward): those over glibc's largest mmap threshold (measure/host_memory.py), fresh pages each time."""
    forward: float = 0.0
    backward: float = 0.0
    step: float = 0.0


def paged_in(events: list[Event], micro_batches: int) -> PagedIn:
    """What the recorded step pages in anew, phase by phase (what is alive before the step is not made here)."""
    from ..measure.host_memory import MMAP_THRESHOLD_MAX

    phase, out = None, {"forward": 0.0, "backward": 0.0, "step": 0.0}
    for event in events:
        if event.kind == "mark":
            phase = event.name
        elif event.kind == "alloc" and phase in out and event.nbytes > MMAP_THRESHOLD_MAX:
            out[phase] += event.nbytes / (micro_batches if phase != "step" else 1)
    return PagedIn(**out)


# The sizes packing_envelope replays the step's activations at: a fixed ladder of totals, STEPS_PER_OCTAVE
# rungs to each doubling, over the OCTAVES below the first rung at or above the step's own total (why 32:
# docs/estimator/allocator.md).
STEPS_PER_OCTAVE, OCTAVES = 32, 1


@dataclass
class AllocatorReading:
    """The allocator model's peaks for a step's recorded events (allocator_reading), on one GPU."""
    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated: whole allocator blocks
    peak_reserved_bytes: int  # max_memory_reserved: the caching allocator's segments
    reserved_upper_bytes: int  # the safe side of packing (capture.packing_envelope), never below peak reserved
    segments: int  # cudaMallocs, or expandable segments with mapped memory

    def to_dict(self) -> dict[str, Any]:
        """As estimate.json writes it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def allocator_reading(events: list[Event], categories: dict | None = None, conf: str | None = None,
                      ) -> AllocatorReading:
    """The allocator model's peaks for recorded events under `conf` (default: alloc_conf()), and with the
    blocks' categories the upper figure for reserved bytes (packing_envelope)."""
    options = Options.parse(alloc_conf() if conf is None else conf)
    reading = replay(events, options)
    upper = packing_envelope(events, categories, options) if categories is not None else reading.peak_reserved_bytes
    return AllocatorReading(peak_allocated_bytes=reading.peak_allocated_bytes,
                            peak_reserved_bytes=reading.peak_reserved_bytes,
                            reserved_upper_bytes=max(upper, reading.peak_reserved_bytes), segments=reading.segments)


def packing_envelope(events: list[Event], categories: dict, options: Options) -> int:
    """The most the allocator model reserves for this step with its activations (every block allocated
    as one, all scaled alike) totalling each rung of a fixed ladder, from an octave below the step's own
    total to the first rung at or above it; the rest as it is. Why: reserved bytes are not smooth in the
    step's sizes, and a run meets smaller steps than its largest (docs/estimator/allocator.md)."""
    scalable = [e.kind == "alloc" and categories.get(e.key, "activations") == "activations" for e in events]

    def scaled(fraction: float) -> list[Event]:
        return [e._replace(nbytes=max(1, int(e.nbytes * fraction))) if s else e for e, s in zip(events, scalable)]

    total = sum(e.nbytes for e, s in zip(events, scalable) if s)
    if total == 0:
        return replay(events, options).peak_reserved_bytes
    top = math.ceil(math.log2(total) * STEPS_PER_OCTAVE)
    rungs = range(top - STEPS_PER_OCTAVE * OCTAVES, top + 1)
    return max(replay(scaled(2 ** (k / STEPS_PER_OCTAVE) / total), options).peak_reserved_bytes for k in rungs)
