"""The model as the job will build it, checked without weights in every mode: its config.json with the
`model.*` size keys and `model.overrides` applied (as the job applies them), against the job and the task.

Where the architecture comes from, what the model's constructor would refuse, the task's head, the module
names the config gives, and a training job's `hardware.memory_gib` against the weights alone (`capacity`).
Each check: docs/guide/validation.md.
"""
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ..config.schema import CONF_DIR, Config, Mode, ModelConf, ModelSource
from ..errors import ConfigError, bad_input, naming
from . import validate_layers

ARCHITECTURE = ("a model folder with its config.json (save_pretrained), a hub id, or model.config=<a config "
                "shipped with memsweep or a config.json>")


def check_model(job: Config) -> None:
    """Every check of the model that needs no weights, cheapest first."""
    config, values, source = architecture(job.model)
    with naming("model.overrides" if job.model.overrides else "model", ARCHITECTURE):
        _sizes(job, config, values)
        _special_tokens(job, config)
    _positions(job, config, source)
    _patches(job, config)
    _task(job, config)
    _tokenizer(job, config, source)
    with building(job.model, f"values {config.model_type!r} models can be built with"):
        found = structure_of(job)  # what the constructor refuses (e.g. an activation it does not know)
    validate_layers.check(job, found)
    _pretrained_shape(job)


def _architecture_key(cfg: ModelConf) -> str:
    if cfg.source != ModelSource.tiny and cfg.path:
        return "model.path"
    return "model.config" if cfg.config else "model.architecture"


def architecture(cfg: ModelConf) -> tuple[Any, dict[str, Any], str]:
    """(transformers config, its config.json values with the overrides, where it came from)."""
    from . import model

    if cfg.source == ModelSource.tiny and cfg.path:
        raise ConfigError("model.path", f"{cfg.path!r} is set but model={cfg.name} is a tiny model (random weights of "
                                        "model.architecture), which loads no weights; allowed: a model with weights "
                                        "(model=minilm, or a hub model: model.source=hub) or model.path unset")
    path = Path(cfg.path).expanduser() if cfg.path else None
    if path is not None and path.exists() and not (path / "config.json").is_file():
        raise ConfigError("model.path", f"{cfg.path!r} is {'a folder' if path.is_dir() else 'a file'} without a "
                                        f"config.json; allowed: {ARCHITECTURE}")
    if path is not None and not path.exists() and (cfg.path.startswith((".", "/", "~")) or cfg.path.count("/") > 1):
        raise ConfigError("model.path", f"{cfg.path!r} does not exist; allowed: {ARCHITECTURE}")
    with naming(_architecture_key(cfg), ARCHITECTURE):
        values, source = model.config_values(cfg)
    with building(cfg, f"values {values.get('model_type')!r} configs accept"):
        config, _ = model.hf_config(cfg)
    return config, values, source


@contextmanager
def building(cfg: ModelConf, allowed: str) -> Iterator[None]:
    """An error of transformers building the config or the model is bad input about the override it
    names (by key or value), else about model.overrides, else where the architecture came from."""
    from .model import overrides

    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the constructor refused a value
        message = str(exc)
        named = [k for k, v in overrides(cfg).items() if re.search(rf"\b{re.escape(k)}\b", message)
                 or (len(str(v)) > 2 and str(v) in message)]
        key = blame(cfg, named[0]) if named else "model.overrides" if cfg.overrides else _architecture_key(cfg)
        raise bad_input(key, allowed if key.startswith("model.overrides") else ARCHITECTURE, exc) from None


def blame(cfg: ModelConf, *hf_keys: str) -> str:
    """The key that set the first of these config.json keys: `model.overrides.<key>`, else its `model.*`
    size key, else the size key by its memsweep name."""
    from .model import SIZE_KEYS

    ours = {hf: key for key, hf in SIZE_KEYS.items()}
    for hf in hf_keys:
        if hf in cfg.overrides:
            return f"model.overrides.{hf}"
        if hf in ours and getattr(cfg, ours[hf]) is not None:
            return f"model.{ours[hf]}"
    return f"model.{ours.get(hf_keys[0], 'overrides.' + hf_keys[0])}"


