"""Hydra callbacks (registered under `hydra.callbacks` in conf/config.yaml).

Hydra instantiates them at every start, also for `--help` and single runs: keep this module light
and import the report's pandas/matplotlib only when a multirun ends.
"""
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class SweepReport(Callback):
    """When a multirun ends: write the sweep summary, print its table, log the W&B summary run.

    Exit code: jobs ending `oom`, `diverged` or `unsupported` are results, the sweep succeeded (0).
    A job that `failed` (an error) or left no result makes the process exit 1 — after the summary
    is written, so the other jobs' results are never lost.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from . import report, sweep

        sweep_dir = str(config.hydra.sweep.dir)
        if OmegaConf.select(config, "mode") == "estimate":  # estimate.md instead of the measured summary
            from .estimate.table import write_sweep_table

            print("\n" + write_sweep_table(Path(sweep_dir)).read_text(), flush=True)
            return
        summary = report.build(Path(sweep_dir), OmegaConf.select(config, "report.baseline"), strict=False)
        report.write(summary)
        print("\n" + summary.markdown, flush=True)
        print(f"[memsweep] summary: {Path(sweep_dir) / 'summary.md'} (and summary.csv, memory.png, tradeoff.png)")
        logger = OmegaConf.select(config, "logger")
        if logger is not None and logger.enabled:
            run_dir = report.log_to_wandb(summary, logger, sweep.group_of(Path(sweep_dir), summary.jobs))
            print(f"[memsweep] W&B summary run: {run_dir}", flush=True)
        if summary.failed:
            listed = ", ".join(f"{j.num} ({j.status})" for j in summary.failed)
            print(f"[memsweep] error: {len(summary.failed)} job(s) failed or left no result: {listed}; "
                  "see traceback.txt in their job dirs", flush=True)
            # Hydra catches Exceptions raised by callbacks and only warns; SystemExit passes through.
            raise SystemExit(1)
