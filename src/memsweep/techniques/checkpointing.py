"""checkpointing: none | full | selective — non-reentrant gradient checkpointing of every block.

- full: each block's forward is recomputed in backward; only its input is kept.
- selective: per op, with PyTorch's own selective checkpoint API (`torch.utils.checkpoint.
  create_selective_checkpoint_contexts`) inside the same per-block checkpoint: the outputs of attention and of
  every other matmul are kept, the ops between them (norms, activations, the other matmuls) recomputed. The
  policy is torchtitan's op-level selective AC (`torchtitan/models/llama/parallelize_llama.py`, "op" mode:
  save `mm` and the SDPA kernels, except every second `mm`, counted separately in forward and recompute), the
  one its published Llama 3.1 8B rows ran with. A linear layer with a bias is `addmm`, counted as a matmul.
"""
import functools
from dataclasses import dataclass

from ..config.schema import CheckpointingName, is_on


@dataclass(frozen=True)
class Traits:
    on: bool  # every block's forward recomputed in backward
    selective: bool  # ...except the ops the selective policy keeps


def traits(cfg) -> Traits:
    return Traits(on=is_on(cfg), selective=cfg.name == CheckpointingName.selective)


@functools.cache
def _ops():
    """(the matmuls, every op whose output the policy keeps)."""
    import torch

    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default}
    attention = {getattr(aten, name).default for name in (
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")}
    return matmuls, matmuls | attention


def selective_contexts():
    """The forward and recompute contexts of one checkpointed block: a fresh count of its matmuls."""
    from collections import Counter

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    matmuls, kept = _ops()
    count = Counter()

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in matmuls:
            count[mode] += 1
        keep = func in kept and not (func in matmuls and count[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def enable(model, selective: bool = False):
    kwargs = {"use_reentrant": False, **({"context_fn": selective_contexts} if selective else {})}
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # transformers 5.23: its new name
    # transformers (and peft) may add a hook making the embedding output require grad: reentrant
    # checkpointing needs it, non-reentrant does not, and with frozen layers it makes backward run
    # through all of them for nothing (3x slower). Remove it.
    inner = getattr(model, "get_base_model", lambda: model)()
    if getattr(inner, "_require_grads_hook", None) is not None:
        inner.disable_input_require_grads()
    return model


def apply(cfg, setup) -> None:
    t = traits(cfg)
    if t.on:
        setup.model_transforms.append(functools.partial(enable, selective=t.selective))