def _sizes(job: Config, config, values: dict[str, Any]) -> None:
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if hidden and heads and "head_dim" not in values and hidden % heads:
        raise ConfigError(blame(job.model, "num_attention_heads", "hidden_size"),
                          f"{heads} does not divide the hidden size {hidden}; allowed: a divisor of the hidden size")
    kv = getattr(config, "num_key_value_heads", None)
    if heads and kv and heads % kv:
        raise ConfigError(blame(job.model, "num_key_value_heads", "num_attention_heads"),
                          f"{kv} key/value heads do not divide the {heads} attention heads; allowed: a divisor of "
                          f"{heads} (grouped-query attention shares each key/value head among the same number of "
                          "heads)")


def _special_tokens(job: Config, config) -> None:
    vocab = getattr(config, "vocab_size", None)
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = getattr(config, attr, None)
        for token in ids if isinstance(ids, list) else [ids]:
            if vocab and isinstance(token, int) and not 0 <= token < vocab:
                raise ConfigError(blame(job.model, attr, "vocab_size"),
                                  f"{attr} {token} is outside the vocabulary of {vocab} tokens; allowed: 0 to "
                                  f"{vocab - 1} (or null)")


def _positions(job: Config, config, source: str) -> None:
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and job.max_seq_len > limit:
        raise ConfigError("max_seq_len", f"{job.max_seq_len} is above the model's position limit; allowed: an "
                                         f"integer from 1 to {limit} (max_position_embeddings, {source})")


