"""torch.distributed for one job: a one-process group for DeepSpeed on a single machine, teardown, and
jobs that span several processes (`distributed.nproc=N`, started by torchrun; each rank runs rank.py).
"""
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# The environment before this process made its own group; Trainer and Accelerate add variables
# (ACCELERATE_USE_DEEPSPEED, ...) that would make the next job of a sweep think it is distributed.
_ENV_BEFORE: dict[str, str] | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env() -> None:
    """DeepSpeed needs a process group even alone; without a launcher, make it a group of one."""
    global _ENV_BEFORE
    if "WORLD_SIZE" in os.environ:  # torchrun / srun / deepspeed launcher already set it
        return
    _ENV_BEFORE = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")


def teardown() -> None:
    """Destroy a group this job made and reset Accelerate's singletons, so the next job starts clean."""
    global _ENV_BEFORE
    import torch.distributed as dist

    if _ENV_BEFORE is None:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(_ENV_BEFORE)
    _ENV_BEFORE = None
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    _forget_deepspeed_groups()


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches the process groups (and its comm backend) in module globals, and transformers
    its ZeRO config: none of them may leak into the next job of the same process."""
    import sys

    hf_deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    if hf_deepspeed is not None:  # else the next from_pretrained builds its model under ZeRO-3's zero.Init
        hf_deepspeed.unset_hf_deepspeed_config()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:
        for name in [n for n in vars(groups) if n.startswith("_") and n.isupper() and ("GROUP" in n or "MPU" in n)]:
            setattr(groups, name, {} if isinstance(getattr(groups, name), dict) else None)
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None:
        comm.cdb = None


# Files of a multi-process job, under its job dir: the job the ranks run, each rank's own dir (its
# Trainer output, and error.json if it failed) and the result rank 0 gathered.
RANKS_DIR = "ranks"
JOB_FILE = "job.yaml"
RESULT_FILE = "result.json"
ERROR_FILE = "error.json"


def torchrun_command(nproc: int, job_dir: Path) -> list[str]:
    # --standalone: a rendezvous on a free local port, so jobs of a sweep never share one.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "memsweep.rank", str(job_dir)]


def task_group() -> tuple[int, int] | None:
    """(rank, number of tasks) when this process is one of several submitit tasks of one job (Slurm's
    `hydra.launcher.tasks_per_node`, or submitit's local executor); None otherwise."""
    try:
        import submitit

        env = submitit.JobEnvironment()
    except (ImportError, RuntimeError):  # RuntimeError: not inside a submitit job
        return None
    return (env.global_rank, env.num_tasks) if env.num_tasks > 1 else None


def join_task_group(nproc: int) -> int:
    """Set torch.distributed's env:// variables from the submitit task (its rank, the first node as master)."""
    from submitit.helpers import TorchDistributedEnvironment

    from .errors import ConfigError

    rank, tasks = task_group()
    if tasks != nproc:
        raise ConfigError("distributed.nproc", f"is {nproc} but the launcher started {tasks} tasks for this job; "
                                               f"set hydra.launcher.tasks_per_node to distributed.nproc")
    TorchDistributedEnvironment().export(overwrite=True)
    return rank


def run_secondary_task(job, job_dir: Path) -> dict[str, Any]:
    """Ranks 1.. of a submitit task group: train as a rank; rank 0's task writes the job's results."""
    from . import rank

    join_task_group(job.distributed.nproc)
    rank.run_rank(job, job_dir)
    return {}


def run_ranks(job, job_dir: Path, res: dict[str, Any]) -> None:
    """Run `job` on distributed.nproc processes and fill `res` from what rank 0 gathered: with torchrun,
    or, inside a submitit task group, as its rank 0 (the other tasks run run_secondary_task).

    A rank that fails leaves its status in error.json (and under torchrun the others are stopped); that
    status is raised here as the exception job.py maps to it (oom, diverged, unsupported, failed).
    """
    try:
        _run_ranks(job, job_dir, res)
    finally:
        teardown()  # the estimate may have made this process a group of one for DeepSpeed


def _run_ranks(job, job_dir: Path, res: dict[str, Any]) -> None:
    import shutil

    from omegaconf import OmegaConf

    from . import rank
    from .errors import Diverged, Unsupported
    from .results import read

    ranks_dir = job_dir / RANKS_DIR
    if task_group() is not None:  # the other tasks are already running: clear only the old result
        (ranks_dir / RESULT_FILE).unlink(missing_ok=True)
        join_task_group(job.distributed.nproc)
        returncode = rank.run_rank(job, job_dir)
    else:
        shutil.rmtree(ranks_dir, ignore_errors=True)  # a resumed job must not read an old attempt's files
        ranks_dir.mkdir(parents=True)
        OmegaConf.save(OmegaConf.structured(job), ranks_dir / JOB_FILE)
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        if job.threads is None:  # the cores shared out between the ranks (torchrun's own default is 1)
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.distributed.nproc))
        returncode = subprocess.run(torchrun_command(job.distributed.nproc, job_dir), env=env).returncode
    if returncode == 0 and (ranks_dir / RESULT_FILE).exists():
        gathered = read(ranks_dir / RESULT_FILE)
        for key in ("metrics", "time", "memory", "effective", "data"):
            res[key] = {**(res.get(key) or {}), **gathered[key]}
        return
    errors = [read(f) for f in sorted(ranks_dir.glob(f"rank*/{ERROR_FILE}"))]
    if not errors:
        raise RuntimeError(f"the ranks exited with {returncode} and none left a result or an error")
    status, reason = errors[0]["status"], f"rank {errors[0]['rank']}: {errors[0]['reason']}"
    raise {"oom": MemoryError, "diverged": Diverged, "unsupported": Unsupported}.get(status, RuntimeError)(reason)
