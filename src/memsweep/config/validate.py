"""Bad input is refused before any work: one message naming the key, the value and what is allowed.

Hydra and the typed schema (schema.py) already refuse a mistyped key and a value of the wrong type.
Here, in one place, what a type cannot say:
- `group_options`: a `group=option` argument with no conf/<group>/<option>.yaml, before Hydra composes
  (Hydra refuses it too, but in a message of many lines with its search path);
- `config`: keys the schema does not have (Hydra's `+key=value` adds them unchecked);
- `ranges`: every number within its meaningful range, and the keys that must agree with each other;
- `inputs` (a training job, before anything is loaded for training): the model's position limit and
  vocabulary against max_seq_len and the tokenizer, the data file's columns, sizes against the rows
  the data has, at least two classes with examples in both splits, hub names that cannot be had.
"""
import dataclasses
import math
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..measure import shapes
from .schema import CONF_DIR, Config, ModelSource


def group_options(args: list[str]) -> None:
    """Refuse `group=option` (or a comma list of options) naming no conf/<group>/<option>.yaml."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if arg.startswith("-") or not sep or not group.isidentifier() or not (CONF_DIR / group).is_dir():
            continue  # a flag, a plain key (`lr=...`), `hydra/launcher=...`: Hydra or the schema checks it
        if any(c in value for c in "()[]{}$'\""):
            continue  # glob(...), range(...), interpolations: Hydra expands them
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        for name in value.split(","):
            if name not in options and name != "null":
                raise ConfigError(group, f"{name!r} is not an option; allowed: {', '.join(options)} "
                                         f"(conf/{group}/*.yaml)")


def config(cfg: DictConfig) -> None:
    """Refuse keys the schema does not know, at any depth (free-form `tags` excepted)."""
    container = OmegaConf.to_container(cfg, resolve=False)
    for path in _unknown(container, Config, ""):
        raise ConfigError(path, f"is not a memsweep key; the keys here are {_known(path)}")


def _unknown(node: Any, schema: type, prefix: str) -> list[str]:
    if not isinstance(node, dict) or not dataclasses.is_dataclass(schema):
        return []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    found = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if key not in fields:
            found.append(path)
        elif dataclasses.is_dataclass(_field_type(fields[key])):
            found += _unknown(value, _field_type(fields[key]), path + ".")
    return found


def _field_type(f: dataclasses.Field) -> Any:
    return f.default_factory if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
        f.default_factory) else f.type


def _known(path: str) -> str:
    schema: Any = Config
    for part in path.split(".")[:-1]:
        schema = _field_type({f.name: f for f in dataclasses.fields(schema)}[part])
    return ", ".join(f.name for f in dataclasses.fields(schema))


# key -> (test of the value, what is allowed). None values are tested only where the test says so.
Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: v > 0, "a number > 0")
POSITIVE_INT: Check = (lambda v: v > 0, "an integer > 0")
NON_NEGATIVE: Check = (lambda v: v >= 0, "a number >= 0")
FRACTION: Check = (lambda v: 0 <= v < 1, "a number from 0 to below 1")
OPTIONAL_POSITIVE: Check = (lambda v: v is None or v > 0, "null or a number > 0")
OPTIONAL_POSITIVE_INT: Check = (lambda v: v is None or v > 0, "null (the architecture's own) or an integer > 0")
RANGES: dict[str, Check] = {
    "seed": (lambda v: 0 <= v < 2**32, "an integer from 0 to 2^32-1"),
    "batch_size": POSITIVE_INT,
    "eval_batch_size": POSITIVE_INT,
    "lr": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
    "epochs": POSITIVE,
    "max_steps": (lambda v: v == -1 or v > 0, "-1 (train for `epochs`) or an integer > 0"),
    "max_seq_len": POSITIVE_INT,
    "threads": (lambda v: v is None or v > 0, "null (torch's default) or an integer > 0"),
    "autofit_headroom": FRACTION,
    "model.dropout": (lambda v: v is None or 0 <= v < 1, "null (the model's own) or a number from 0 to below 1"),
    "model.vocab_size": OPTIONAL_POSITIVE_INT,
    "model.hidden_size": OPTIONAL_POSITIVE_INT,
    "model.num_layers": OPTIONAL_POSITIVE_INT,
    "model.num_heads": OPTIONAL_POSITIVE_INT,
    "model.num_kv_heads": OPTIONAL_POSITIVE_INT,
    "model.intermediate_size": OPTIONAL_POSITIVE_INT,
    "model.max_position_embeddings": OPTIONAL_POSITIVE_INT,
    "data.train_size": (lambda v: v is None or v > 0, "null (all rows left after the eval split) or an integer > 0"),
    "data.eval_size": POSITIVE_INT,
    "optim.lr": POSITIVE,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.momentum": FRACTION,
    "optim.max_grad_norm": NON_NEGATIVE,
    "optim.warmup_ratio": NON_NEGATIVE,
    "accumulation.steps": POSITIVE_INT,
    "lora.r": POSITIVE_INT,
    "lora.alpha": POSITIVE,
    "lora.dropout": FRACTION,
    "deepspeed.stage": (lambda v: v in (0, 1, 2, 3), "a ZeRO stage 0, 1, 2 or 3"),
    "dataloader.num_workers": NON_NEGATIVE,
    "dataloader.prefetch_factor": OPTIONAL_POSITIVE,
    "hardware.memory_gib": OPTIONAL_POSITIVE,
    "hardware.cuda_context_gib": NON_NEGATIVE,
    "hardware.tensor_core_multiple": NON_NEGATIVE,
    "measure.warmup_steps": NON_NEGATIVE,
    "distributed.nproc": POSITIVE_INT,
    "search.max_peak_gib": OPTIONAL_POSITIVE,
    "logger.init_timeout_s": POSITIVE,
}


def _get(job: Config, dotted: str) -> Any:
    value: Any = job
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def ranges(job: Config) -> None:
    """Every number in its range, and the keys that must agree with each other."""
    for key, (ok, allowed) in RANGES.items():
        value = _get(job, key)
        if value is None and "null" not in allowed:
            raise ConfigError(key, f"null is not allowed; allowed: {allowed}")
        if not ok(value):
            raise ConfigError(key, f"{value} is not allowed; allowed: {allowed}")
    per_step = job.accumulation.steps * job.distributed.nproc
    if job.batch_size % per_step:
        raise ConfigError("batch_size", f"{job.batch_size} is not divisible by accumulation.steps x distributed.nproc "
                                        f"= {per_step} (micro-batch = batch_size / both)")
    shapes.check_padding(job.max_seq_len, job.data.pad_to_multiple_of)
    m = job.model
    if m.hidden_size and m.num_heads and m.hidden_size % m.num_heads:
        raise ConfigError("model.num_heads", f"{m.num_heads} does not divide model.hidden_size={m.hidden_size}; "
                                             "allowed: a divisor of the hidden size")
    if m.num_heads and m.num_kv_heads and m.num_heads % m.num_kv_heads:
        raise ConfigError("model.num_kv_heads", f"{m.num_kv_heads} does not divide model.num_heads={m.num_heads}; "
                                                "allowed: a divisor of the number of attention heads")
    targets = job.lora.target_modules
    if not (targets is None or targets == "all-linear" or (isinstance(targets, (list, tuple)) and targets
                                                            and all(isinstance(t, str) for t in targets))):
        raise ConfigError("lora.target_modules", f"{targets!r} is not allowed; allowed: null (the attention's q/k/v "
                                                 "projections), all-linear, or a list of module names")


def inputs(job: Config) -> None:
    """What a training job will load, checked before it loads anything for training: the model's limits
    (from its config.json or architecture keys) against max_seq_len and the tokenizer, and the data."""
    from ..run import data, model, task

    config, source = model.config_values(job.model)  # also refuses a hub name that cannot be had offline
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    if limit is not None and job.max_seq_len > limit:
        raise ConfigError("max_seq_len", f"{job.max_seq_len} is above the model's position limit; allowed: an "
                                         f"integer from 1 to {limit} (max_position_embeddings, {source})")
    tokens, vocab = model.tokenizer_size(job.model), config.get("vocab_size")
    if vocab is not None and tokens > vocab:
        raise ConfigError("model.vocab_size", f"{vocab} is smaller than the tokenizer's {tokens} tokens ({source}); "
                                              f"allowed: at least {tokens}")
    labelled = task.labelled(job.task)
    train, evaluation, names = data.load_frames(job.data, job.seed, strict_sizes=True, labelled=labelled)
    for split, frame in (("train", train), ("eval", evaluation)) if labelled else ():
        present = sorted(set(frame["label"]))
        if len(present) < 2:
            raise ConfigError("data.label_column", f"the {split} split holds examples of {present} only; "
                                                   f"classification needs at least 2 of the classes {names} in both splits")
