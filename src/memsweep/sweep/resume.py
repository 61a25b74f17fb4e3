"""Resume a sweep: run it again into its own dir; jobs already done keep their result and are skipped.

    python train.py -m <the same overrides> hydra.sweep.dir=<sweep dir>
    python -m memsweep.resume <sweep dir> [more overrides]   # re-reads the overrides from multirun.yaml
    make sweep SWEEP=<sweep dir>                               # the `make sweep` grid

A job is done when its results.json is complete, has the config hash of the job about to run, and its
status is a measurement (`errors.KEPT_ON_RESUME`: ok, oom, diverged, unsupported). An error is worth
another try, and a job `interrupted` or `not started` (a stopped sweep) runs again.
Any other job runs again; what an earlier attempt left (its results.json, traceback, W&B run) is
moved to <job dir>/attempts/<n>/ first, so each job ends with one result and one W&B run to sync.
"""
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..errors import EXIT_CODES, KEPT_ON_RESUME
from ..run import results
from . import sweepdir

LEFTOVERS = (results.RESULTS_FILE, "traceback.txt", "wandb/offline-run-*", "wandb/run-*")


def completed(job_dir: Path, cfg_hash: str) -> dict[str, Any] | None:
    """The saved results if this job is done with this exact config, else None."""
    saved = results.read(Path(job_dir) / results.RESULTS_FILE)
    if saved is None or saved.get("config_hash") != cfg_hash or saved["status"] not in KEPT_ON_RESUME:
        return None
    return saved


def set_aside_previous_attempt(job_dir: Path) -> Path | None:
    """Move an earlier attempt's files to attempts/<n>/; returns that dir (None: nothing to move)."""
    job_dir = Path(job_dir)
    found = [p for pattern in LEFTOVERS for p in sorted(job_dir.glob(pattern)) if not p.is_symlink()]
    if not found:
        return None
    n = 1 + sum(1 for _ in job_dir.glob("attempts/*"))
    dest = job_dir / "attempts" / str(n)
    for path in found:
        target = dest / path.relative_to(job_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
    return dest


def skip_if_done(cfg: DictConfig) -> dict[str, Any] | None:
    """The hook at the top of job.run. In a multirun: the saved results of a job already done (the
    caller returns them), else None after setting aside an earlier attempt. Single runs always run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    job_dir = Path(hc.runtime.output_dir)
    name = sweepdir.job_name(list(hc.overrides.task))
    saved = completed(job_dir, results.config_hash(cfg))
    if saved is not None:
        print(f"[memsweep] {name}: skipped (done: {saved['status']}, {job_dir / results.RESULTS_FILE})", flush=True)
        return saved
    moved = set_aside_previous_attempt(job_dir)
    if moved is not None:
        print(f"[memsweep] {name}: running again; the earlier attempt's files are in {moved}", flush=True)
    return None


def resume_command(sweep_dir: Path, extra: list[str]) -> list[str]:
    """`train.py -m` arguments: the sweep's own overrides (multirun.yaml), into the same dir."""
    hydra_overrides = [o for o in sweepdir.multirun_value(sweep_dir, "hydra.overrides.hydra") or []
                       if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    task = list(sweepdir.multirun_value(sweep_dir, "hydra.overrides.task") or [])
    # the dir spelled as it was launched: the jobs' W&B group is made from that spelling
    return ["-m", *hydra_overrides, *task, f"hydra.sweep.dir={sweepdir.launched_dir(sweep_dir)}", *extra]


def refuse(message: str) -> None:
    """Bad input to resume: one line naming what was wrong, exit 2 (errors.EXIT_CODES), as train.py's."""
    print(f"memsweep: error: sweep_dir: {message}", file=sys.stderr)
    sys.exit(EXIT_CODES["bad input"])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m memsweep.resume multirun/<date>/<time> [overrides]"
    if not argv:
        refuse(f"none given; allowed: {usage}")
    if not (Path(argv[0]) / sweepdir.MULTIRUN_FILE).is_file():
        refuse(f"{argv[0]} is not a sweep dir (no multirun.yaml); allowed: {usage}")
    train_py = Path(__file__).resolve().parents[3] / "train.py"
    if not train_py.is_file():
        refuse(f"{train_py} not found; allowed: a sweep dir of a source checkout (resume runs its train.py)")
    command = [sys.executable, str(train_py), *resume_command(Path(argv[0]), argv[1:])]
    print("[memsweep] resuming: " + " ".join(command[1:]), flush=True)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
