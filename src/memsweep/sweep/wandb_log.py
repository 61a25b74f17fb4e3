"""Weights & Biases: offline unless WANDB_MODE=online, every file inside the job dir, fast offline fallback.

wandb's own console output (its banner at init, its history/summary block at finish) is turned off:
memsweep prints one line per run instead (`where`), so a job's summary is what stands out. wandb's
warnings and errors still print; the run's records are the same either way.
"""
import os
from pathlib import Path
from typing import Any

from ..config.schema import is_on

TAG_LIMIT = 64  # wandb refuses a longer tag ("Tags must be between 1 and 64 characters"): an override with a path


def _use_job_dir(job_dir: Path) -> None:
    # wandb otherwise writes under ~/.cache/wandb and ~/.local/share/wandb even offline.
    root = job_dir / "wandb"
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_CONFIG_DIR", ".config"),
                     ("WANDB_DATA_DIR", ".data")):
        path = root / sub if sub else job_dir
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)


def start(cfg, job_dir: Path, group: str, name: str, job_type: str, config: dict[str, Any],
          tags: list[str]) -> Any | None:
    """A W&B run, or None when `logger=none`. Online without a reachable server falls back to offline."""
    if not is_on(cfg):
        return None
    import wandb

    _use_job_dir(job_dir)
    mode = os.environ.get("WANDB_MODE", "offline")
    kwargs = dict(project=cfg.project, entity=cfg.entity, group=group, name=name, job_type=job_type,
                  config=config, tags=[t[:TAG_LIMIT] for t in [*tags, *cfg.tags]], dir=str(job_dir),
                  reinit="finish_previous")
    if mode == "online":
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=cfg.init_timeout_s, silent=True),
                              **kwargs)
        except Exception as exc:
            print(f"[memsweep] W&B online unreachable within {cfg.init_timeout_s:.0f} s "
                  f"({type(exc).__name__}); logging offline instead (make wandb-sync uploads later)")
    return wandb.init(mode="disabled" if mode == "disabled" else "offline", settings=wandb.Settings(silent=True),
                      **kwargs)


def finish(run, summary: dict[str, Any], exit_code: int = 0) -> None:
    if run is None:
        return
    run.summary.update(summary)
    run.finish(exit_code=exit_code)


def where(run) -> str | None:
    """The run in one line: its URL online, its dir offline; None without a run (or WANDB_MODE=disabled)."""
    if run is None or run.disabled:
        return None
    if run.offline:
        return f"{run.settings.sync_dir} (offline; make wandb-sync uploads it)"
    return run.settings.run_url
