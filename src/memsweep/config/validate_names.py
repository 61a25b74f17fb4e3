"""Free-text keys that name something, checked against what exists; keys of a group that is off; the
search's metric and direction against the task.

- `names`: `optim.scheduler` among transformers' SchedulerType, `data.encoding` among Python's text
  codecs, `distributed.backend` among TrainingArguments' `ddp_backend` choices;
- `switches`: a key of a group whose option is `none` (schema.Switch) set away from that option's value
  (`lora.quantize=nf4` with `lora=none`): the group would ignore it;
- `search`: a set `search.metric` the task reports, and a sweeper's direction that does not search for
  the worst value of it.
"""
import codecs
import dataclasses
from typing import Any

from ..errors import ConfigError
from .choices import METRICS, QUALITY
from .schema import CONF_DIR, Config, Switch, TaskName, is_on


def names(job: Config) -> None:
    _scheduler(job.optim.scheduler)
    _encoding(job.data.encoding)
    _backend(job.distributed.backend)


def _scheduler(name: str) -> None:
    from transformers.trainer_utils import SchedulerType

    known = [s.value for s in SchedulerType]
    if name not in known:
        raise ConfigError("optim.scheduler", f"{name!r} is not a learning-rate scheduler of transformers; allowed: "
                                             f"{', '.join(known)} (transformers' SchedulerType)")


def _encoding(name: str) -> None:
    try:
        text = getattr(codecs.lookup(name), "_is_text_encoding", True)
    except LookupError:
        text = None
    if not text:
        what = "not a text encoding (a bytes-to-bytes codec)" if text is False else "not an encoding Python knows"
        raise ConfigError("data.encoding", f"{name!r} is {what}; allowed: a text codec of Python's codecs, e.g. "
                                           "utf-8, utf-8-sig, latin-1, cp1252, utf-16")


def _backend(name: str) -> None:
    if name == "auto":
        return
    from transformers import TrainingArguments

    choices = {f.name: f for f in dataclasses.fields(TrainingArguments)}["ddp_backend"].metadata.get("choices", [])
    if name not in choices:
        raise ConfigError("distributed.backend", f"{name!r} is not a distributed backend; allowed: auto (gloo on the "
                                                 f"CPU, nccl on GPUs), {', '.join(choices)} "
                                                 "(TrainingArguments.ddp_backend)")


def _off_values(group: str, section: Any) -> Any:
    """The group's keys as its `none` option sets them."""
    from omegaconf import OmegaConf

    option = CONF_DIR / group / "none.yaml"
    node = OmegaConf.structured(type(section))
    return OmegaConf.to_object(OmegaConf.merge(node, OmegaConf.load(option)) if option.is_file() else node)


def switches(job: Config) -> None:
    """A key of a group that is off, set: refused, as the group would ignore it."""
    for f in dataclasses.fields(Config):
        section = getattr(job, f.name)
        if not isinstance(section, Switch) or is_on(section):
            continue
        off = _off_values(f.name, section)
        for key in (g.name for g in dataclasses.fields(section) if g.name != "name"):
            value = getattr(section, key)
            if value != getattr(off, key):
                options = sorted(p.stem for p in (CONF_DIR / f.name).glob("*.yaml") if p.stem != "none")
                shown = getattr(value, "value", value)
                raise ConfigError(f"{f.name}.{key}", f"{shown!r} is set but {f.name} is off ({f.name}=none), which "
                                                     f"ignores it; allowed: turn {f.name} on ({f.name}="
                                                     f"{'|'.join(options)}) or leave {f.name}.{key} unset")


def search(task_name, metric: str | None, direction: str | None = None) -> None:
    """A set metric the task reports; a direction that looks for the best value of it, not the worst."""
    name = TaskName(getattr(task_name, "value", task_name))
    produced, default = METRICS[name], QUALITY[name][0]
    if metric is not None and metric not in produced:
        raise ConfigError("search.metric", f"{metric!r} is not a metric task={name.value} reports; allowed: "
                                           f"{', '.join(produced)} (null: {default})")
    want = "maximize" if produced[metric or default] else "minimize"
    given = str(getattr(direction, "name", direction)) if direction is not None else None
    if given is not None and given != want:
        raise ConfigError("hydra.sweeper.direction", f"{given} would search for the worst {metric or default} "
                                                     f"({'higher' if want == 'maximize' else 'lower'} is better); "
                                                     f"allowed: {want} (or leave it unset: it follows search.metric)")
