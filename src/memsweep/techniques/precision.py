"""precision: fp32 | tf32 | fp16 (mixed, loss scaling) | bf16 (mixed) | bf16_true (everything bf16)."""
import torch

from ..schema import PrecisionName


def apply(cfg, plan, job) -> None:
    name = PrecisionName(cfg.name)
    if name == PrecisionName.tf32:
        plan.args["tf32"] = True
    elif name == PrecisionName.bf16:
        plan.args["bf16"] = True  # Accelerate autocasts to bf16 on CPU and GPU alike
    elif name == PrecisionName.fp16:
        if plan.device == "cuda":
            plan.args["fp16"] = True
        else:
            # Accelerate ignores fp16 on the CPU and would train fp32 under an fp16 label: do it ourselves.
            plan.autocast_dtype = torch.float16
            plan.grad_scaler = True
    elif name == PrecisionName.bf16_true:
        plan.load_kwargs["dtype"] = torch.bfloat16
        plan.model_transforms.append(lambda model: model.to(torch.bfloat16))
