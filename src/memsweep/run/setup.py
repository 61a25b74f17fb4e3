"""The job's setup: what the technique modules write into, and the only thing the trainer reads.

`build_setup` is the one place a job's config becomes a setup: it copies in what the techniques need
from outside their own groups (device, batch size, processes, learning rate, the task, where the
model's parts are: structure.py), then each technique writes its own part. A technique never looks
at another group's config; where two interact, `rules.py` says so. Building a setup has no side effects.
"""
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from .structure import Structure


@dataclass
class Setup:
    # Inputs, set by build_setup from outside the technique groups.
    device: str  # "cpu" or "cuda"
    batch_size: int = 1  # effective: micro-batch x accumulation steps x processes
    world_size: int = 1  # ranks of the job: distributed.nodes x distributed.nproc
    lr: float = 1e-4
    task: str = "classification"  # schema.TaskName: LoRA's task type
    structure: Structure | None = None
    # What every group's option means (techniques.Techniques): what the estimator and reports read.
    techniques: Any = None
    # Keyword arguments of `from_pretrained` (dtype, attn_implementation, quantization_config, device_map).
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    # `transformers.TrainingArguments` fields.
    args: dict[str, Any] = field(default_factory=dict)
    # Applied to the loaded model, in order (freeze, LoRA, checkpointing...).
    model_transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    # Entered around every forward pass (saved-tensor hooks such as save_on_cpu).
    forward_contexts: list[Callable[[], AbstractContextManager]] = field(default_factory=list)
    # Mixed precision that memsweep applies itself where the engine would silently skip it
    # (Trainer/Accelerate ignore fp16 on the CPU): autocast dtype and a GradScaler.
    autocast_dtype: torch.dtype | None = None
    grad_scaler: bool = False
    group_by_length: bool = False
    micro_batch_size: int = 1
    accumulation_steps: int = 1
    # DeepSpeed and FSDP need torch.distributed even in one process (procenv makes a group of one).
    process_group: bool = False

    def transform(self, model):
        for fn in self.model_transforms:
            model = fn(model)
        return model


def build_setup(job, profile) -> Setup:
    """The setup of a composed job (schema.Config) on a resolved hardware profile."""
    from ..techniques import apply_all, traits_of
    from .structure import of_job

    setup = Setup(device=profile.device, batch_size=job.batch_size, world_size=job.distributed.world_size, lr=job.lr,
                task=job.task.name.value, structure=of_job(job), techniques=traits_of(job))
    apply_all(job, setup)
    return setup
