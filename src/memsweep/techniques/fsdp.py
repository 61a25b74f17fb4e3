"""fsdp: none | full_shard | shard_grad_op | full_shard_offload, and `fsdp.version`: 2 (FSDP2, `fully_shard`,
the default) or 1 (FSDP1, `FullyShardedDataParallel` with flat parameters and `use_orig_params=True`, as
accelerate's and Lightning's FSDP1 jobs run it), through Trainer's `fsdp` / `fsdp_config`, so Accelerate
shards the model exactly as it does on a GPU.

Each transformer block is its own FSDP unit, its class named explicitly; on the CPU MemsweepTrainer puts back
the plugin Accelerate drops (and the CPU device FSDP1 needs), and offload is refused by a rule. Without a
launcher this is a process group of one; under torchrun every rank holds 1/world_size of each parameter.

Why each choice: docs/techniques/fsdp.md.
"""
from dataclasses import dataclass

from ..config.schema import FsdpStrategy, is_on
from .modules import find_module


@dataclass(frozen=True)
class Traits:
    on: bool
    reshard_after_forward: bool  # full_shard frees gathered parameters after forward; shard_grad_op keeps them
    offload: bool  # sharded parameters, their gradients and the optimizer's step in host memory
    version: int  # 2: FSDP2 (a DTensor per parameter); 1: FSDP1 (one FlatParameter per unit)

    @property
    def flat(self) -> bool:
        """FSDP1: each unit's parameters are one FlatParameter, gathered, reduced and given a gradient as one."""
        return self.on and self.version == 1


def traits(cfg) -> Traits:
    on = is_on(cfg)
    return Traits(on=on, reshard_after_forward=on and cfg.strategy == FsdpStrategy.full_shard,
                  offload=on and cfg.offload, version=cfg.version)


def fsdp_config(t: Traits) -> dict:
    """Trainer's `fsdp_config` for the option (transformers 5.23 keys). FSDP1's as Lightning's FSDPStrategy
    passes them: original parameters kept, torch's default prefetch (BACKWARD_PRE), no broadcast of rank 0's
    weights (every rank builds the same ones; Accelerate's broadcast refuses a CPU)."""
    common = {"version": t.version, "cpu_offload": t.offload, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    if t.version == 2:
        return {**common, "reshard_after_forward": t.reshard_after_forward}
    return {**common, "reshard_after_forward": "full_shard" if t.reshard_after_forward else "shard_grad_op",
            "use_orig_params": True, "backward_prefetch": "BACKWARD_PRE", "sync_module_states": False}


def wrap_layers(model, config: dict, layers_module: str):
    """Name the block class as the FSDP unit (known only once the model is built)."""
    layers = find_module(model, layers_module)
    config["transformer_layer_cls_to_wrap"] = sorted({type(layer).__name__ for layer in layers})
    return model


def apply(cfg, setup) -> None:
    t = traits(cfg)
    if not t.on:
        return
    setup.process_group = True
    config = fsdp_config(t)
    setup.args["fsdp"] = True
    setup.args["fsdp_config"] = config
    layers = setup.structure.layers
    setup.model_transforms.append(lambda model: wrap_layers(model, config, layers))
