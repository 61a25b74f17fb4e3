"""offload: none | activations (tensors saved for backward are kept in host memory)."""
import functools
from dataclasses import dataclass

import torch

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    activations: bool  # torch.autograd.graph.save_on_cpu around every forward


def traits(cfg) -> Traits:
    return Traits(activations=is_on(cfg) and cfg.name == "activations")


def apply(cfg, plan) -> None:
    if traits(cfg).activations:
        plan.forward_contexts.append(
            functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=plan.device == "cuda"))
