"""Weights & Biases: offline unless WANDB_MODE=online, every file inside the job dir, fast offline fallback."""
import os
from pathlib import Path
from typing import Any, Optional


def _use_job_dir(job_dir: Path) -> None:
    # wandb otherwise writes under ~/.cache/wandb and ~/.local/share/wandb even offline.
    root = job_dir / "wandb"
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_CONFIG_DIR", ".config"),
                     ("WANDB_DATA_DIR", ".data")):
        path = root / sub if sub else job_dir
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)


def start(cfg, job_dir: Path, group: str, name: str, job_type: str, config: dict[str, Any],
          tags: list[str]) -> Optional[Any]:
    """A W&B run, or None when `logger=none`. Online without a reachable server falls back to offline."""
    if not cfg.enabled:
        return None
    import wandb

    _use_job_dir(job_dir)
    mode = os.environ.get("WANDB_MODE", "offline")
    kwargs = dict(project=cfg.project, entity=cfg.entity, group=group, name=name, job_type=job_type,
                  config=config, tags=list(tags) + list(cfg.tags), dir=str(job_dir), reinit="finish_previous")
    if mode == "online":
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=cfg.init_timeout_s), **kwargs)
        except Exception as exc:
            print(f"[memsweep] W&B online unreachable within {cfg.init_timeout_s:.0f} s "
                  f"({type(exc).__name__}); logging offline instead (make wandb-sync uploads later)")
    return wandb.init(mode="disabled" if mode == "disabled" else "offline", **kwargs)


def finish(run, summary: dict[str, Any], exit_code: int = 0) -> None:
    if run is None:
        return
    run.summary.update(summary)
    run.finish(exit_code=exit_code)
