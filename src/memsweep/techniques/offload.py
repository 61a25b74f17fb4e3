"""offload: none | activations (tensors saved for backward are kept in host memory)."""
import functools

import torch


def apply(cfg, plan) -> None:
    if cfg.activations:
        plan.forward_contexts.append(
            functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=plan.device == "cuda"))
