"""optim: the optimizer, by transformers' `optim` names (adamw_torch, sgd, adafactor, adamw_bnb_8bit,
adamw_torch_8bit, ...).

This module owns what an optimizer name means beyond its Trainer name (`traits`): which update rule
it runs, how its state is stored, whose kernels step it (torch, bitsandbytes or torchao). Rules and the
estimator ask here.
"""
import contextlib
import sys
from dataclasses import dataclass

from ..config.schema import OptimName


@dataclass(frozen=True)
class Traits:
    rule: str  # the update rule: "adamw", "sgd" or "adafactor"
    state_bits: int  # 32, or 8 / 4 for block-wise quantized states
    paged: bool  # bitsandbytes' paged state (unified memory that can spill to the host)
    fused: bool  # torch's fused kernel: one kernel for the step, no temporaries
    kernels: str = "torch"  # whose code steps it: "torch", "bitsandbytes" or "torchao"

    @property
    def bitsandbytes(self) -> bool:
        """Stepped by bitsandbytes' own kernels (no DTensor, no ZeRO; on fake tensors only with the
        quantization maps made outside fake mode, estimate/trace.py)."""
        return self.kernels == "bitsandbytes"

    @property
    def torchao(self) -> bool:
        """Stepped by torchao: its states are tensor subclasses and each parameter's step is compiled."""
        return self.kernels == "torchao"


TRAITS = {
    OptimName.adamw_torch: Traits("adamw", 32, paged=False, fused=False),
    OptimName.adamw_torch_fused: Traits("adamw", 32, paged=False, fused=True),
    OptimName.sgd: Traits("sgd", 32, paged=False, fused=False),
    OptimName.adafactor: Traits("adafactor", 32, paged=False, fused=False),
    OptimName.adamw_bnb_8bit: Traits("adamw", 8, paged=False, fused=False, kernels="bitsandbytes"),
    OptimName.paged_adamw_8bit: Traits("adamw", 8, paged=True, fused=False, kernels="bitsandbytes"),
    # the QLoRA recipe's optimizer
    OptimName.paged_adamw_32bit: Traits("adamw", 32, paged=True, fused=False, kernels="bitsandbytes"),
    OptimName.adamw_torch_8bit: Traits("adamw", 8, paged=False, fused=False, kernels="torchao"),
    OptimName.adamw_torch_4bit: Traits("adamw", 4, paged=False, fused=False, kernels="torchao"),
}


def param_groups(model, decay: set, weight_decay: float) -> list[dict]:
    """The trainable parameters in Trainer.create_optimizer's two groups: those it decays (`decay`: its
    get_decay_parameter_names) with `weight_decay`, the others (biases, norms) with none."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]


def traits(hf_name) -> Traits:
    return TRAITS[OptimName(hf_name)]


def apply(cfg, setup) -> None:
    setup.args.update(optim=cfg.hf_name.value, learning_rate=setup.lr, weight_decay=cfg.weight_decay,
                     max_grad_norm=cfg.max_grad_norm, warmup_steps=cfg.warmup_ratio,
                     lr_scheduler_type=cfg.scheduler)
    if traits(cfg.hf_name).rule == "sgd":
        setup.args["optim_args"] = f"momentum={cfg.momentum}"


@contextlib.contextmanager
def own_bitsandbytes_overrides():
    """bitsandbytes keeps per-parameter optimizer overrides (Trainer's: 32-bit state for embeddings) in a
    process-wide singleton, matched by module and by (group, index) position: left over from an earlier
    job or estimate in this process (a sweep runs its jobs in one), they would apply to whatever parameter
    sits there now. The block starts from none; what was there is put back after it."""
    if "bitsandbytes" not in sys.modules:
        yield
        return
    from bitsandbytes.optim import GlobalOptimManager

    manager = GlobalOptimManager.get_instance()
    saved = {k: v.copy() if isinstance(v, (dict, list)) else v for k, v in vars(manager).items()}
    manager.initialize()
    try:
        yield
    finally:
        vars(manager).clear()
        vars(manager).update(saved)
