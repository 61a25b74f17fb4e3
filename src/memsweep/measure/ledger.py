"""Measure a running job: the memory ledger of one real training step, and the `effective` audit.

The ledger uses torch's MemTracker (torch.distributed._tools.mem_tracker), which attributes every
live tensor to parameters, buffers, gradients, activations, temporaries or optimizer state. Two of
its quirks are handled here: it cannot hook frozen parameters, and it counts every allocation made
inside `optimizer.step()` as optimizer state (temporaries included) — the true state is read from
the optimizer itself and the rest is reported as temporaries.
"""
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.distributed._tools import mod_tracker
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import TrainerCallback

from . import host_memory
from .optimizer_state import (
    inner_optimizer,
    on_device,
    optimizer_kernel,
    optimizer_state_bytes,
    own_weights,
    paged_state_bytes,
    peak_learning_rate,
)

# MemTracker warns on every backward hook whose module was collected; nothing is lost.
warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)

CATEGORIES = {"Parameter": "params", "Buffer": "buffers", "Gradient": "grads", "Activation": "activations",
              "Temp": "temp", "Optstate": "optimizer", "Other": "other"}


class _NoHook:
    def remove(self) -> None:
        pass


class LedgerTracker(MemTracker):
    """MemTracker that skips frozen parameters' grad hooks, and keeps only the device peak and each
    category's own maximum (not the per-module peaks)."""

    def __init__(self, root=None):
        super().__init__()
        self.category_max: dict[str, int] = {}
        self.root = root  # the model Trainer calls; its forward's end is where activations are counted
        self.saved_activations = 0

    def __enter__(self) -> "LedgerTracker":
        # ModTracker puts multi-grad hooks on module inputs and outputs and drops their handles; each hook's
        # closure holds the autograd nodes it is on (register_multi_grad_hook's grad_fns), a cycle through
        # C++ that gc cannot collect, and the nodes hold the parameters. Unremoved, every job of an
        # in-process sweep kept its model (on a GPU, in the next jobs' max_memory_allocated).
        self._multi_grad_handles: list = []
        self._register_multi_grad_hook = register = mod_tracker.register_multi_grad_hook

        def recording(*args, **kwargs):
            self._multi_grad_handles.append(handle := register(*args, **kwargs))
            return handle

        mod_tracker.register_multi_grad_hook = recording
        return super().__enter__()

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        mod_tracker.register_multi_grad_hook = self._register_multi_grad_hook
        for handle in self._multi_grad_handles:  # the step's backward has run: they have nothing left to do
            handle.remove()
        self._multi_grad_handles.clear()

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        # a frozen parameter, or one FSDP1 has made a view of its flat parameter for the forward (not a leaf:
        # torch refuses a post-accumulate-grad hook on it): nothing of its own to hook
        for p in module.parameters():
            if (not p.requires_grad or not p.is_leaf) and p not in self._param_to_grad_hook_handles:
                self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())  # "already hooked"
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _pre_fw_hook(self, module, inputs) -> None:
        # Each micro-batch of an accumulated step calls the root module again, which MemTracker's
        # per-module stats refuse; those stats are not used here, so start them afresh instead.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            parents = set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)}
            if parents == {"Global"}:
                self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        super()._post_fw_hook(module, inputs, outputs)
        if module is self.root and not self._mod_tracker.is_bw:
            held = sum(snap.get("Activation", 0) for snap in self._curr_mem_snap.values())
            self.saved_activations = max(self.saved_activations, held)

    def _update_peak_stats(self, peak_state) -> None:
        # Called on every op. The stock method also keeps a peak per module, deep-copying snapshots
        # as memory grows: ~28 s for one MiniLM step. Only the device peak and each category's own
        # maximum are needed here (private fields of the pinned torch 2.13; tests/test_measure.py guards them).
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)
            for key, value in snap.items():
                if value > self.category_max.get(key, 0):
                    self.category_max[key] = value


def eager():
    """Compiled code runs eager, in the ledger step and in the estimator's trace of it. Dynamo compiles
    nothing under a dispatch mode (the tracker's, the trace's recorder), where code compiled with
    fullgraph=True (torchao's optimizer step) raises; under fake tensors alone, inductor's kernels would be
    called on fake tensors (a crash)."""
    return torch.compiler.set_stance("force_eager")


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass
class Ledger:
    step: int
    seq_len: int
    peak_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)  # at the peak, sums to peak_bytes
    # Held for backward at the end of a forward pass (max over micro-batches): the usual meaning of
    # "activation memory". Recomputation of checkpointed layers in backward shows in the peak instead.
    activations_bytes: int = 0
    grads_bytes: int = 0  # the gradients' own maximum (at the peak they may be freed already)
    optimizer_bytes: int = 0  # true optimizer state
    compute_dtype: str | None = None
    micro_batch_size: int | None = None
    dataloader: dict[str, Any] = field(default_factory=dict)


