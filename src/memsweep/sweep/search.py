"""hparams_search=optuna: the objective of one trial (its metric, under a memory budget), and the direction
of the search, both following the task unless `search.metric` names another metric it reports."""
from typing import Any

from ..config.choices import METRICS, QUALITY
from ..config.schema import SearchConf, TaskName
from ..errors import ConfigError, naming

RESOLVER = "memsweep_direction"  # conf/hparams_search/optuna.yaml: hydra.sweeper.direction


def metric(cfg: SearchConf, task_name) -> str:
    """The metric a search optimises: `search.metric`, else the task's quality metric (config/choices.py)."""
    return cfg.metric or QUALITY[TaskName(getattr(task_name, "value", task_name))][0]


def direction(task_name, metric_name: str | None) -> str:
    """`maximize` or `minimize`, as the metric is better higher or lower. A metric the task does not report
    gets `maximize` here and is refused before the first trial (config/validate_names.search)."""
    name = TaskName(getattr(task_name, "value", task_name))
    higher = METRICS[name].get(metric_name or QUALITY[name][0], True)
    return "maximize" if higher else "minimize"


def register_resolver() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(RESOLVER, direction, replace=True)


def objective(res: dict[str, Any], cfg: SearchConf, task_name=TaskName.classification) -> float | None:
    """The job's metric, or None (a failed trial) when it did not end ok or its peak is over budget."""
    if res.get("status") != "ok":
        return None
    peak = res["memory"].get("peak_bytes")
    if cfg.max_peak_gib is not None and (peak is None or peak > cfg.max_peak_gib * 2**30):
        return None
    value = res["metrics"].get(metric(cfg, task_name))
    return float(value) if value is not None else None


def check_space(params: dict[str, Any]) -> None:
    """The search space (`hydra.sweeper.params`), refused before the first trial where a trial would be: a key
    memsweep does not have, a bound or choice its declaration (schema.py) does not allow, an empty interval."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    from ..config import constraints
    from ..config.schema import Config

    parser = OverridesParser.create()
    for key, text in params.items():
        where = f"hydra.sweeper.params.{key}"
        if constraints.annotation(Config, key) is None:
            raise ConfigError(where, f"{key} is not a memsweep key a trial can set")
        with naming(where, "choice(a, b, ...), interval(low, high), range(start, stop, step) or a value"):
            space = parser.parse_override(f"{key}={text}").value()
        values = [space.start, space.end] if isinstance(space, IntervalSweep) else (
            list(space.list) if isinstance(space, ChoiceSweep) else [space.start] if isinstance(space, RangeSweep)
            else [space])
        for value in values:
            try:
                constraints.check_value(Config, key, value)
            except ConfigError as exc:
                raise ConfigError(where, f"{text}: {str(exc).removeprefix(key + ': ')}") from None
        if isinstance(space, IntervalSweep) and not space.start < space.end:
            raise ConfigError(where, f"{text} is empty; allowed: interval(low, high) with low < high")