def _pair(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _patches(job: Config, config) -> None:
    """An image model's patch fits in its image: the patch embedding is a convolution with the patch as kernel
    and stride (ViT, DINOv2), so a larger patch leaves no patch and the first forward fails. A remainder
    (image_size not a multiple of patch_size) is not refused: the stride drops those edge pixels, as
    transformers' num_patches (image_size // patch_size) counts."""
    image, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if image is None or patch is None:
        return
    for side, size in zip(_pair(image), _pair(patch)):
        if not isinstance(size, int) or not isinstance(side, int) or not 1 <= size <= side:
            raise ConfigError(blame(job.model, "patch_size", "image_size"),
                              f"{patch} is not a patch size for images of {image} pixels; allowed: an integer from 1 "
                              f"to {side} (image_size: the patch embedding needs at least one patch per image)")


def _models_for(task) -> list[str]:
    """The model options in conf/model/ whose architecture can take the task's head."""
    import json

    from omegaconf import OmegaConf

    from . import model
    from . import task as tasks

    fitting = []
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        option = OmegaConf.load(path)
        shipped = model.ARCHS_DIR / f"{option.get('config')}.json"
        kind = option.get("architecture") or (json.loads(shipped.read_text()).get("model_type")
                                              if shipped.is_file() else None)
        if kind and tasks.head_refusal(task, kind) is None:
            fitting.append(path.stem)
    return fitting


def _task(job: Config, config) -> None:
    from . import task

    why = task.head_refusal(job.task.name, config.model_type, bool(getattr(config, "is_decoder", False)))
    if why is not None:
        decoder = bool(getattr(config, "is_decoder", False))
        other = [t.value for t in type(job.task.name)
                 if t != job.task.name and task.head_refusal(t, config.model_type, decoder) is None]
        here = f"task={', '.join(other)} with this model, or " if other else ""
        raise ConfigError("task", f"{job.task.name.value} cannot run on model={job.model.name}: {why}; allowed: "
                                  f"{here}model={', '.join(_models_for(job.task.name))}")


def _local_tokenizer(cfg: ModelConf) -> bool:
    if cfg.tokenizer:
        return Path(cfg.tokenizer).expanduser().exists()
    return cfg.source != ModelSource.hub or bool(cfg.path and Path(cfg.path).expanduser().exists())


def _tokenizer(job: Config, config, source: str) -> None:
    """The vocabulary holds every token the tokenizer emits; an estimate or a plan asks only a tokenizer on
    disk. An image model has no tokenizer: training asks that its weights can be reached."""
    from . import hub, model, task

    cfg = job.model
    if task.images(job.task):  # no tokenizer: training reads only the weights
        if job.mode == Mode.train and cfg.source != ModelSource.tiny:
            model.weights_source(cfg)
        return
    if job.mode != Mode.train and not _local_tokenizer(cfg):
        return
    if cfg.tokenizer and not Path(cfg.tokenizer).expanduser().exists():
        hub.require_reachable("model.tokenizer", cfg.tokenizer)
    with naming("model.tokenizer" if cfg.tokenizer else "model.path", "a tokenizer folder or hub id"):
        tokens = model.tokenizer_size(cfg)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and tokens > vocab:
        raise ConfigError(blame(cfg, "vocab_size"), f"{vocab} is smaller than the tokenizer's {tokens} tokens "
                                                    f"({source}); allowed: at least {tokens}")


def structure_of(job: Config):
    """The job's model as its meta model shows it (run/structure.found: no weights)."""
    from . import structure

    return structure.found(job)


def capacity(job: Config) -> None:
    """A training job's capacity holds at least the weights (a lower bound: 4-bit or 8-bit where LoRA
    quantizes, else the precision's stored bytes); below it the job could only run out of memory."""
    from ..techniques import lora, precision

    if job.hardware.memory_gib is None:
        return
    params = structure_of(job).parameters  # built by `check` already
    quantize = lora.traits(job.lora).quantize
    per = {"nf4": 0.5, "int8": 1}.get(quantize, precision.traits(job.precision.name).param_bytes)
    weights = params * per
    if job.hardware.memory_gib * 2**30 < weights:
        stored = quantize or job.precision.name.value
        raise ConfigError("hardware.memory_gib", f"{job.hardware.memory_gib} GiB is less than the weights alone "
                                                 f"({params:,} parameters x {per:g} bytes in {stored} = "
                                                 f"{weights / 2**30:.3f} GiB); allowed: more than "
                                                 f"{weights / 2**30:.3f} (or null: the device's memory); "
                                                 "mode=estimate answers what fits")


# The config.json keys of a pretrained model's shape, in the order a refusal names them: the first that adds
# parameters its weights do not hold. Fewer blocks (a smaller num_hidden_layers) is not named: it only leaves
# the last pretrained blocks out; max_position_embeddings last: a rotary model holds no weights for it.
SHAPE_ORDER = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size")


class ShapeChange(NamedTuple):
    """How the model a pretrained model's size keys ask for differs from its weights (model.new_parts_random)."""
    model: str
    changed: tuple[tuple[str, str, Any, Any], ...]  # (memsweep key, config.json key, pretrained value, asked value)
    new_parameters: int  # parameters its weights do not hold (a name they lack, or another shape): random at load
    dropped_parameters: int  # pretrained parameters the asked model has no place for (fewer blocks)
    regrouped_heads: bool  # attention weights of the same shapes split into another number of heads

    @property
    def alters(self) -> bool:
        """Whether the asked model is other than the pretrained one (new, left out or regrouped weights)."""
        return bool(self.new_parameters or self.dropped_parameters or self.regrouped_heads)

    def record(self) -> dict[str, Any]:
        """results.json's `effective.pretrained_shape`."""
        return {"changed": {key: [before, after] for key, _, before, after in self.changed},
                "new_parameters": self.new_parameters, "dropped_parameters": self.dropped_parameters,
                "regrouped_heads": self.regrouped_heads}

    def line(self) -> str:
        """The job's console line."""
        changes = ", ".join(f"{key} {before} -> {after}" for key, _, before, after in self.changed)
        heads = "; its attention weights are regrouped into other heads" if self.regrouped_heads else ""
        return (f"[memsweep] model: {changes} changes the pretrained model={self.model}: {self.new_parameters:,} "
                f"parameters randomly initialised, {self.dropped_parameters:,} pretrained parameters left out{heads}")


def _shape_of(model) -> dict[str, tuple[tuple[int, ...], int]]:
    return {name: (tuple(p.shape), p.numel()) for name, p in model.named_parameters()}


def shape_change(job: Config) -> ShapeChange | None:
    """The size keys and model.overrides of a model with pretrained weights against its weights' own config
    (both built on the meta device: no weights); None for a random (tiny) model, a hub model whose config.json
    is not on disk (nor shipped: its keys are its description), or when no key changes it."""
    import dataclasses

    from . import model, task

    cfg = job.model
    asked = model.overrides(cfg)
    if cfg.source == ModelSource.tiny or not asked:
        return None
    base = dataclasses.replace(cfg, overrides={}, **{key: None for key in model.SIZE_KEYS})
    if model.config_file(base)[0] is None:  # a hub model its keys describe (config.json not on disk): no other
        return None
    before, after = model.hf_config(base)[0], model.hf_config(cfg)[0]
    order = [k for k in SHAPE_ORDER if k in asked] + [k for k in asked if k not in SHAPE_ORDER]
    changed = tuple((blame(cfg, k), k, getattr(before, k, None), getattr(after, k, None)) for k in order
                    if getattr(before, k, None) != getattr(after, k, None))
    if not changed:
        return None
    head = (task.auto_class(job.task), task.num_labels(job.task, job.data.labels))
    old, new = _shape_of(model.meta_model(base, *head)), _shape_of(model.meta_model(cfg, *head))
    added = sum(n for name, (shape, n) in new.items() if name not in old or old[name][0] != shape)
    dropped = sum(n for name, (_, n) in old.items() if name not in new)
    heads = any(k in ("num_attention_heads", "num_key_value_heads") for _, k, _, _ in changed)
    return ShapeChange(cfg.name, changed, added, dropped, heads and not added)


def _pretrained_shape(job: Config) -> None:
    """A pretrained model's size keys may leave blocks out, but not add parts its weights do not hold (more
    blocks, a wider layer, another vocabulary or head count) unless model.new_parts_random=true says random
    new parts are meant: transformers would initialise them silently (a wider tensor: all of it)."""
    change = shape_change(job)
    if change is None or job.model.new_parts_random or not (change.new_parameters or change.regrouped_heads):
        return
    key, hf, before, after = next((c for c in change.changed if not (
        c[1] == "num_hidden_layers" and isinstance(c[3], int) and c[3] < c[2])), change.changed[0])
    where = _source(job)
    what = (f"its attention weights would be regrouped into {after} heads, which they were not trained as"
            if change.regrouped_heads else
            f"{change.new_parameters:,} parameters its weights do not hold would be randomly initialised")
    fewer = " (fewer keeps the first blocks' weights)" if hf == "num_hidden_layers" else ""
    others = [f"{k} {b} -> {a}" for k, _, b, a in change.changed if k != key]
    raise ConfigError(key, f"{after} where the pretrained model={job.model.name} has {before} ({where}): {what}"
                           + (f" (with {', '.join(others)})" if others else "")
                           + f"; allowed: {'at most ' if fewer else ''}{before}{fewer} or null, or set "
                           "model.new_parts_random=true if " + ("a model other than the pretrained one is meant"
                                                                if change.regrouped_heads else
                                                                "random new parts are meant"))


def _source(job: Config) -> str:
    """Where the pretrained config comes from, in words."""
    from . import model

    return model.config_file(job.model)[1]
