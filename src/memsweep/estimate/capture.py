"""The allocations and frees of a step run on fake tensors, in order, for the allocator model.

On a GPU every new tensor storage is one request to the caching allocator, and its death (the last
tensor or view on it gone) one free. `Recorder` is a TorchDispatchMode, entered inside the
FakeTensorMode, that sees the output of every op: a storage seen for the first time is an
allocation of its nbytes, and a weakref.finalize on it records the free. Storages keep their Python
object alive for as long as the storage lives (PyTorch preserves it), which is also how MemTracker
sees frees: the two count the same storages. Storages made before recording (the weights) are
recorded when the Recorder is entered with them, or else when an op first reads them.

Not seen by the dispatch mode, so added by hand: cuBLAS's workspace, which PyTorch allocates through
the caching allocator at the first matmul and keeps (cublas_workspace_bytes), and Storage.resize_,
with which FSDP frees and re-allocates its unsharded parameters in place (patched while recording, as
MemTracker does: a resize frees the storage's block and allocates one of the new size). Not seen at
all: the CUDA context (the profile's overhead) and cuDNN's own workspaces.
"""
import itertools
import os
import re
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from . import sharded
from .allocator import Options, replay


class Recorder(TorchDispatchMode):
    """Records ("alloc", key, nbytes) / ("free", key) events in `self.events`, as allocator.replay takes them."""

    def __init__(self, tensors=()):
        super().__init__()
        self.events: list[tuple] = []
        self.seed = list(tensors)  # alive before recording: allocated first, in this order
        self.seen = WeakIdKeyDictionary()  # storage -> [its block's key, or None]; holds no storage alive
        self.finalizers: list[weakref.finalize] = []
        self.keys = itertools.count()
        self.resize = None

    def __enter__(self):
        for n, t in enumerate(self.seed):
            if isinstance(t, int):  # a block no tensor stands for (a library workspace), alive throughout
                self.events.append(("alloc", f"block{n}", t))
            else:
                self.see(t)
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

    def see(self, t) -> None:
        # a wrapper subclass (FSDP's DTensor) holds no memory of its own: its inner tensors do, and
        # they are seen when its own dispatch runs the op on them
        if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t):
            self.see_storage(t.untyped_storage())

    def see_storage(self, storage) -> list:
        if storage not in self.seen:
            self.seen[storage] = block = [None]
            self.allocate(block, storage.nbytes())
            self.finalizers.append(weakref.finalize(storage, self.release, block))
        return self.seen[storage]

    def allocate(self, block: list, nbytes: int) -> None:
        if nbytes:  # an empty storage holds no block (the allocator returns no memory for 0 bytes)
            block[0] = next(self.keys)
            self.events.append(("alloc", block[0], nbytes))

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
            self.see(t)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            self.see(t)
        return out


def cublas_workspace_bytes() -> int:
    """cuBLAS's workspace for the training stream: CUBLAS_WORKSPACE_CONFIG's ":KiB:count" pairs, by
    default ":4096:2:16:8" (PyTorch's CublasHandlePool.cpp), 8,519,680 bytes: the block a memory
    snapshot shows after the first matmul. Hopper GPUs get a larger default, not modelled here."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    pairs = re.findall(r":(\d+):(\d+)", config)
    return sum(int(kib) * 1024 * int(count) for kib, count in pairs)


def alive_at_step(model, optimizer) -> list:
    """What a measured step starts with on a GPU, in the order it was allocated: the weights and
    buffers as model.to("cuda") makes them (Module._apply: children first, then a module's own
    parameters, then its buffers), cuBLAS's workspace (the first forward's first matmul), gradients if
    any are kept, then the optimizer's state (made by the first step). Ints are blocks without a tensor."""
    def load_order(module):
        for child in module.children():
            yield from load_order(child)
        for t in module._parameters.values():
            if t is not None:
                yield t
                yield from quantization_state(t)
        yield from (t for t in module._buffers.values() if t is not None)

    loaded = list(load_order(model))
    params = [sharded.local(t) for t in loaded]
    grads = [sharded.local(p.grad) for p in loaded if getattr(p, "grad", None) is not None]
    # bitsandbytes gives every parameter's state the same quantization maps: each tensor once
    state = list({id(v): sharded.local(v) for s in optimizer.state.values() for v in s.values()
                  if isinstance(v, torch.Tensor)}.values())
    return params + [cublas_workspace_bytes()] + grads + state


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


def allocator_reading(events, conf: str | None = None) -> dict[str, Any]:
    """The allocator model's peaks for recorded events under `conf` (default: alloc_conf())."""
    options = Options.parse(alloc_conf() if conf is None else conf)
    reading = replay(events, options)
    return {"peak_allocated_bytes": reading.peak_allocated_bytes, "peak_reserved_bytes": reading.peak_reserved_bytes,
            "segments": reading.segments}
