"""offload: none | activations (tensors saved for backward kept in host memory) | optimizer (the optimizer's
state and step in host memory, torchao's CPUOffloadOptimizer, one GPU) | optimizer_and_grads (and each
gradient, once made)."""
import functools
from dataclasses import dataclass

import torch

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    activations: bool  # torch.autograd.graph.save_on_cpu around every forward
    optimizer: bool  # the optimizer's state and step on the host (CPUOffloadOptimizer)
    grads: bool  # each gradient freed on the device once copied to the host (offload_gradients=True)


def traits(cfg) -> Traits:
    name = cfg.name if is_on(cfg) else None
    return Traits(activations=name == "activations", optimizer=name in ("optimizer", "optimizer_and_grads"),
                  grads=name == "optimizer_and_grads")


def apply(cfg, setup) -> None:
    t = traits(cfg)
    if t.activations:
        setup.forward_contexts.append(
            functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=setup.device == "cuda"))
    if t.optimizer:
        # The host optimizer steps the gradients copied as backward makes them, before Trainer would clip
        # the device's: clipping would change nothing, so it is off (effective.max_grad_norm says so).
        setup.args["max_grad_norm"] = 0.0


def offloaded_optimizer(cls, groups, kwargs, grads: bool):
    """torchao's CPUOffloadOptimizer around the optimizer Trainer chose: every trainable tensor of 4,096
    values or more gets a pinned host copy, its gradient is copied there by a hook as backward makes it
    (and, with `grads`, freed on the device), the host optimizer steps it and the weights are copied back;
    smaller tensors stay on the device with their own optimizer."""
    from torchao.optim import CPUOffloadOptimizer

    return CPUOffloadOptimizer(groups, optimizer_class=cls, offload_gradients=grads, **kwargs)


def release(model) -> None:
    """Drop the hooks CPUOffloadOptimizer left on the model's parameters, once the job is done with them.
    Each hook's closure holds the optimizer, whose maps hold the parameters: a cycle through the tensors'
    C++ hook lists that gc does not follow, so without this every offloaded job of an in-process sweep kept
    its weights on the GPU for the rest of the process (0.44 GB of a bert-base job, seen on an H200)."""
    for p in model.parameters():
        hooks = getattr(p, "_post_accumulate_grad_hooks", None)
        if hooks:
            hooks.clear()
