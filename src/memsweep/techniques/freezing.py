"""freezing: none | embeddings | encoder (all but the head) | bottom_half (embeddings + lower half of layers)."""
from ..model import find_module
from ..schema import FreezeName


def frozen_modules(model, name: FreezeName, model_cfg):
    if name == FreezeName.none:
        return []
    embeddings = find_module(model, model_cfg.embeddings_module)
    layers = find_module(model, model_cfg.layers_module)
    if name == FreezeName.embeddings:
        return [embeddings]
    if name == FreezeName.bottom_half:
        return [embeddings, *list(layers)[: len(layers) // 2]]
    # encoder: everything except the classification head
    head = {id(p) for dotted in model_cfg.head_modules for p in _params_if_present(model, dotted)}
    return [p for p in model.parameters() if id(p) not in head]


def _params_if_present(model, dotted):
    try:
        return list(find_module(model, dotted).parameters())
    except Exception:
        return []


def freeze(model, name: FreezeName, model_cfg):
    for item in frozen_modules(model, name, model_cfg):
        params = [item] if not hasattr(item, "parameters") else item.parameters()
        for p in params:
            p.requires_grad_(False)
    return model


def apply(cfg, plan, job) -> None:
    name = FreezeName(cfg.name)
    if name != FreezeName.none:
        plan.model_transforms.append(lambda model: freeze(model, name, job.model))
