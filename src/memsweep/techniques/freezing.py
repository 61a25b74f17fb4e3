"""freezing: none | embeddings | encoder (all but the head) | bottom_half (embeddings + lower half of the blocks).

The parts are the model's own (structure.py): for a causal LM whose head is tied to the input
embedding, `encoder` keeps that shared matrix trainable (it is the head).
"""
from ..model import find_module
from ..schema import FreezeName


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


def apply(cfg, plan) -> None:
    name = FreezeName(cfg.name)
    if name != FreezeName.none:
        structure = plan.structure
        plan.model_transforms.append(lambda model: freeze(model, name, structure))
