"""Bad input is refused before any work: one line naming the key, the value and what is allowed.

The keys on their own (no model, no data, no library), the same in every mode (`settings`): keys the schema
lacks and values unset or unresolved (`config`), values outside what schema.py declares for them
(constraints.py) and keys that must agree (`ranges`, `nodes`); the command line is checked by validate_args.py,
switched-off groups and the search's metric by validate_names.py. What the keys name is checked by run/inputs.py.

What each check covers: docs/guide/validation.md.
"""
import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from . import constraints, validate_names
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


def ranges(job: Config) -> None:
    """Every key within what schema.py declares for it (constraints.py), and the keys that must agree."""
    constraints.check(Config, dataclasses.asdict(job))
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
