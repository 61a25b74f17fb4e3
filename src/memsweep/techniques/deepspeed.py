"""deepspeed: none | zero0..zero3 | zero2_offload | zero3_offload.

The DeepSpeed JSON is generated from the composed config, with "auto" wherever Trainer fills the value
in from its own arguments, so batch size, accumulation, precision and clipping never disagree.
Beside the stage and offload, the two keys that size ZeRO's gradient buffers on the device:
reduce_bucket_size and overlap_comm (one bucket, or two to reduce while backward runs).
DeepSpeed's compiled ops are not built at install: its op builders build them where a job first needs
them (run/ds_ops.py), with ninja and a C++ compiler (`can_build_ops`).
"""
import os
import shutil
import sys
from dataclasses import dataclass

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    stage: int | None  # the ZeRO stage; None = DeepSpeed off
    offload_optimizer: bool  # optimizer state and its step on the host (CPUAdam)
    offload_param: bool  # stage 3's parameters in host memory

    @property
    def on(self) -> bool:
        return self.stage is not None


def traits(cfg) -> Traits:
    on = is_on(cfg)
    return Traits(stage=cfg.stage if on else None, offload_optimizer=on and cfg.offload_optimizer,
                  offload_param=on and cfg.offload_param)


def ds_config(cfg) -> dict:
    # "auto" bucket sizes: Trainer sizes them from the model's hidden size. DeepSpeed's own default
    # (5e8 elements) allocates ~1.9 GiB of fp32 reduce buckets whatever the model.
    zero: dict = {"stage": cfg.stage, "reduce_bucket_size": cfg.reduce_bucket_size or "auto",
                  "overlap_comm": cfg.overlap_comm}
    if cfg.stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto")
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if cfg.offload_optimizer:
        # Offloaded state is stepped on the CPU by DeepSpeed's CPUAdam (its cpu_adam op), not the client optimizer.
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto"}}
    return config


def apply(cfg, setup) -> None:
    if traits(cfg).on:
        setup.process_group = True
        setup.args["deepspeed"] = ds_config(cfg)


def op_builders(t: Traits) -> tuple[str, ...]:
    """The compiled ops DeepSpeed's engine loads for this job, by their op builder's class name: its
    shared-memory collectives (comm/torch.py's build_shm_op, for every engine; CPU accelerator only) and,
    with offloaded optimizer state, CPUAdam's cpu_adam op."""
    if not t.on:
        return ()
    return ("ShareMemCommBuilder",) + (("CPUAdamBuilder",) if t.offload_optimizer else ())


def ninja_dir() -> str | None:
    """The folder of the ninja that builds DeepSpeed's ops: on PATH, or beside this Python (the ninja
    package's, in a virtualenv that is not activated: torch runs plain `ninja`)."""
    found = shutil.which("ninja") or shutil.which("ninja", path=os.path.dirname(sys.executable))
    return os.path.dirname(found) if found else None


def can_build_ops() -> bool:
    """Whether DeepSpeed can build an op on first use here: ninja and a C++ compiler (torch's $CXX or c++)."""
    return ninja_dir() is not None and shutil.which(os.environ.get("CXX", "c++")) is not None