class LedgerCallback(TrainerCallback):
    """Tracks optimizer step `step` (1-based) from its first micro-batch to the end of its optimizer step."""

    def __init__(self, step: int, seq_len: int, enabled: bool = True):
        self.step, self.seq_len, self.enabled = step, seq_len, enabled
        self.tracker: LedgerTracker | None = None
        self.ledger: Ledger | None = None
        self._hook = None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        if not self.enabled or state.global_step + 1 != self.step:
            return
        self.ledger = Ledger(step=self.step, seq_len=self.seq_len, dataloader=loader_settings(train_dataloader))
        self._hook = _first_linear(model).register_forward_hook(self._see_compute)
        self.tracker = LedgerTracker(root=model)
        held = [o for o in (on_device(optimizer),) if o is not None]
        self.tracker.track_external(model, *held, *own_weights(optimizer, model))
        self._eager = eager()
        self.tracker.__enter__()

    def _see_compute(self, module, inputs, output):
        if self.ledger.compute_dtype is None:
            self.ledger.compute_dtype = str(output.dtype).replace("torch.", "")
            self.ledger.micro_batch_size = int(output.shape[0])

    def close(self) -> None:
        """Leave the tracker if its step is open. A job that raises inside the ledger step (an OOM)
        never reaches on_step_end: the tracker would stay on torch's dispatch stack and hook every
        later job of the process (a sweep's next jobs)."""
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            self._eager.__exit__(None, None, None)
            self._hook.remove()
            self.tracker = None

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.tracker is None:
            return
        tracker = self.tracker
        self.close()
        for key, value in asdict(ledger_reading(tracker, optimizer_state_bytes(optimizer))).items():
            setattr(self.ledger, key, value)


@dataclass(frozen=True)
class LedgerReading:
    """What a step's ledger says: the device peak and what it is made of, the activations held for backward,
    the gradients' own maximum and the true optimizer state."""
    peak_bytes: int
    breakdown: dict[str, int]  # at the peak, sums to peak_bytes
    activations_bytes: int
    grads_bytes: int
    optimizer_bytes: int


def ledger_reading(tracker: LedgerTracker, state_bytes: int) -> LedgerReading:
    """What a tracked step's ledger says: the device peak and what it is made of (summing to it), the
    activations held for backward, the gradients' own maximum and the true optimizer state. MemTracker
    counts everything optimizer.step() allocates as optimizer state: beyond `state_bytes` (read off the
    optimizer itself) it is the step's temporaries. Real jobs and the estimator's trace both read it here."""
    snaps = tracker.get_tracker_snapshot("peak")
    # a GPU job's ledger is the GPU's: the host's tensors are tracked too (offload's copies, a host optimizer)
    on_gpu = [d for d in snaps if torch.device(d).type == "cuda"]
    device = on_gpu[0] if on_gpu else max(snaps, key=lambda d: snaps[d]["Total"])
    breakdown = {CATEGORIES[k]: v for k, v in snaps[device].items() if k in CATEGORIES}
    if breakdown.get("optimizer", 0) > state_bytes:
        breakdown["temp"] = breakdown.get("temp", 0) + breakdown["optimizer"] - state_bytes
        breakdown["optimizer"] = state_bytes
    return LedgerReading(peak_bytes=snaps[device]["Total"], breakdown=breakdown,
                         activations_bytes=tracker.saved_activations,
                         grads_bytes=tracker.category_max.get("Gradient", 0), optimizer_bytes=state_bytes)


def loader_settings(loader) -> dict[str, Any]:
    """What the DataLoader Trainer iterates really uses."""
    if loader is None:
        return {}
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", sampler)
    return {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor,
            "sampler": type(inner).__name__ if inner is not None else None}


def _first_linear(model) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__.startswith("Linear"):
            return module
    return model


