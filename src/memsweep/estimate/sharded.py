"""FSDP in the trace: one rank of a job sharded over its nodes x nproc processes, on fake tensors.

The ranks are a fake process group (torch's own, the one torch tests FSDP's memory with): collectives
return tensors of the right shapes and move no data, so one process runs rank 0's step as it would run
among N. The model is wrapped by Accelerate's own `fsdp2_prepare_model` with the FSDP plugin a real
job's Trainer builds (its units, reshard_after_forward, the mixed-precision policy), so the trace sees
the same units gathered and freed, the sharded gradients and the sharded optimizer state as rank 0 of
the real job. Rank 0 holds the largest shard (FSDP pads the last ranks' shards).
"""
import contextlib
from types import SimpleNamespace

import torch


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """A default process group of `world_size` fake ranks for the block; this process is rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():  # a job's own group: the trace must not replace it
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model, plugin_args: dict, autocast_dtype):
    """Wrap the meta model in FSDP units as Accelerate does for the job (fsdp2_prepare_model), in the
    current (fake) process group: `plugin_args` as TrainingArguments derives them (fsdp_plugin_args),
    the mixed-precision policy as Accelerate sets it on its FSDP plugin for bf16 / fp16."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    # A real job's 4-bit weights are packed uint8, which Accelerate leaves out of sharding (every rank
    # holds them whole); the trace's are quantized after sharding, so their layers are left out here
    quantized = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    if quantized:
        plugin.ignored_modules = quantized
    mixed = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast_dtype, "no")
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                  mixed_precision=mixed, is_main_process=True, parallelism_config=None,
                                  device=torch.device("cpu"))
    return fsdp2_prepare_model(accelerator, model)


@contextlib.contextmanager
def no_sync(model, sync: bool):
    """A micro-batch before an accumulated step's last: Trainer runs it in Accelerate's no_sync, which
    for FSDP2 keeps the unsharded gradients (set_requires_gradient_sync(False)) until the last one."""
    if sync or not hasattr(model, "set_requires_gradient_sync"):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (DTensor) parameter, gradient or state; any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
