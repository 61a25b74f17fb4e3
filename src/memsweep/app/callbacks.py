"""Hydra callbacks (registered under `hydra.callbacks` in conf/config.yaml).

Hydra instantiates them at every start, also for `--help` and single runs: keep this module light
and import the sweep layer and the report's pandas/matplotlib only when a multirun starts (a report
written as the process exits cannot import them then).
"""
import os
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class JobProgress(Callback):
    """Before each job of a sweep: `[memsweep] job k/N: <overrides> (ETA for the sweep: ...)`.

    N is what the sweeper will run (its grid, or a search's trials). The ETA is the mean duration of
    the jobs this process has run so far times the jobs left: from the second job on, and only where
    jobs run one after another (Hydra's basic launcher); a launcher's worker processes each start
    with no job of their own done, so they show none. `progress=none` shows nothing.
    """

    def __init__(self) -> None:
        self.in_sweep = False
        self.total: int | None = None
        self.durations: list[float] = []
        self.started: float | None = None  # by the wall clock, as the results file's time is

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from ..sweep import sweepdir

        self.in_sweep, self.total = True, sweepdir.size(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()
        if not self.in_sweep or OmegaConf.select(config, "progress") == "none":
            return
        from ..measure import eta
        from ..sweep import sweepdir

        num = int(config.hydra.job.num)
        line = f"[memsweep] job {num + 1}" + (f"/{self.total}" if self.total else "")
        line += f": {sweepdir.job_name(list(config.hydra.overrides.task))}"
        if self.durations and self.total:
            mean = sum(self.durations) / len(self.durations)
            line += f" (ETA for the sweep: {eta.duration(mean * max(1, self.total - num))})"
        print(line, flush=True)

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        # A job that wrote no results now was skipped (done before a resume) and took no time of its own:
        # its ~0 s would make the ETA of the jobs still to run ~0 too.
        if self.started is not None and self.wrote_results(config):
            self.durations.append(time.time() - self.started)
        self.started = None

    def wrote_results(self, config: DictConfig) -> bool:
        from ..run.results import RESULTS_FILE

        written = Path(OmegaConf.select(config, "hydra.runtime.output_dir") or ".") / RESULTS_FILE
        return written.exists() and written.stat().st_mtime >= self.started


def _without_hydra(config: DictConfig) -> DictConfig:
    """The job config of a sweep's config (its typed schema kept), as a job gets it."""
    import copy

    from omegaconf import open_dict

    job = copy.deepcopy(config)
    with open_dict(job):
        del job["hydra"]
    return job


def refuse_a_search_that_cannot_run(config: DictConfig) -> None:
    """Every trial of a search whose metric or direction cannot work would be refused alike: refuse the
    search before the first (exit 2)."""
    import sys

    from ..config import validate, validate_names
    from ..errors import EXIT_CODES, ConfigError
    from ..sweep import search

    direction = OmegaConf.select(config, "hydra.sweeper.direction")  # a search (optuna) has one
    if direction is None:
        return
    try:
        job = validate.settings(_without_hydra(config))
        validate_names.search(job.task.name, job.search.metric, direction)
        search.check_space(OmegaConf.to_container(config.hydra.sweeper.params, resolve=False) or {})
    except ConfigError as exc:
        print(f"memsweep: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODES["bad input"]) from None


class SweepReport(Callback):
    """When a multirun ends, or is stopped: write the sweep summary, print its table, log the W&B summary run.

    A search that cannot run is refused before it starts (exit 2); a sweep that stops part-way still gets
    the summary of the jobs it ran. A stopped sweep exits 130/143, one with a job `failed`, without a result
    or stopped unsignalled exits 1, after the summary is written; otherwise 0 (`oom`, `diverged` and
    `unsupported` are results). Stopping and exit codes in full: docs/guide/sweeps.md.
    """

    def __init__(self) -> None:
        self.sweep_pid: int | None = None
        self.config: DictConfig | None = None
        self.ended = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import atexit

        from ..run import stopping

        refuse_a_search_that_cannot_run(config)
        from ..sweep import report  # noqa: F401 - imported now: at exit it could not be

        self.sweep_pid, self.config = os.getpid(), config
        atexit.register(self.report_if_stopped)
        # For the whole sweep: a stop between two jobs is kept, not lost. Not where the jobs run on a
        # cluster: this process only waits for them there, and Ctrl-C leaves it as before.
        if not str(OmegaConf.select(config, "hydra.launcher._target_")).endswith("SlurmLauncher"):
            stopping.install()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.sweep_pid is not None and os.getpid() != self.sweep_pid:
            from ..run import stopping

            stopping.install()  # a launcher's worker: its stop must outlive this job, for the next one

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        from ..run import stopping

        if os.getpid() == self.sweep_pid and stopping.requested() is not None:
            self.end(config)  # the jobs run in this process: none starts after this one

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.end(config)

    def report_if_stopped(self) -> None:
        """At exit, the summary of a sweep that did not reach its end (nothing when it did)."""
        if self.config is None or self.ended or os.getpid() != self.sweep_pid:
            return
        self.ended = True
        try:
            print("[memsweep] the sweep stopped before its end; summary of the jobs it ran:", flush=True)
            self.report(self.config)
        except Exception as exc:  # noqa: BLE001 - at exit: one line, never a traceback
            print(f"[memsweep] no summary: {type(exc).__name__}: {exc}", flush=True)

    def end(self, config: DictConfig) -> None:
        from ..errors import stopped_exit_code
        from ..run import stopping

        self.ended = True
        try:
            code = self.report(config)
            if (signum := stopping.requested()) is not None:
                print(f"[memsweep] sweep stopped by {stopping.name(signum)}; resume it with: "
                      f"python -m memsweep.resume {config.hydra.sweep.dir}", flush=True)
                code = stopped_exit_code(signum)
        finally:
            stopping.uninstall()
        if code:
            # Hydra catches Exceptions raised by callbacks and only warns; SystemExit passes through.
            raise SystemExit(code)

    @staticmethod
    def report(config: DictConfig) -> int:
        """Write and print the summary (estimate.md for mode=estimate); the sweep's exit code by its jobs (0 or 1)."""
        from ..config.schema import is_on
        from ..sweep import report, sweepdir

        sweep_dir = str(config.hydra.sweep.dir)
        if OmegaConf.select(config, "mode") == "estimate":  # estimate.md instead of the measured summary
            from ..sweep.estimates import write_sweep_table

            print("\n" + write_sweep_table(Path(sweep_dir)).read_text(), flush=True)
            return 0
        summary = report.build(Path(sweep_dir), OmegaConf.select(config, "report.baseline"), strict=False)
        report.write(summary)
        print("\n" + summary.markdown, flush=True)
        print(f"[memsweep] summary: {Path(sweep_dir) / 'summary.md'} (and summary.csv, memory.png, tradeoff.png)")
        logger = OmegaConf.select(config, "logger")
        if logger is not None and is_on(logger):
            run_dir = report.log_to_wandb(summary, logger, sweepdir.group_of(Path(sweep_dir), summary.jobs))
            print(f"[memsweep] W&B summary run: {run_dir}", flush=True)
        if (failed := report.failed_line(summary)) is not None:  # a traceback named only where one was written
            print(failed, flush=True)
        if summary.unfinished:
            listed = ", ".join(f"{j.num} ({j.status})" for j in summary.unfinished)
            print(f"[memsweep] {len(summary.unfinished)} job(s) stopped or not started: {listed}", flush=True)
        return 1 if summary.failed or summary.unfinished else 0