def count_params(model) -> tuple[int, int]:
    """(trainable, total), counting 4-bit packed weights at their real number of values."""
    if hasattr(model, "get_nb_trainable_parameters"):
        return model.get_nb_trainable_parameters()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def checkpointed_layers(model) -> int:
    """Layers whose forward is recomputed in backward (transformers' GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(1 for m in model.modules()
               if isinstance(m, GradientCheckpointingLayer) and getattr(m, "gradient_checkpointing", False))


def fsdp1_audit(model) -> dict[str, Any] | None:
    """What FSDP1 (FullyShardedDataParallel, fsdp.version=1) sharded: its units and their flat parameters, this
    process's shards and the whole (None: no FSDP1 unit)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
    if not units:
        return None
    flat = [h.flat_param for u in units for h in ([u._handle] if u._handle is not None else [])]
    return {"version": 1, "units": len(units),
            "unit_classes": sorted({type(u.module).__name__ for u in units}),
            "flat_params": len(flat), "world_size": units[0].world_size,
            "local_numel": sum(f.numel() for f in flat),  # this process's shards, padding included
            "global_numel": sum(f._unpadded_unsharded_size.numel() for f in flat),
            "offload": units[0].cpu_offload.offload_params}


def fsdp_audit(model) -> dict[str, Any] | None:
    """What FSDP2 sharded, read off the model's FSDP units (None: no FSDP). Counted from the units'
    own records, not from `model.parameters()`, which shows unsharded copies between a forward and
    its backward. Uses FSDP2's private per-unit state (torch 2.13; tests/test_fsdp.py guards it)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return None
    # Modules sharded together (Accelerate's decoder tail: final norm + lm_head) are each an FSDPModule
    # of one shared state: each group counted once.
    groups = list({id(g): g for unit in units for g in unit._get_fsdp_state()._fsdp_param_groups}.values())
    managed = [fp for g in groups for fp in g.fsdp_params]
    param_dtypes = {str(g.mp_policy.param_dtype).replace("torch.", "") for g in groups if g.mp_policy.param_dtype}
    return {
        "version": 2,
        "units": len(units),
        "unit_classes": sorted({type(u).__name__.removeprefix("FSDP") for u in units}),
        # units that free their gathered parameters after forward (full_shard); none under shard_grad_op
        "resharded_after_forward": sum(g._reshard_after_forward for g in groups),
        "sharded_params": len(managed),
        "params": sum(1 for _ in model.parameters()),
        "world_size": managed[0].sharded_param.device_mesh.size() if managed else None,
        "local_numel": sum(fp.sharded_size.numel() for fp in managed),  # this process's shards
        "global_numel": sum(fp._orig_size.numel() for fp in managed),
        "offload": any(fp.offload_to_cpu for fp in managed),
        "mixed_precision_param_dtype": sorted(param_dtypes)[0] if param_dtypes else None,
    }


def effective(model, trainer, ledger: Ledger | None) -> dict[str, Any]:
    """What was in effect, observed on the running job (not copied from the config)."""
    params = list(model.parameters())
    dtypes: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).replace("torch.", "")
        dtypes[key] = dtypes.get(key, 0) + p.numel()
    trainable, total = count_params(model)
    optimizer = inner_optimizer(trainer.optimizer) if trainer.optimizer is not None else None
    engine = getattr(trainer, "model_wrapped", None)
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None
    return {
        "param_dtype": max(dtypes, key=dtypes.get) if dtypes else None,
        "param_dtypes": dtypes,
        "compute_dtype": ledger.compute_dtype if ledger else None,
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "optimizer_kernel": optimizer_kernel(optimizer) if optimizer is not None else None,
        "optimizer_state_bytes": optimizer_state_bytes(optimizer) if optimizer is not None else None,
        "paged_state_bytes": paged_state_bytes(optimizer) if optimizer is not None else None,
        "learning_rate": peak_learning_rate(optimizer) if optimizer is not None else None,
        "max_grad_norm": trainer.args.max_grad_norm,
        "trainable_params": trainable,
        "total_params": total,
        "frozen_params": sum(p.numel() for p in params if not p.requires_grad),
        "checkpointed_layers": checkpointed_layers(model),
        "accumulation_steps": trainer.args.gradient_accumulation_steps,
        "micro_batch_size": ledger.micro_batch_size if ledger else trainer.args.per_device_train_batch_size,
        "deepspeed_stage": stage,
        "fsdp": fsdp_audit(model) or fsdp1_audit(model),
        "lora_modules": sum(1 for m in model.modules() if hasattr(m, "lora_A") and len(m.lora_A) > 0),
        "grad_scaler": type(trainer.accelerator.scaler).__name__ if trainer.accelerator.scaler else None,
        "attention": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "compiled": type(trainer.model_wrapped).__name__ == "OptimizedModule" or hasattr(model, "_orig_mod"),
        "param_device": str(params[0].device) if params else None,
        "malloc_reuse": host_memory.in_effect(),
        "dataloader": ledger.dataloader if ledger else None,
    }
