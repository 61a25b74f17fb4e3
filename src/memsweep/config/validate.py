"""Bad input is refused before any work: one line naming the key, the value and what is allowed.

What a type cannot say about the keys on their own (no model, no data, no library), the same in every mode
(`settings`): keys the schema lacks and values unset or unresolved (`config`), numbers out of range and keys
that must agree (`ranges`, `nodes`); the command line is checked by validate_args.py, switched-off groups and
the search's metric by validate_names.py. What the keys name is checked by run/inputs.py.

What each check covers: docs/guide/validation.md.
"""
import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from . import validate_names
from .schema import Config
from .validate_args import arguments, composition_error, field_type, group_options, known

__all__ = ["arguments", "composition_error", "group_options", "settings", "config", "ranges", "nodes",
           "check_padding"]


def settings(cfg: DictConfig) -> Config:
    """The keys on their own (no library imported): unknown keys, ranges, groups that are off, a search
    metric the task does not report."""
    config(cfg)
    checked: Config = OmegaConf.to_object(cfg)
    ranges(checked)
    validate_names.switches(checked)
    validate_names.search(checked.task.name, checked.search.metric)
    return checked


def config(cfg: DictConfig) -> None:
    """Refuse keys the schema does not know, at any depth (free-form `tags` excepted), a required value
    left unset and an interpolation that does not resolve."""
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    container = OmegaConf.to_container(cfg, resolve=False)
    for path in _unknown(container, Config, ""):
        raise ConfigError(path, f"is not a memsweep key; the keys here are {known(path)}")
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise ConfigError(exc.full_key, f"has no value (??? in its config group) and needs one; set it: "
                                        f"{exc.full_key}=...") from None
    except InterpolationResolutionError as exc:
        raise ConfigError(exc.full_key, f"{str(exc).splitlines()[0]}; allowed: an interpolation of an existing "
                                        "key, e.g. ${optim.lr}") from None


def _unknown(node: Any, schema: type, prefix: str) -> list[str]:
    import dataclasses

    if not isinstance(node, dict) or not dataclasses.is_dataclass(schema):
        return []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    found = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if key not in fields:
            found.append(path)
        elif dataclasses.is_dataclass(field_type(fields[key])):
            found += _unknown(value, field_type(fields[key]), path + ".")
    return found


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
    "deepspeed.reduce_bucket_size": (lambda v: v is None or v > 0,
                                     'null (Trainer\'s "auto": hidden_size**2) or an integer > 0 (gradient values)'),
    "dataloader.num_workers": NON_NEGATIVE,
    "dataloader.prefetch_factor": OPTIONAL_POSITIVE,
    "hardware.memory_gib": OPTIONAL_POSITIVE,
    "hardware.cuda_context_gib": NON_NEGATIVE,
    "hardware.tensor_core_multiple": NON_NEGATIVE,
    "measure.warmup_steps": NON_NEGATIVE,
    "distributed.nproc": POSITIVE_INT,
    "distributed.nodes": POSITIVE_INT,
    "distributed.network_gbs": OPTIONAL_POSITIVE,
    "hardware.interconnect_gbs": OPTIONAL_POSITIVE,
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
    nodes(job.distributed)
    per_step = job.accumulation.steps * job.distributed.world_size
    if job.batch_size % per_step:
        raise ConfigError("batch_size", f"{job.batch_size} is not divisible by accumulation.steps x distributed.nodes "
                                        f"x distributed.nproc = {per_step} (micro-batch = batch_size / all three)")
    check_padding(job.max_seq_len, job.data.pad_to_multiple_of)
    targets = job.lora.target_modules
    if not (targets is None or targets == "all-linear" or (isinstance(targets, (list, tuple)) and targets
                                                            and all(isinstance(t, str) for t in targets))):
        raise ConfigError("lora.target_modules", f"{targets!r} is not allowed; allowed: null (the attention's q/k/v "
                                                 "projections), all-linear, or a list of module names")
    if job.lora.double_quant and job.lora.quantize.value != "nf4":
        raise ConfigError("lora.double_quant", f"true applies to 4-bit NF4 weights only (lora=qlora), not "
                                               f"lora.quantize={job.lora.quantize.value}; allowed here: false")


def nodes(dist) -> None:
    """This machine's place among the job's nodes, and where they meet (torchrun's rendezvous outside Slurm)."""
    if not 0 <= dist.node_rank < dist.nodes:
        raise ConfigError("distributed.node_rank", f"{dist.node_rank} is not allowed; allowed: an integer from 0 to "
                                                   f"distributed.nodes - 1 = {dist.nodes - 1} (this machine's place)")
    if dist.rdzv_endpoint is not None and _host_port(dist.rdzv_endpoint) is None:
        raise ConfigError("distributed.rdzv_endpoint", f"{dist.rdzv_endpoint!r} is not allowed; allowed: null or "
                                                       "host:port of node 0 (port 1-65535), e.g. 10.0.0.1:29500")


def check_padding(max_seq_len: int, pad_to_multiple_of: int | None) -> None:
    """Batches are cut to max_seq_len, then padded to the multiple: a longest batch must stay max_seq_len
    long, as the measured (and estimated) step pads to exactly that length."""
    if pad_to_multiple_of is None:
        return
    if pad_to_multiple_of <= 0 or max_seq_len % pad_to_multiple_of:
        raise ConfigError("data.pad_to_multiple_of", f"{pad_to_multiple_of} must be a positive divisor of "
                                                     f"max_seq_len={max_seq_len} (or null)")


def _host_port(endpoint: str) -> tuple[str, int] | None:
    host, _, port = endpoint.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return host, int(port)
