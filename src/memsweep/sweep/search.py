"""The objective a hyperparameter sweeper (hparams_search=optuna) maximises: one job's metric, under a memory budget."""
from typing import Any, Optional

from ..config.schema import SearchConf


def objective(res: dict[str, Any], cfg: SearchConf) -> Optional[float]:
    """The job's metric, or None (a failed trial) when it did not end ok or its peak is over budget."""
    if res.get("status") != "ok":
        return None
    peak = res["memory"].get("peak_bytes")
    if cfg.max_peak_gib is not None and (peak is None or peak > cfg.max_peak_gib * 2**30):
        return None
    value = res["metrics"].get(cfg.metric)
    return float(value) if value is not None else None
