"""Jobs that span several processes (`distributed.nproc=N`): torchrun starts the ranks (rank.py), or,
on Slurm, submitit's tasks are the ranks. The job's process waits and turns rank 0's gathered
result, or the first rank's error, into the job's result.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import stopping
from ..errors import STATUS_EXCEPTIONS, ConfigError
from . import procenv, rank
from .results import Result, read


def torchrun_command(nproc: int, job_dir: Path) -> list[str]:
    # --standalone: a rendezvous on a free local port, so jobs of a sweep never share one.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "memsweep.run.rank", str(job_dir)]


def task_group() -> tuple[int, int] | None:
    """(rank, number of tasks) when this process is one of several submitit tasks of one job (Slurm's
    `hydra.launcher.tasks_per_node`, or submitit's local executor); None otherwise."""
    try:
        import submitit

        env = submitit.JobEnvironment()
    except (ImportError, RuntimeError):  # RuntimeError: not inside a submitit job
        return None
    return (env.global_rank, env.num_tasks) if env.num_tasks > 1 else None


def spans_processes(job) -> bool:
    """`distributed.nproc` > 1: the job runs as several ranks, started here."""
    return job.distributed.nproc > 1


def is_secondary_task() -> bool:
    """A submitit task of a multi-process job other than its rank 0 (which writes the job's results)."""
    task = task_group()
    return task is not None and task[0] > 0


def join_task_group(nproc: int) -> int:
    """Set torch.distributed's env:// variables from the submitit task (its rank, the first node as master)."""
    from submitit.helpers import TorchDistributedEnvironment

    task_rank, tasks = task_group()
    if tasks != nproc:
        raise ConfigError("distributed.nproc", f"is {nproc} but the launcher started {tasks} tasks for this job; "
                                               f"set hydra.launcher.tasks_per_node to distributed.nproc")
    TorchDistributedEnvironment().export(overwrite=True)
    return task_rank


def run_secondary_task(job, job_dir: Path) -> dict:
    """Ranks 1.. of a submitit task group: train as a rank; rank 0's task writes the job's results."""
    join_task_group(job.distributed.nproc)
    rank.run_rank(job, job_dir)
    return {}


def run_ranks(job, job_dir: Path, res: Result) -> None:
    """Run `job` on distributed.nproc processes and fill `res` from what rank 0 gathered: with torchrun,
    or, inside a submitit task group, as its rank 0 (the other tasks run run_secondary_task).

    A rank that fails leaves its status in error.json (and under torchrun the others are stopped); that
    status is raised here as the exception `errors.outcome` maps to it (oom, diverged, unsupported, failed).
    """
    from omegaconf import OmegaConf

    ranks_dir = job_dir / rank.RANKS_DIR
    if task_group() is not None:  # the other tasks are already running: clear only the old result
        (ranks_dir / rank.RESULT_FILE).unlink(missing_ok=True)
        join_task_group(job.distributed.nproc)
        returncode = rank.run_rank(job, job_dir)
    else:
        shutil.rmtree(ranks_dir, ignore_errors=True)  # a resumed job must not read an old attempt's files
        ranks_dir.mkdir(parents=True)
        OmegaConf.save(OmegaConf.structured(job), ranks_dir / rank.JOB_FILE)
        env = procenv.without_group_variables()
        if job.threads is None:  # the cores shared out between the ranks (torchrun's own default is 1)
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.distributed.nproc))
        # The ranks share the terminal's process group: a Ctrl-C reaches them, and each ends itself
        # interrupted. This process waits for them instead of killing torchrun under them.
        with stopping.deferred():
            returncode = subprocess.run(torchrun_command(job.distributed.nproc, job_dir), env=env).returncode
    if returncode == 0 and (ranks_dir / rank.RESULT_FILE).exists():
        res.merge(read(ranks_dir / rank.RESULT_FILE), sections=("metrics", "time", "memory", "effective", "data"))
        return
    errors = [read(f) for f in sorted(ranks_dir.glob(f"rank*/{rank.ERROR_FILE}"))]
    if not errors:
        stopping.check(f"while its ranks ran (torchrun exited with {returncode})")
        raise RuntimeError(f"the ranks exited with {returncode} and none left a result or an error")
    status, reason = errors[0]["status"], f"rank {errors[0]['rank']}: {errors[0]['reason']}"
    raise STATUS_EXCEPTIONS.get(status, RuntimeError)(reason)
