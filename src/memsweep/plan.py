"""The job plan: what the technique modules write into, and the only thing the trainer reads.

Each field is one way a technique can act on a job. A technique never looks at another technique's
config; where two interact, `rules.py` says so.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

import torch


@dataclass
class Plan:
    device: str  # "cpu" or "cuda"
    # Keyword arguments of `from_pretrained` (dtype, attn_implementation, quantization_config, device_map).
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    # `transformers.TrainingArguments` fields.
    args: dict[str, Any] = field(default_factory=dict)
    # Applied to the loaded model, in order (freeze, LoRA, checkpointing...).
    model_transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    # Entered around every forward pass (saved-tensor hooks such as save_on_cpu).
    forward_contexts: list[Callable[[], ContextManager]] = field(default_factory=list)
    # Mixed precision that memsweep applies itself where the engine would silently skip it
    # (Trainer/Accelerate ignore fp16 on the CPU): autocast dtype and a GradScaler.
    autocast_dtype: Optional[torch.dtype] = None
    grad_scaler: bool = False
    group_by_length: bool = False
    micro_batch_size: int = 1
    accumulation_steps: int = 1

    def transform(self, model):
        for fn in self.model_transforms:
            model = fn(model)
        return model
