"""Finding a module of a model by its dotted name, as the technique groups that act on parts of it
(freezing, FSDP's wrapping, LoRA's targets) name them: through a peft wrapper too."""
from ..errors import ConfigError


def find_module(model, dotted: str):
    """`model.bert.encoder.layer` from 'bert.encoder.layer', looking through a peft wrapper."""
    for root in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        node = root
        try:
            for part in dotted.split("."):
                node = getattr(node, part)
            return node
        except AttributeError:
            continue
    raise ConfigError("model", f"module {dotted!r} not found in {type(model).__name__}; check model.embeddings_module "
                               "/ model.layers_module / model.head_modules (null: found from the model)")
