"""The model of a job: its architecture (a transformers config), its tokenizer and its weights.

The architecture comes from a config.json, never from per-architecture code: the weights' own
(embedded model, local folder, Hugging Face cache), else one shipped with memsweep (`model.config`,
src/memsweep/archs/), else a `model.architecture` type (tiny models); the `model.*` size keys and
`model.overrides` change it. The task (task.py) says which head is put on it.
"""
import json
from pathlib import Path
from typing import Any

from ..config.schema import ModelConf, ModelSource
from ..errors import ConfigError
from . import hub, packaged

ARCHS_DIR = Path(__file__).resolve().parents[1] / "archs"
# model.<key> -> the config.json key it overrides (transformers maps the standard names per model type)
SIZE_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
             "intermediate_size": "intermediate_size", "max_position_embeddings": "max_position_embeddings"}
# The dropout keys architectures use; `model.dropout` sets those the config has.
DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout")


def embedded_minilm_path() -> str:
    return str(packaged.minilm_folder())


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in ARCHS_DIR.glob("*.json"))


def weights_source(cfg: ModelConf) -> str:
    """What `from_pretrained` loads: a folder or a hub id."""
    if cfg.source == ModelSource.embedded:
        return cfg.path or str(packaged.folder(cfg.name))
    if cfg.source == ModelSource.hub:
        if not cfg.path:
            raise ConfigError("model.path", "a hub id (e.g. bert-base-uncased) or a local model folder")
        hub.require_reachable("model.path", cfg.path)
        return cfg.path
    return cfg.tokenizer or embedded_minilm_path()


def _shipped_or_path(name: str) -> Path:
    path = Path(name)
    for candidate in (ARCHS_DIR / f"{name}.json", path / "config.json", path):
        if candidate.is_file():
            return candidate
    raise ConfigError("model.config", f"{name!r} is neither a config shipped with memsweep nor a config.json or model "
                                      f"folder; allowed: {', '.join(shipped_configs())}, or a path")


def weights_config(cfg: ModelConf) -> tuple[Path | None, str]:
    """The weights' own config.json where it is on disk (embedded model, local folder, Hugging Face cache).
    An embedded model not built yet has none: its architecture is the one shipped with memsweep."""
    if cfg.source == ModelSource.embedded:
        folder = cfg.path or packaged.folder(cfg.name, build=False)
        if folder is not None:
            return Path(folder) / "config.json", f"config.json of {folder}"
    if cfg.source == ModelSource.hub and cfg.path:
        if (Path(cfg.path) / "config.json").is_file():
            return Path(cfg.path) / "config.json", f"config.json of {cfg.path}"
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(cfg.path, "config.json")
        if isinstance(cached, str):
            return Path(cached), f"config.json of {cfg.path} (Hugging Face cache)"
    return None, ""


def config_file(cfg: ModelConf) -> tuple[Path | None, str]:
    """The config.json the architecture is read from, and a description; (None, ...) when there is none
    (a tiny model built from `model.architecture`)."""
    path, source = weights_config(cfg)
    if path is not None:
        return path, source
    if cfg.config:
        path = _shipped_or_path(cfg.config)
        return path, f"{path.name} shipped with memsweep" if path.parent == ARCHS_DIR else str(path)
    if cfg.architecture is None:
        where = (f"model.path={cfg.path!r} is not a local folder and its config.json is not in the Hugging Face "
                 "cache" if cfg.source == ModelSource.hub and cfg.path else "its config.json is not on disk")
        raise ConfigError("model.config", f"no architecture for model {cfg.name!r}: {where}; allowed: one shipped "
                                          f"with memsweep ({', '.join(shipped_configs())}), a config.json path, "
                                          "or model.architecture with the size keys")
    return None, "model config keys"


def overrides(cfg: ModelConf) -> dict[str, Any]:
    keys = {hf: getattr(cfg, key) for key, hf in SIZE_KEYS.items() if getattr(cfg, key) is not None}
    return {**keys, **cfg.overrides}


def config_values(cfg: ModelConf) -> tuple[dict[str, Any], str]:
    """The architecture's config.json as a dict (overrides applied) and where it came from, without
    importing transformers: validation reads its limits before anything is loaded."""
    path, source = config_file(cfg)
    values = json.loads(path.read_text()) if path is not None else {"model_type": cfg.architecture}
    values.update(overrides(cfg))
    if "n_positions" in values and cfg.max_position_embeddings is not None:  # GPT-2's name
        values["n_positions"] = cfg.max_position_embeddings
    return values, source + (" with model.* overrides" if overrides(cfg) else "")


