"""freezing: none | embeddings | encoder (all but the head) | bottom_half (embeddings + lower half of the blocks).

The parts are the model's own (structure.py). A causal LM whose head is tied to the input embedding
(GPT-2, Qwen2, Llama 3.2) has one matrix that is both, and each option follows the part it names:
- `embeddings` and `bottom_half` freeze it, so the head is frozen too. Its gradient and optimizer state
  are the memory these options exist to save (136M of Qwen2.5-0.5B's 494M parameters); keeping it
  trainable would make them save next to nothing on a tied model. The blocks still learn, as under
  LoRA, which keeps a causal LM's head frozen as well.
- `encoder` (all but the head) keeps it trainable: it is the head.
`effective.trainable_params` shows which way a job went.
"""
from ..config.schema import FreezeName
from .modules import find_module


def frozen_modules(model, name: FreezeName, structure):
    if name == FreezeName.none:
        return []
    embeddings = [find_module(model, dotted) for dotted in structure.embeddings]
    layers = find_module(model, structure.layers)
    if name == FreezeName.embeddings:
        return embeddings
    if name == FreezeName.bottom_half:
        return [*embeddings, *list(layers)[: len(layers) // 2]]
    # encoder: everything except the classification head
    head = {id(p) for dotted in structure.head for p in _params_if_present(model, dotted)}
    return [p for p in model.parameters() if id(p) not in head]


def _params_if_present(model, dotted):
    try:
        return list(find_module(model, dotted).parameters())
    except Exception:
        return []


def freeze(model, name: FreezeName, structure):
    for item in frozen_modules(model, name, structure):
        params = [item] if not hasattr(item, "parameters") else item.parameters()
        for p in params:
            p.requires_grad_(False)
    return model


def apply(cfg, setup) -> None:
    name = FreezeName(cfg.name)
    if name != FreezeName.none:
        structure = setup.structure
        setup.model_transforms.append(lambda model: freeze(model, name, structure))
