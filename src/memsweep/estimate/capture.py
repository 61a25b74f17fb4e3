"""The allocations and frees of a step run on fake tensors, in order, for the allocator model.

On a GPU every new tensor storage is one request to the caching allocator, and its death (the last
tensor or view on it gone) one free. `Recorder` is a TorchDispatchMode, entered inside the
FakeTensorMode, that sees the output of every op: a storage seen for the first time is an
allocation of its nbytes, and a weakref.finalize on it records the free. Storages keep their Python
object alive for as long as the storage lives (PyTorch preserves it), which is also how MemTracker
sees frees: the two count the same storages. Storages made before recording (the weights) are
recorded when the Recorder is entered with them, or else when an op first reads them.

Not seen by the dispatch mode, so added by hand: the scratch a CUDA kernel allocates and frees inside
its op (scratch.py: a reduction's staging buffer), cuBLAS's workspaces, which PyTorch allocates through
the caching allocator at a handle's first matmul and keeps (cublas_workspace_bytes): one for the
training thread and one for the autograd engine's device thread, which runs backward with a cuBLAS
handle of its own (CUDA_WORKSPACES_PER_STEP), and Storage.resize_,
with which FSDP frees and re-allocates its unsharded parameters in place (patched while recording, as
MemTracker does: a resize frees the storage's block and allocates one of the new size). Not seen at
all: the CUDA context (the profile's overhead) and cuDNN's own workspaces.

Every block has a category, the ledger's names: params, buffers and optimizer for what the step starts
with, grads once backward has made them (`tag_grads`), temp for what the optimizer step allocates,
activations for the rest, workspace for cuBLAS's and a kernel's scratch (not tensors: the ledger does not
count them);
("mark", name) events say where the step is (forward, backward, step, end); ("grad", name, key) events,
where asked (`grad_made`), when each parameter's gradient was accumulated.
So the events can be adjusted by category (adjust.py) and read as the ledger reads a step
(`tensor_reading`: the same storages MemTracker counts) or as the GPU's allocator sees them.
"""
import itertools
import math
import os
import re
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from ..measure.optimizer_state import plain_tensors
from . import scratch, sharded
from .allocator import BLOCK_EVENTS, Options, replay