def hf_config(cfg: ModelConf, num_labels: int = 2, download: bool = False, tokenizer=None):
    """(transformers config, where it came from): the architecture, overrides and dropout applied, the
    head's labels and the pad token set. With `download`, a hub model whose config is not on disk takes
    the hub's (a real job loading its weights)."""
    from transformers import AutoConfig

    if download and cfg.source == ModelSource.hub and weights_config(cfg)[0] is None:
        path, source = Path(weights_source(cfg)), f"config.json of {cfg.path} (hub)"
    else:
        path, source = config_file(cfg)
    # Overrides go through the constructor: keys derived from others (Qwen2's per-layer `layer_types`) follow.
    changed = overrides(cfg)
    if path is not None and path.is_file():
        values = {**json.loads(path.read_text()), **changed}
        config = AutoConfig.for_model(values.pop("model_type"), **values)
    elif path is not None:  # a hub id: its config.json downloaded
        config = AutoConfig.from_pretrained(str(path), **changed)
    else:
        from transformers import CONFIG_MAPPING

        if cfg.architecture not in CONFIG_MAPPING:
            raise ConfigError("model.architecture", f"{cfg.architecture!r} is not a transformers model type; allowed: "
                                                    "one of transformers' (e.g. bert, distilbert, llama, qwen2, gpt2, "
                                                    "mistral), or model.config=<a shipped config or config.json>")
        config = AutoConfig.for_model(cfg.architecture, **changed)
    config.num_labels = num_labels
    config.pad_token_id = pad_token_id(config, tokenizer)
    if cfg.dropout is not None:
        config.update({k: cfg.dropout for k in DROPOUT_KEYS if hasattr(config, k)})
    return config, source


def pad_token_id(config, tokenizer=None) -> int:
    """The token a batch pads with, by which a decoder classifier finds each sequence's last token: the
    config's own, else the tokenizer's (load_tokenizer pads with EOS where a tokenizer has none), else
    the config's EOS (what such a tokenizer would pad with, for a model whose tokenizer is not loaded)."""
    for candidate in (getattr(config, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None),
                      getattr(config, "eos_token_id", None)):
        if isinstance(candidate, (list, tuple)):  # a config may list several EOS tokens
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


_META: dict[str, Any] = {}


def meta_model(cfg: ModelConf, auto_class, num_labels: int = 2):
    """The model built from its config on the meta device (no weights, no memory), once per architecture
    and head: the structure is read off it (structure.py) and the estimator traces copies of it. It is
    shared: callers change a copy (copy.deepcopy), never this one."""
    import torch
    import transformers.initialization as hf_init

    config, _ = hf_config(cfg, num_labels)
    key = auto_class.__name__ + config.to_json_string()
    if key not in _META:
        with torch.device("meta"), hf_init.no_init_weights():
            model = auto_class.from_config(config, dtype=torch.float32)
            model.tie_weights()  # skipped with the init under no_init_weights: a tied head is one tensor
        _META[key] = model
    return _META[key]


def load_tokenizer(cfg: ModelConf):
    from transformers import AutoTokenizer

    source = cfg.tokenizer or weights_source(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise ConfigError("model.path", f"no tokenizer at {source!r}: {str(exc)[:200]}") from None
    if tokenizer.pad_token is None:  # decoder tokenizers (Llama, GPT-2) have none: batches pad with EOS
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_size(cfg: ModelConf) -> int:
    """Tokens the tokenizer can emit (added tokens included), read from its tokenizer.json where there is
    one (no transformers import), else by loading it."""
    source = Path(cfg.tokenizer or weights_source(cfg))
    if (source / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return len(load_tokenizer(cfg))


_TINY_DIRS: dict[str, str] = {}


def tiny_checkpoint(config, auto_class) -> str:
    """A folder holding the randomly initialised model (seeded), built once per process.

    Loading it back with `from_pretrained` lets every load-time technique (dtype, quantization,
    device placement, attention kernel) act on a tiny model exactly as on a real checkpoint. The folder
    goes when the process ends: a sweep's processes would otherwise fill the disk with them.
    """
    import atexit
    import shutil
    import tempfile

    import torch

    key = auto_class.__name__ + config.to_json_string()
    if key not in _TINY_DIRS:
        folder = tempfile.mkdtemp(prefix="memsweep-tiny-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            auto_class.from_config(config).save_pretrained(folder)
        _TINY_DIRS[key] = folder
    return _TINY_DIRS[key]


def load_model(cfg: ModelConf, num_labels: int, load_kwargs: dict[str, Any], auto_class=None, tokenizer=None):
    """`load_kwargs` come from the techniques (dtype, attention implementation, quantization, device),
    `auto_class` from the task (task.auto_class; default: sequence classification), the pad token from
    `tokenizer` where the config has none."""
    if auto_class is None:
        from transformers import AutoModelForSequenceClassification as auto_class
    config, _ = hf_config(cfg, num_labels, download=True, tokenizer=tokenizer)
    source = tiny_checkpoint(config, auto_class) if cfg.source == ModelSource.tiny else weights_source(cfg)
    if cfg.new_parts_random and cfg.source != ModelSource.tiny:  # a wider tensor than the weights': random, as asked
        load_kwargs = {**load_kwargs, "ignore_mismatched_sizes": True}  # (validate_model.shape_change counts them)
    try:
        return auto_class.from_pretrained(source, config=config, **load_kwargs)
    except OSError as exc:
        raise ConfigError("model.path", f"could not load a model from {source!r}: {str(exc)[:300]}") from None
    except ImportError as exc:  # e.g. attention=flash_attention_2 without the package
        raise ConfigError("attention", str(exc)[:300]) from None


__all__ = ["load_tokenizer", "load_model", "hf_config", "config_values", "weights_source", "meta_model",
           "pad_token_id"]
