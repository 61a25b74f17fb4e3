"""Jobs that span several processes (`distributed.nproc=N` per node, on `distributed.nodes=M` machines):
torchrun starts each node's ranks (rank.py), or, on Slurm, submitit's tasks are the ranks. The job's
process waits and turns global rank 0's gathered result, or the first rank's error, into the job's result.

Outside Slurm every machine runs its own `train.py` with its `distributed.node_rank`; their torchruns meet at
`distributed.rdzv_endpoint`. Global rank 0 is on node 0, whose job writes the job's results; the job of
another node records only its own ranks.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import STATUS_EXCEPTIONS, ConfigError
from . import ds_ops, procenv, rank, stopping
from .results import Result, read


def torchrun_command(dist, job_dir: Path) -> list[str]:
    """torchrun for this node's `dist.nproc` ranks (dist: schema.DistributedConf)."""
    if dist.nodes == 1:  # a rendezvous on a free local port, so jobs of a sweep never share one
        where = ["--standalone"]
    else:
        # The static rendezvous gives node R the global ranks R x nproc + local rank, so rank 0, which writes
        # the job's results, is on node 0 (whose agent hosts the store at the endpoint). c10d's dynamic
        # rendezvous ignores --node-rank and orders the machines by host name and process id
        # (torch.distributed.run's --node-rank help; dynamic_rendezvous._mark_rendezvous_complete).
        where = [f"--nnodes={dist.nodes}", f"--node-rank={dist.node_rank}", "--rdzv-backend=static",
                 f"--rdzv-endpoint={dist.rdzv_endpoint}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={dist.nproc}",
            "-m", "memsweep.run.rank", str(job_dir)]


def task_group() -> tuple[int, int] | None:
    """(global rank, number of tasks) when this process is one of several submitit tasks of one job (Slurm's
    `hydra.launcher.nodes` x `tasks_per_node`, or submitit's local executor); None otherwise."""
    try:
        import submitit

        env = submitit.JobEnvironment()
    except (ImportError, RuntimeError):  # RuntimeError: not inside a submitit job
        return None
    return (env.global_rank, env.num_tasks) if env.num_tasks > 1 else None


def spans_processes(job) -> bool:
    """More than one rank (`distributed.nodes` x `nproc` > 1): the job runs as several ranks, started here."""
    return job.distributed.world_size > 1


def is_secondary_task() -> bool:
    """A submitit task of a multi-process job other than its rank 0 (which writes the job's results)."""
    task = task_group()
    return task is not None and task[0] > 0


def join_task_group(dist) -> int:
    """Set torch.distributed's env:// variables from the Slurm task (submitit's TorchDistributedEnvironment:
    global and local rank, world size, the first host of the job's node list as master); its global rank."""
    from submitit.helpers import TorchDistributedEnvironment

    task_rank, tasks = task_group()
    if tasks != dist.world_size:
        raise ConfigError("distributed.nproc", f"x distributed.nodes is {dist.nproc} x {dist.nodes} but the launcher "
                                               f"started {tasks} tasks for this job; set hydra.launcher.nodes to "
                                               "distributed.nodes and tasks_per_node to distributed.nproc "
                                               "(hydra/launcher=slurm does)")
    TorchDistributedEnvironment().export(overwrite=True)
    return task_rank


def run_secondary_task(job, job_dir: Path) -> dict:
    """Ranks 1.. of a submitit task group: train as a rank; rank 0's task writes the job's results."""
    join_task_group(job.distributed)
    rank.run_rank(job, job_dir)
    return {}


def run_ranks(job, job_dir: Path, res: Result) -> None:
    """Run `job` on its ranks and fill `res` from what global rank 0 gathered: with this node's torchrun,
    or, inside a submitit task group, as its rank 0 (the other tasks run run_secondary_task). The job of a
    node other than node 0 records its own ranks (record_own_ranks).

    A rank that fails leaves its status in error.json (and under torchrun the others are stopped); that
    status is raised here as the exception `errors.outcome` maps to it (oom, diverged, unsupported, failed).
    """
    ranks_dir = job_dir / rank.RANKS_DIR
    if task_group() is not None:  # the other tasks are already running: clear only the old result
        (ranks_dir / rank.RESULT_FILE).unlink(missing_ok=True)
        join_task_group(job.distributed)
        returncode = rank.run_rank(job, job_dir)
    else:
        returncode = run_torchrun(job, job_dir)
    if returncode == 0 and (ranks_dir / rank.RESULT_FILE).exists():
        res.merge(read(ranks_dir / rank.RESULT_FILE), sections=("metrics", "time", "memory", "effective", "data"))
        return
    if returncode == 0 and task_group() is None and job.distributed.node_rank > 0:
        record_own_ranks(job, ranks_dir, res)
        return
    errors = [read(f) for f in sorted(ranks_dir.glob(f"rank*/{rank.ERROR_FILE}"))]
    if not errors:
        stopping.stop_if_requested(f"while its ranks ran (torchrun exited with {returncode})")
        raise RuntimeError(f"the ranks exited with {returncode} and none left a result or an error")
    # torchrun stops the other ranks when one fails, and each of them ends `interrupted`: the cause is a rank
    # that ended otherwise (all interrupted only when a person or the cluster stopped the job)
    cause = next((e for e in errors if e["status"] != "interrupted"), errors[0])
    raise STATUS_EXCEPTIONS.get(cause["status"], RuntimeError)(f"rank {cause['rank']}: {cause['reason']}")


def run_torchrun(job, job_dir: Path) -> int:
    """This node's ranks under torchrun; its exit code."""
    from omegaconf import OmegaConf

    ranks_dir = job_dir / rank.RANKS_DIR
    shutil.rmtree(ranks_dir, ignore_errors=True)  # a resumed job must not read an old attempt's files
    ranks_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.structured(job), ranks_dir / rank.JOB_FILE)
    from ..techniques import traits_of

    ds_ops.load(traits_of(job))  # built once here, not by each rank at once
    env = procenv.without_group_variables()
    if job.threads is None:  # the cores shared out between the node's ranks (torchrun's own default is 1)
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.distributed.nproc))
    # The ranks share the terminal's process group: a Ctrl-C reaches them, and each ends itself
    # interrupted. This process waits for them instead of killing torchrun under them.
    with stopping.deferred():
        return subprocess.run(torchrun_command(job.distributed, job_dir), env=env).returncode


def record_own_ranks(job, ranks_dir: Path, res: Result) -> None:
    """The job of node `node_rank` > 0 ended well: its results are its own ranks' ledgers and losses; the
    job's (the loss of the global batch, the metrics) are written by node 0's job, where global rank 0 ran."""
    dist = job.distributed
    res.memory.per_rank = [json.loads(f.read_text()) for f in sorted(ranks_dir.glob(f"rank*/{rank.RANK_FILE}"))]
    res.effective.update(world_size=dist.world_size, nodes=dist.nodes, node_rank=dist.node_rank,
                         results_on=f"node_rank 0 (global rank 0; rendezvous {dist.rdzv_endpoint})")
    print(f"[memsweep] node {dist.node_rank} of {dist.nodes}: its ranks {[r['rank'] for r in res.memory.per_rank]} "
          f"trained; the job's results are written by node 0's job", flush=True)
