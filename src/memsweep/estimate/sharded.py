"""FSDP in the trace: one rank of a job sharded over its nodes x nproc processes, on fake tensors.

The ranks are a fake process group (torch's own, the one torch tests FSDP's memory with): collectives
return tensors of the right shapes and move no data, so one process runs rank 0's step as it would run
among N. The model is wrapped by Accelerate's own `fsdp2_prepare_model` with the FSDP plugin a real
job's Trainer builds (its units, reshard_after_forward, the mixed-precision policy), so the trace sees
the same units gathered and freed, the sharded gradients and the sharded optimizer state as rank 0 of
the real job. Rank 0 holds the largest shard (FSDP pads the last ranks' shards).

FSDP1 (fsdp.version=1) is traced through FSDP2's code with FSDP1's units and its flat parameters' gradients
(`flat_units`); what that leaves out: docs/techniques/fsdp.md.
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
    the mixed-precision policy as Accelerate sets it on its FSDP plugin for bf16 / fp16. An FSDP1 job's
    units are FSDP1's (`flat_units`)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    flat = plugin_args["fsdp_version"] == 1
    plugin = FullyShardedDataParallelPlugin(**(as_fully_shard(plugin_args) if flat else plugin_args))
    # A real job's 4-bit weights are packed uint8, which Accelerate leaves out of sharding (every rank
    # holds them whole); the trace's are quantized after sharding, so their layers are left out here
    quantized = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    if quantized:
        plugin.ignored_modules = quantized
    mixed = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast_dtype, "no")
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    if flat:
        return flat_units(model, plugin, fsdp1_policy(model, plugin_args))
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                  mixed_precision=mixed, is_main_process=True, parallelism_config=None,
                                  device=torch.device("cpu"))
    return fsdp2_prepare_model(accelerator, model)


# FullyShardedDataParallelPlugin's FSDP1-only arguments (TrainingArguments derives them for version 1)
FSDP1_ONLY = ("use_orig_params", "sync_module_states", "backward_prefetch", "forward_prefetch", "limit_all_gathers")


def as_fully_shard(plugin_args: dict) -> dict:
    """An FSDP1 job's plugin arguments as FSDP2's: its sharding strategy as `reshard_after_forward`
    (FULL_SHARD frees a unit's gathered parameters after its forward, SHARD_GRAD_OP keeps them)."""
    args = {key: value for key, value in plugin_args.items() if key not in FSDP1_ONLY}
    return {**args, "fsdp_version": 2, "reshard_after_forward": plugin_args["reshard_after_forward"] != "shard_grad_op"}


def fsdp1_policy(model, plugin_args: dict):
    """The auto-wrap policy a real FSDP1 job's Trainer hands FullyShardedDataParallel: the plugin's
    (the job's block class), or for a peft model peft's `fsdp_auto_wrap_policy`, which Trainer puts in its
    place (transformers' update_fsdp_plugin_peft): the model's `_no_split_modules` and, as units of their
    own, every leaf module whose weight is trained (LoRA's A and B, a saved head)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    if hasattr(model, "peft_config"):
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    plugin.set_auto_wrap_policy(model)
    return plugin.auto_wrap_policy


def flat_units(model, plugin, policy):
    """FSDP1's units made with `fully_shard`: each module the FSDP1 `policy` wraps, bottom up as FSDP1's
    _recursive_wrap visits them, and the root holding every other parameter (embeddings, head and final norm
    together, where Accelerate's FSDP2 path gives them units of their own), which FSDP1 does not free after
    forward (`_post_forward_reshard`: not for the root). Then FSDP1's flat parameters' gradients (`flat_gradients`)."""
    from accelerate.utils.fsdp_utils import get_module_children_bottom_up
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    kwargs = {"reshard_after_forward": plugin.reshard_after_forward, "offload_policy": plugin.cpu_offload,
              "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy()}
    ignored = {p for m in plugin.ignored_modules or () for p in m.parameters()}
    for module in get_module_children_bottom_up(model)[:-1]:
        if not isinstance(module, FSDPModule) and policy(module=module, recurse=False, nonwrapped_numel=0):
            fully_shard(module, **kwargs, ignored_params=ignored or None)
    fully_shard(model, **{**kwargs, "reshard_after_forward": False}, ignored_params=ignored or None)
    flat_gradients(model)
    for unit in (m for m in model.modules() if isinstance(m, FSDPModule)):
        group = unit._get_fsdp_state()._fsdp_param_group  # FSDP2's per-unit state (torch 2.13)
        if group is not None:
            group.post_backward = concatenated(group, group.post_backward)
    return model


def concatenated(group, post_backward):
    """FSDP1's flat gradient is made by autograd from its views' gradients (the backward of the flat parameter's
    split into views, `FlatParamHandle._use_unsharded_views`, concatenates them): for a moment a unit holds its
    parameters' gradients and the flat one, its parameters still gathered (FSDP1's post-backward hook runs on the
    flat parameter's gradient, then frees them). Made here, before FSDP2 reshards and copies the gradients into
    its reduce-scatter input."""
    def post_backward_flat(*args):
        grads = [p.unsharded_param.grad for p in group.fsdp_params
                 if hasattr(p, "_unsharded_param") and p.unsharded_param.grad is not None]
        if grads:
            flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
            del flat
        return post_backward(*args)
    return post_backward_flat


def flat_gradients(model) -> None:
    """FSDP1's FlatParameter requires a gradient when any parameter of its unit does (use_orig_params=True
    permits the mix: fsdp/_flat_param.py, _validate_tensors_to_flatten), and autograd then makes the whole
    flat parameter's gradient: frozen parameters of such a unit get gradients too (torch's FSDP docs: "the
    gradient memory usage will be higher than expected (namely, equivalent to not freezing those
    parameters)"). In FSDP2 terms: those parameters require a gradient from the first forward on, after the
    optimizer is built (which still steps the trainable ones only), before FSDP unshards any (its own
    pre-forward hook comes after this one)."""
    def flat(module, args):
        for unit in units(model):
            if any(p.requires_grad for p in unit):
                for p in unit:
                    p.requires_grad_(True)
        handle.remove()

    handle = model.register_forward_pre_hook(flat, prepend=True)


def units(model) -> list[list]:
    """Each FSDP unit's own floating-point parameters (those of no unit nested in it), as FSDP1 flattens them."""
    from torch.distributed.fsdp import FSDPModule

    found = []
    for unit in (m for m in model.modules() if isinstance(m, FSDPModule)):
        nested = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
        found.append([p for p in unit.parameters() if id(p) not in nested and p.is_floating_point()])
    return found


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
