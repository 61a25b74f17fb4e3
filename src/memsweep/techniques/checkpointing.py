"""checkpointing: none | full (non-reentrant gradient checkpointing of every layer)."""
from dataclasses import dataclass

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    on: bool  # every block's forward recomputed in backward; only its input kept


def traits(cfg) -> Traits:
    return Traits(on=is_on(cfg))


def enable(model):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # transformers (and peft) may add a hook making the embedding output require grad: reentrant
    # checkpointing needs it, non-reentrant does not, and with frozen layers it makes backward run
    # through all of them for nothing (3x slower). Remove it.
    inner = getattr(model, "get_base_model", lambda: model)()
    if getattr(inner, "_require_grads_hook", None) is not None:
        inner.disable_input_require_grads()
    return model


def apply(cfg, plan) -> None:
    if traits(cfg).on:
        plan.model_transforms.append(enable)
