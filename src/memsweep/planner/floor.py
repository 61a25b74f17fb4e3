"""What a combination holds at its optimizer step whatever its micro-batch, found without a trace of the step:
every weight, a gradient of each trainable weight and the optimizer's state. The step needs all three at once
(optimizer.step reads each gradient and updates the state of each trainable weight), so their sum plus the
CUDA context is a floor under the device memory the trace would predict (the allocator reserves at least what
is allocated). A combination whose floor exceeds a GPU's capacity does not fit it at any micro-batch, and is
listed so without a trace.

The three are measured on the job's own model, not computed from bytes per parameter: the model as the trace
builds it (meta.traced_model, on fake tensors, with bitsandbytes' 4- or 8-bit weights quantized) and the
optimizer Trainer would build on it (step.build_optimizer), given a gradient per trainable weight and stepped
once so it makes its state: the bytes of 8-bit state, Adafactor's factored moments and bitsandbytes' 32-bit
state for embeddings and small tensors come from the libraries themselves.
"""
import dataclasses
from dataclasses import dataclass

import torch

from ..config.schema import Config, HardwareConf
from ..estimate.core import GIB, capacity_bytes
from ..estimate.meta import traced_model
from ..estimate.step import build_optimizer, optimizer_spec, state_bytes
from ..estimate.trace import fake_job
from ..run.setup import build_setup
from .space import Combination, Placement


@dataclass(frozen=True)
class Floor:
    """What the GPU holds at the optimizer step whatever the micro-batch: every weight, a gradient per trainable
    weight and the optimizer's state; None for a part that lives on the host (offload)."""
    weights: int
    grads: int | None
    optimizer: int | None

    def parts(self) -> dict[str, int]:
        """{part: bytes} of what stays on the GPU, in the order the reason lists them."""
        held = {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer}
        return {name: size for name, size in held.items() if size is not None}


def held_bytes(job: Config, profile: HardwareConf) -> Floor:
    """Bytes of every weight, of a gradient per trainable weight and of the optimizer's state after one step,
    on the job's model as the trace builds it."""
    setup = build_setup(job, profile)
    model = traced_model(job, setup)
    spec = optimizer_spec(setup, model)
    with fake_job(job, setup, profile, model) as model:
        weights = sum(p.untyped_storage().nbytes() for p in model.parameters())  # a tied weight once
        trainable = [p for p in model.parameters() if p.requires_grad]
        for p in trainable:
            p.grad = torch.empty_like(p)
        optimizer = build_optimizer(setup, model, profile, spec)
        optimizer.step()
        return Floor(weights=weights, grads=sum(p.grad.untyped_storage().nbytes() for p in trainable),
                     optimizer=state_bytes(optimizer))


def key(combo: Combination) -> tuple:
    """What the floor depends on: the model's weights (precision, LoRA / quantization) and the optimizer;
    not checkpointing or the micro-batch."""
    return ("floor", combo.precision, combo.optim, combo.lora)


def sharded(placement: Placement) -> bool:
    """No floor where the state is sharded: DeepSpeed and FSDP2 keep their own dtypes and partitions, which
    the unsharded model does not show."""
    return placement.deepspeed != "none" or placement.fsdp != "none"


def on_device(held: Floor, placement: Placement) -> Floor:
    """The part of the floor the GPU holds: offload=optimizer keeps the state on the host, optimizer_and_grads
    the gradients too (techniques/offload.py)."""
    if placement.offload == "optimizer":
        return dataclasses.replace(held, optimizer=None)
    if placement.offload == "optimizer_and_grads":
        return dataclasses.replace(held, optimizer=None, grads=None)
    return held


def too_large(held: Floor, profile: HardwareConf) -> str:
    """The reason a GPU cannot hold the floor, or "" where it can (or has no stated capacity)."""
    capacity = capacity_bytes(profile)
    context = int(profile.cuda_context_gib * GIB) if profile.device == "cuda" else 0
    total = sum(held.parts().values()) + context
    if capacity is None or total <= capacity:
        return ""
    parts = " + ".join(f"{name} {size / GIB:.2f}" for name, size in held.parts().items())
    return (f"not traced: {parts} + CUDA context {context / GIB:.2f} = {total / GIB:.2f} GiB, held at the optimizer "
            f"step whatever the micro-batch, exceed the {capacity / GIB:.2f} GiB")
