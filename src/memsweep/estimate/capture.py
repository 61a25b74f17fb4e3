"""The allocations and frees of a step run on fake tensors, in order, for the allocator model.

On a GPU every new tensor storage is one request to the caching allocator, and its death (the last
tensor or view on it gone) one free. `Recorder` is a TorchDispatchMode, entered inside the
FakeTensorMode, that sees the output of every op: a storage seen for the first time is an
allocation of its nbytes, and a weakref.finalize on it records the free. Storages keep their Python
object alive for as long as the storage lives (PyTorch preserves it), which is also how MemTracker
sees frees: the two count the same storages. Storages made before recording (the weights) are
recorded when the Recorder is entered with them, or else when an op first reads them.

Not seen by the dispatch mode, so added by hand: cuBLAS's workspace, which PyTorch allocates through
the caching allocator at the first matmul and keeps (cublas_workspace_bytes). Not seen at all: the
CUDA context (the profile's overhead), cuDNN's own workspaces and Storage.resize_ (used by FSDP,
which the trace does not run).
"""
import os
import re
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from .allocator import Options, replay


class Recorder(TorchDispatchMode):
    """Records ("alloc", key, nbytes) / ("free", key) events in `self.events`, as allocator.replay takes them."""

    def __init__(self, tensors=()):
        super().__init__()
        self.events: list[tuple] = []
        self.seed = list(tensors)  # alive before recording: allocated first, in this order
        self.seen = WeakIdKeyDictionary()  # storage -> key; holds no storage alive
        self.finalizers: list[weakref.finalize] = []

    def __enter__(self):
        for n, t in enumerate(self.seed):
            if isinstance(t, int):  # a block no tensor stands for (a library workspace), alive throughout
                self.events.append(("alloc", f"block{n}", t))
            else:
                self.see(t)
        self.seed = []
        return super().__enter__()

    def __exit__(self, *exc):
        # what dies after recording is not part of it
        for f in self.finalizers:
            f.detach()
        return super().__exit__(*exc)

    def see(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        if storage in self.seen:
            return
        key = len(self.finalizers)  # one finalizer per storage seen: a new key each time
        self.seen[storage] = key
        self.events.append(("alloc", key, storage.nbytes()))
        self.finalizers.append(weakref.finalize(storage, self.events.append, ("free", key)))

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

    params = list(load_order(model))
    grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
    # bitsandbytes gives every parameter's state the same quantization maps: each tensor once
    state = list({id(v): v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)}.values())
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
