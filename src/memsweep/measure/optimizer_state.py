"""What an optimizer holds, read from the optimizer itself (MemTracker files everything allocated inside
`optimizer.step()` as optimizer state, temporaries included): its state's bytes, the weights it keeps
beside the model's (DeepSpeed's partitions), its kernel and learning rate. Through Accelerate's and
DeepSpeed's wrappers, and through wrapper tensors (FSDP2's DTensor, torchao's low-bit state)."""

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def inner_optimizer(optimizer):
    """The torch optimizer holding the state, under Accelerate's and DeepSpeed's wrappers."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def on_device(optimizer):
    """The optimizer whose state lives on the job's device: the inner one or, under torchao's
    CPUOffloadOptimizer (no state of its own: one host optimizer per tensor, `optim_dict`), the one stepping
    the tensors it leaves on the device (`d_opt`; None when it leaves none)."""
    inner = inner_optimizer(optimizer)
    return inner.d_opt if hasattr(inner, "optim_dict") else inner


# DeepSpeed's fp32 master partitions: stage_1_and_2.py and stage3.py (which hands them to the client
# optimizer only during its step); stage3.py's partitions of the model's weights (each parameter's
# ds_tensor is a view of them) and its gradient partitions (grad_partitions_flat_buffer), both made when
# the engine is built and held by every rank throughout
MASTER_WEIGHTS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp16_partitioned_groups_flat",
                  "grad_partitions_flat_buffer")


def own_weights(optimizer, model) -> list:
    """The tensors an optimizer holds that are not the model's (DeepSpeed's partitions, above), made before
    the step and held throughout it. MemTracker counts a tensor made before tracking only once it is given
    (track_external). A partition whose storage the model's weights already use (ZeRO-3 on one process:
    its parameters are views of their ds_tensor, partition_parameters.NoGatherHandle) is counted with them."""
    own, found = {id(p) for p in model.parameters()}, {}
    from torch.distributed.tensor import DTensor

    # FSDP's DTensor parameters hold no storage of their own (and DeepSpeed never shares one with them)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters() if p.numel() and not isinstance(p, DTensor)}
    while optimizer is not None:
        for name in MASTER_WEIGHTS:
            held = getattr(optimizer, name, None)
            held = [held] if torch.is_tensor(held) else held or []
            found.update((id(t), t) for t in held if torch.is_tensor(t))
        found.update((id(p), p) for group in getattr(optimizer, "param_groups", []) for p in group["params"])
        optimizer = getattr(optimizer, "optimizer", None)
    return [t for key, t in found.items() if key not in own and t.untyped_storage().data_ptr() not in storages]


def plain_tensors(value) -> list:
    """The tensors that hold memory under `value`: itself, or a wrapper subclass's inner tensors,
    recursively (a DTensor's local shard; torchao's low-bit optimizer state: codes, scales, map)."""
    if not torch.is_tensor(value):
        return []
    if is_traceable_wrapper_subclass(value):
        return [t for name in value.__tensor_flatten__()[0] for t in plain_tensors(getattr(value, name))]
    return [value]


def state_tensors(optimizer) -> list:
    """The plain tensors of the optimizer's state on the job's device, each storage once."""
    inner = on_device(optimizer)
    seen, found = set(), []
    for state in (inner.state.values() if inner is not None else ()):
        for value in state.values():
            for t in plain_tensors(value):  # FSDP2's DTensor: this process's shard
                if t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    found.append(t)
    return found


def paged(t) -> bool:
    """Whether bitsandbytes made this state tensor in unified memory (F.get_paged marks it `is_paged`): on
    the GPU, but outside PyTorch's caching allocator, so in none of its counters."""
    return getattr(t, "is_paged", False)


def optimizer_state_bytes(optimizer) -> int:
    """The bytes of optimizer state on the job's device that PyTorch's allocator holds, each storage once
    (bitsandbytes' paged state is in `paged_state_bytes`, as in the estimate)."""
    return sum(t.untyped_storage().nbytes() for t in state_tensors(optimizer) if not paged(t))


def paged_state_bytes(optimizer) -> int:
    """The bytes of bitsandbytes' paged optimizer state: on the GPU, outside the allocator's counters."""
    return sum(t.untyped_storage().nbytes() for t in state_tensors(optimizer) if paged(t))


def peak_learning_rate(optimizer) -> float | None:
    """The learning rate the optimizer was given: its schedule's start (`initial_lr`, set by the scheduler)
    or, without a scheduler, its current one."""
    groups = getattr(inner_optimizer(optimizer), "param_groups", None)
    if not groups:
        return None
    return float(groups[0].get("initial_lr", groups[0]["lr"]))


def optimizer_kernel(optimizer) -> str | None:
    """Which of torch's implementations the optimizer steps with: fused, foreach or for-loop (the
    single-tensor loop); None for optimizers outside torch.optim (bitsandbytes, Adafactor, DeepSpeed)."""
    defaults = getattr(inner_optimizer(optimizer), "defaults", {})
    if "fused" not in defaults and "foreach" not in defaults:
        return None
    if defaults.get("fused"):
        return "fused"
    # foreach=None means torch's default: foreach on CUDA tensors, the for-loop elsewhere
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in inner_optimizer(optimizer).param_groups for p in g["params"]]
    foreach = defaults.get("foreach")
    if foreach is None:
        foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)[1]
    return "foreach" if foreach else "for-loop"