class Recorder(TorchDispatchMode):
    """Records ("alloc", key, nbytes) / ("free", key) / ("mark", name) events in `self.events`, as
    allocator.replay takes them, and each block's category in `self.categories`."""

    def __init__(self, tensors=()):
        super().__init__()
        # each CUDA reduction's scratch, recorded as 0-byte placeholders: {staging key: (shape, dims, acc,
        # semaphore key)}, sized per GPU by scratch.sized (one trace serves GPUs of different SM counts)
        self.reductions: dict = {}
        # the keys of the library workspaces seeded below (cuBLAS's), which a trace resizes per GPU
        self.workspaces: list[str] = []
        self.events: list[tuple] = []
        # alive before recording, allocated first in this order: tensors, ints (a block no tensor stands
        # for: a library workspace), or (category, either) pairs
        self.seed = [t if isinstance(t, tuple) else ("params", t) for t in tensors]
        self.seen = WeakIdKeyDictionary()  # storage -> [its block's key, or None]; holds no storage alive
        self.early = WeakIdKeyDictionary()  # storages made before the step: see `outside`
        self.finalizers: list[weakref.finalize] = []
        self.keys = itertools.count()
        self.categories: dict = {}  # block key -> category
        self.phase = "activations"  # the category of what is allocated now
        self.resize = None

    def __enter__(self):
        for n, (category, t) in enumerate(self.seed):
            if isinstance(t, int):
                self.events.append(("alloc", f"block{n}", t))
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
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                self.early[t.untyped_storage()] = True

    def see(self, t, category=None) -> None:
        # a wrapper subclass (FSDP's DTensor) holds no memory of its own: its inner tensors do, and
        # they are seen when its own dispatch runs the op on them
        if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t):
            self.see_storage(t.untyped_storage(), category)

    def see_storage(self, storage, category=None) -> list:
        if storage not in self.seen:
            self.seen[storage] = block = [None]
            self.allocate(block, storage.nbytes(), category)
            self.finalizers.append(weakref.finalize(storage, self.release, block))
        return self.seen[storage]

    def allocate(self, block: list, nbytes: int, category=None) -> None:
        if nbytes:  # an empty storage holds no block (the allocator returns no memory for 0 bytes)
            block[0] = next(self.keys)
            self.events.append(("alloc", block[0], nbytes))
            self.categories[block[0]] = category or self.phase

    def mark(self, name: str) -> None:
        """Where the step is: forward, backward, step (the optimizer's: what it allocates is temp), end."""
        self.events.append(("mark", name))
        self.phase = "temp" if name == "step" else "activations"

    def tag(self, t, category: str) -> None:
        """Give the block holding `t` a category (a gradient once backward has made it)."""
        block = self.seen.get(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
        if block is not None and block[0] is not None:
            self.categories[block[0]] = category

    def tag_grads(self, model) -> None:
        for p in model.parameters():
            if p.grad is not None:
                self.tag(sharded.local(p.grad), "grads")

    def grad_made(self, name: str, grad) -> None:
        """A parameter's gradient accumulated (its post-accumulate-grad hook, where DeepSpeed's own hook
        runs): ("grad", name, the block holding it), for adjust.py's ZeRO walk (zero.py)."""
        block = self.seen.get(grad.untyped_storage())
        self.events.append(("grad", name, block[0] if block else None))

    def release(self, block: list) -> None:
        if block[0] is not None:
            self.events.append(("free", block[0]))
            block[0] = None

    def resized(self, storage) -> None:
        if storage not in self.seen:
            self.see_storage(storage)  # first seen now, at its new size
            return
        block = self.seen[storage]
        self.release(block)
        self.allocate(block, storage.nbytes())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:  # made before recording and not given to __init__
            if not (self.early and isinstance(t, torch.Tensor) and t.untyped_storage() in self.early):
                self.see(t)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            self.see(t)
        spec = scratch.op_reduction(func, args, kwargs)  # a GPU's scratch, whatever device the fakes are on
        if spec is not None:
            self.reduction(spec)
        return out

    def reduction(self, spec: tuple) -> None:
        """The reduction kernel's staging buffer and semaphores: allocated after its output, freed (the
        semaphores first) before the op returns."""
        staging, semaphores = next(self.keys), next(self.keys)
        self.events += [("alloc", staging, 0), ("alloc", semaphores, 0), ("free", semaphores), ("free", staging)]
        self.categories.update({staging: "workspace", semaphores: "workspace"})
        self.reductions[staging] = (*spec, semaphores)


# PyTorch's default CUBLAS_WORKSPACE_CONFIG (CublasHandlePool.cpp, getChosenWorkspaceSize): 8,519,680
# bytes, and 32 MiB on compute capability 9.0 (Hopper), where cuBLAS asks for more. Both are the blocks
# memory snapshots show at the first matmul: a public one's two 8,519,680-byte blocks, and two
# 33,554,432-byte blocks in a bert-base step on an H200 with torch 2.11 (benchmarks/GPU.md).
DEFAULT_WORKSPACE_CONFIG = ":4096:2:16:8"
HOPPER_WORKSPACE_CONFIG = ":4096:8"


def cublas_workspace_bytes(compute_capability: float | None = None) -> int:
    """cuBLAS's workspace for the training stream: CUBLAS_WORKSPACE_CONFIG's ":KiB:count" pairs, else
    PyTorch's default for the GPU's compute capability."""
    default = HOPPER_WORKSPACE_CONFIG if compute_capability == 9.0 else DEFAULT_WORKSPACE_CONFIG
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", default)
    pairs = re.findall(r":(\d+):(\d+)", config)
    return sum(int(kib) * 1024 * int(count) for kib, count in pairs)


# CublasHandlePool.cpp hands each thread its own cuBLAS handle (a thread-local pool) and keeps one
# workspace per (handle, stream) pair (cublas_handle_stream_to_workspace); the autograd engine runs a
# GPU's backward on a device thread of its own (torch/csrc/autograd/engine.cpp), so a training step
# holds two workspaces: the forward's and backward's. A public snapshot of a steady training step
# (tests/snapshots/wedsonlin_medium_128_training.json) starts with exactly two 8,519,680-byte blocks
# that the step neither allocates nor frees.
CUDA_WORKSPACES_PER_STEP = 2


def alive_at_step(model, optimizer, workspace: int = 0) -> list[tuple[str, Any]]:
    """What a measured step starts with, by category, in the order it was allocated on a GPU: the weights
    and buffers as model.to("cuda") makes them (Module._apply: children first, then a module's own
    parameters, then its buffers), cuBLAS's workspaces (the first forward's and the first backward's first
    matmul; `workspace` bytes each, 0 for none),
    gradients if any are kept, then the optimizer's state (made by the first step). Ints are blocks
    without a tensor."""
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
    state = {id(t): ("optimizer", t) for s in (optimizer.state.values() if optimizer else ())
             for v in s.values() for t in plain_tensors(v)}
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


def tensor_reading(events, categories: dict) -> dict[str, Any]:
    """The events read as the ledger reads a step (the same storages MemTracker counts, in tensor bytes):
    the peak and what it is made of, what is held for backward when backward starts (the largest over
    micro-batches), the gradients' and the optimizer state's own maxima."""
    sizes, live, peak, at_peak, held, most = {}, {}, 0, {}, 0, {"grads": 0, "optimizer": 0}
    for event in events:
        if event[0] in BLOCK_EVENTS and categories.get(event[1]) == "workspace":
            continue  # a library's or a kernel's block, not a tensor: the allocator's reading counts it
        if event[0] == "alloc":
            sizes[event[1]] = event[2]
            category = categories.get(event[1], "activations")
            live[category] = live.get(category, 0) + event[2]
            if sum(live.values()) > peak:
                peak, at_peak = sum(live.values()), dict(live)
            most = {k: max(v, live.get(k, 0)) for k, v in most.items()}
        elif event[0] in ("free", "free_requested"):  # a tensor's bytes end at its free, whatever the streams
            category = categories.get(event[1], "activations")
            live[category] -= sizes.pop(event[1])
        elif event == ("mark", "backward"):
            held = max(held, live.get("activations", 0))
    return {"peak_bytes": peak, "breakdown": at_peak, "activations_bytes": held, "grads_bytes": most["grads"],
            "optimizer_bytes": most["optimizer"]}


def paged_in(events, micro_batches: int) -> dict[str, float]:
    """The bytes of the tensors made in each phase of the step (per micro-batch in forward and backward) that a
    CPU pages in anew: those over glibc's largest mmap threshold (measure/host_memory.py), fresh pages each time."""
    from ..measure.host_memory import MMAP_THRESHOLD_MAX

    phase, out = None, {"forward": 0.0, "backward": 0.0, "step": 0.0}  # what is alive before: not made here
    for event in events:
        if event[0] == "mark":
            phase = event[1]
        elif event[0] == "alloc" and phase in out and event[2] > MMAP_THRESHOLD_MAX:
            out[phase] += event[2] / (micro_batches if phase != "step" else 1)
    return out


# The sizes packing_envelope replays the step's activations at: a fixed ladder of totals, STEPS_PER_OCTAVE
# rungs to each doubling, over the OCTAVES below the first rung at or above the step's own total. Rungs
# 2.2 % apart: on tests/test_packing.py's synthetic step, rungs 9 % apart (8 to the octave) passed over a
# band of sizes where the one-step replay reserves more than anywhere above it, 32 did not.
STEPS_PER_OCTAVE, OCTAVES = 32, 1


def allocator_reading(events, categories: dict | None = None, conf: str | None = None) -> dict[str, Any]:
    """The allocator model's peaks for recorded events under `conf` (default: alloc_conf()), and with the
    blocks' categories the upper figure for reserved bytes (packing_envelope)."""
    options = Options.parse(alloc_conf() if conf is None else conf)
    reading = replay(events, options)
    upper = packing_envelope(events, categories, options) if categories is not None else reading.peak_reserved_bytes
    return {"peak_allocated_bytes": reading.peak_allocated_bytes, "peak_reserved_bytes": reading.peak_reserved_bytes,
            "reserved_upper_bytes": max(upper, reading.peak_reserved_bytes), "segments": reading.segments}


def packing_envelope(events, categories: dict, options: Options) -> int:
    """The most the allocator model reserves for this step with its activations (every block allocated
    as one, all scaled alike) totalling each rung of a fixed ladder, from an octave below the step's own
    total to the first rung at or above it; the weights, gradients, optimizer state and workspaces as they
    are.

    Why: what the caching allocator reserves hinges on whether a block freed earlier in the step happens to
    fit a later request (best fit, splitting only a rest above 1 MiB in the large pool), so it is not smooth
    in the step's sizes: a step a little smaller can reserve more than a larger one. A run meets smaller
    steps than its largest (data padded to each batch's longest, a short last batch), and what they reserve
    stays reserved. The rungs are fixed (powers of 2^(1/32) bytes), not fractions of the step: where the
    activations grow in proportion to the micro-batch or the sequence, a larger step replays the same
    scaled steps as a smaller one and more above them (leaving out only rungs an octave down, which
    reserve the least), so its figure does not fall with the step's size; tests/test_packing.py checks
    it over a grid of real estimates."""
    scalable = [e[0] == "alloc" and categories.get(e[1], "activations") == "activations" for e in events]

    def scaled(fraction: float) -> list:
        return [("alloc", e[1], max(1, int(e[2] * fraction))) if s else e for e, s in zip(events, scalable)]

    total = sum(e[2] for e, s in zip(events, scalable) if s)
    if total == 0:
        return replay(events, options).peak_reserved_bytes
    top = math.ceil(math.log2(total) * STEPS_PER_OCTAVE)
    rungs = range(top - STEPS_PER_OCTAVE * OCTAVES, top + 1)
    return max(replay(scaled(2 ** (k / STEPS_PER_OCTAVE) / total), options).peak_reserved_bytes for k in rungs)
