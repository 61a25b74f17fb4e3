"""`python -m memsweep.app.estimate [-m] <overrides> [--grid <overrides>]... [--by <key>]`: estimate a job or
a sweep grid offline (no training, no weights, no GPU); estimate.json per job, estimate.md for the sweep,
and with --by a table with one column group per value of that key (e.g. one per GPU). The console shows
memsweep's lines; what the libraries say (warnings, their lines as they load) goes to <out>/estimate.log
(run/console.py)."""
import json
import os
import sys
import time
from pathlib import Path

from ..config import schema, validate
from ..config.schema import Config
from ..errors import EXIT_CODES, ConfigError, outcome, stopped_exit_code
from ..run import console, inputs, stopping
from ..sweep import sweepdir
from ..sweep.estimates import write_pivot_table, write_sweep_table


def compose(overrides: list[str]) -> Config:
    """The job of the overrides in estimate mode, checked as train.py's jobs are (run/inputs.job)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    validate.arguments(overrides, multirun=False)  # one line for `model=nosuch`, as train.py gives
    schema.register_configs()
    try:
        with initialize_config_dir(config_dir=str(schema.CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=overrides + ["mode=estimate"])
    except HydraException as exc:
        raise validate.composition_error(exc) from None
    return inputs.job(cfg)


def jobs_of(overrides: list[str], grids: list[list[str]] | None) -> list[list[str]]:
    """The jobs of the overrides, or of each grid added to them: their union in order, each job once."""
    jobs: dict[tuple[str, ...], None] = {}
    for grid in grids or [[]]:
        for job in sweepdir.expand(overrides + grid):
            jobs.setdefault(tuple(job), None)
    return [list(job) for job in jobs]


def command_line_ok(overrides: list[str], out: Path) -> bool:
    """The command line checked as train.py checks it (one line for `model=nosuch`, `lr=3e−4`, a thousands
    separator in a grid); library warnings from here on to out/estimate.log."""
    console.library_noise_to_log(out / "estimate.log")
    try:
        validate.arguments(overrides, multirun=True)
        return True
    except ConfigError as exc:
        print(f"memsweep: error: {exc}", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m memsweep.app.estimate",
                                     description="Estimate the peak memory, FLOPs and step time of a job or a "
                                                 "sweep grid offline (no training, no weights, no GPU).")
    parser.add_argument("-m", "--multirun", action="store_true", help="accepted for symmetry with train.py; "
                        "comma-separated values always make a grid")
    parser.add_argument("--out", type=Path, default=None, help="sweep dir (default outputs/estimate/<date>/<time>)")
    parser.add_argument("--grid", nargs="+", action="append", metavar="OVERRIDE",
                        help="a grid of its own added to the overrides (repeat it: the jobs are the union of the "
                             "grids, for sets of combinations that are not one product)")
    parser.add_argument("--by", metavar="KEY", help="also print and write estimate-by-<KEY>.md: one row per "
                        "combination of the other keys, fits / margin / used / time per value of KEY")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sizes come from config files and keys, never the hub
    out = args.out or Path("outputs/estimate") / time.strftime("%Y-%m-%d/%H-%M-%S")
    if not command_line_ok(args.overrides + [o for grid in args.grid or [] for o in grid], out):
        return EXIT_CODES["bad input"]
    console.quiet_libraries()  # what torch, torchao, bitsandbytes... say as they load, to out/estimate.log
    started = time.perf_counter()
    jobs = jobs_of(args.overrides, args.grid)
    memo: dict = {}  # one trace per job and device: profiles of one device differ only after it
    statuses = []
    with stopping.handling():  # Ctrl-C / SIGTERM: the estimate in progress ends interrupted, no further one starts
        for n, overrides in enumerate(jobs):
            if stopping.requested() is not None:
                record(out / str(n), overrides, "not started", "stopped before this estimate began")
                continue
            statuses.append(estimate_one(out / str(n), n, overrides, memo))
        table = write_sweep_table(out)
        if args.by:  # the long table is in estimate.md; the one asked for is printed
            table = write_pivot_table(out, args.by)
        print("\n" + table.read_text(), flush=True)
        made = f"{len(statuses)} of {len(jobs)}" if len(statuses) < len(jobs) else str(len(jobs))
        print(f"[memsweep] {made} estimate(s) in {time.perf_counter() - started:.1f} s: {table}")
        if (signum := stopping.requested()) is not None:
            print(f"[memsweep] stopped by {stopping.name(signum)}: the estimates not made are listed `not started`",
                  flush=True)
            return stopped_exit_code(signum)
    return EXIT_CODES["failed"] if "failed" in statuses else EXIT_CODES["bad input"] if "bad input" in statuses else 0


def record(job_dir: Path, overrides: list[str], status: str | None = None, reason: str = "") -> None:
    """A job's overrides, and how it ended when no estimate was made (status.json)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for stale in (sweepdir.ESTIMATE_FILE, sweepdir.STATUS_FILE):  # from an earlier run into the same dir
        (job_dir / stale).unlink(missing_ok=True)
    (job_dir / sweepdir.OVERRIDES_FILE).write_text(json.dumps(overrides))
    if status is not None:
        (job_dir / sweepdir.STATUS_FILE).write_text(json.dumps({"status": status, "reason": reason[:500]}))


def estimate_one(job_dir: Path, n: int, overrides: list[str], memo: dict) -> str:
    """Estimate one job into its dir; its status (ok, unsupported, interrupted, failed)."""
    from ..config import hardware
    from ..estimate.core import run_estimate  # torch and the rest: imported after quiet_libraries

    record(job_dir, overrides)
    print(f"[memsweep] #{n} {' '.join(overrides)}", flush=True)
    try:
        with stopping.interruptible("during the estimate"):
            job = compose(overrides)
            run_estimate(job, hardware.detect(job.hardware), job_dir, memo)
    except Exception as exc:  # noqa: BLE001 - one job's bad input or error must not lose the sweep
        status, reason = outcome(exc)
        record(job_dir, overrides, status, reason)
        print(f"memsweep: error: {exc}" if isinstance(exc, ConfigError) else f"[memsweep] {status}: {exc}", flush=True)
        return "bad input" if isinstance(exc, ConfigError) else status
    return "ok"


if __name__ == "__main__":
    sys.exit(main())
