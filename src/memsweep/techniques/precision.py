"""precision: fp32 | tf32 | fp16 (mixed, loss scaling) | bf16 (mixed) | bf16_true (everything bf16) |
fp16_true (everything fp16) | fp64 (everything fp64).

This module owns what a precision name means (`traits`): bytes of a stored weight and of a matmul
output, autocast, loss scaling, the dtype whose peak rate times it, and the capability it needs.
Rules and the estimator ask here.
"""
import functools
from dataclasses import dataclass

import torch

from ..config.schema import PrecisionName


@dataclass(frozen=True)
class Traits:
    param_bytes: int  # a stored weight (and the residual stream, which keeps the weights' dtype)
    compute_bytes: int  # a matmul's output
    autocast: bool  # mixed: 16-bit compute under autocast, fp32 master weights
    loss_scaling: bool  # fp16's GradScaler
    compute: str  # the key of the hardware profile's `tflops`
    needs: str | None  # the hardware profile's capability flag it needs (bf16, tf32)


TRAITS = {
    PrecisionName.fp32: Traits(4, 4, autocast=False, loss_scaling=False, compute="fp32", needs=None),
    PrecisionName.tf32: Traits(4, 4, autocast=False, loss_scaling=False, compute="tf32", needs="tf32"),
    PrecisionName.fp16: Traits(4, 2, autocast=True, loss_scaling=True, compute="fp16", needs=None),
    PrecisionName.bf16: Traits(4, 2, autocast=True, loss_scaling=False, compute="bf16", needs="bf16"),
    PrecisionName.bf16_true: Traits(2, 2, autocast=False, loss_scaling=False, compute="bf16", needs="bf16"),
    # Lightning's "16-true": no master copy and no loss scaling (a GradScaler refuses fp16 gradients to unscale)
    PrecisionName.fp16_true: Traits(2, 2, autocast=False, loss_scaling=False, compute="fp16", needs=None),
    PrecisionName.fp64: Traits(8, 8, autocast=False, loss_scaling=False, compute="fp64", needs=None),
}

# the stored dtype of the precisions that keep every weight in a dtype other than fp32 (and compute in it)
TRUE_DTYPES = {PrecisionName.bf16_true: torch.bfloat16, PrecisionName.fp16_true: torch.float16,
               PrecisionName.fp64: torch.float64}


def traits(name) -> Traits:
    return TRAITS[PrecisionName(name)]


def emulated(name, profile) -> str | None:
    """The 16-bit dtype this precision computes in if the profile's device only emulates it, else None."""
    compute = traits(name).compute
    native = {"bf16": profile.bf16_native, "fp16": profile.fp16_native}.get(compute)
    return compute if native is False else None


def apply(cfg, setup) -> None:
    name = PrecisionName(cfg.name)
    # Stored weights in the precision's own dtype: from_pretrained (and from_config) would otherwise take
    # the checkpoint's saved dtype, bf16 for most hub decoders, and "fp32 master weights" would be bf16.
    setup.load_kwargs["dtype"] = TRUE_DTYPES.get(name, torch.float32)
    if name == PrecisionName.tf32:
        setup.args["tf32"] = True
    elif name == PrecisionName.bf16:
        setup.args["bf16"] = True  # Accelerate autocasts to bf16 on CPU and GPU alike
    elif name == PrecisionName.fp16:
        if setup.device == "cuda":
            setup.args["fp16"] = True
        else:
            # Accelerate ignores fp16 on the CPU and would train fp32 under an fp16 label: do it ourselves.
            setup.autocast_dtype = torch.float16
            setup.grad_scaler = True
    elif name in TRUE_DTYPES:
        setup.model_transforms.append(functools.partial(to_dtype, dtype=TRUE_DTYPES[name]))


def to_dtype(model, dtype: torch.dtype):
    """Every floating weight in `dtype`, also those `from_pretrained` keeps in fp32. A bitsandbytes-quantized
    model refuses `.to(dtype)`; `from_pretrained` already stored its unquantized weights in `dtype`."""
    return model if getattr(model, "is_quantized", False) else model.to(dtype)
