"""One rank of a multi-process job: `python -m memsweep.run.rank <job dir>`, started by torchrun (launch.py),
or run_rank() in-process in each submitit task of a Slurm job with several tasks.

On several nodes each node's torchrun (or Slurm) starts that node's ranks, all in one process group.
Every rank builds and trains the same job (Trainer/Accelerate join the process group torchrun set up:
gloo on the CPU, nccl on GPUs; DDP, DeepSpeed or FSDP shard as configured) and measures its own
memory ledger. Global rank 0 gathers the ranks' ledgers and losses and writes ranks/result.json; the job
(on node 0) turns it into its results.json.
"""
import os
import socket
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from statistics import fmean

from ..config import hardware
from ..errors import outcome
from . import procenv, results, stopping

# Files of a multi-process job, under its job dir: the job the ranks run, each rank's own dir (its
# Trainer output, its own ledger and loss in rank.json, and error.json if it failed) and the result
# global rank 0 gathered.
RANKS_DIR = "ranks"
JOB_FILE = "job.yaml"
RESULT_FILE = "result.json"
RANK_FILE = "rank.json"
ERROR_FILE = "error.json"


def load_job(ranks_dir: Path):
    from omegaconf import OmegaConf

    from ..config.schema import Config

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(ranks_dir / JOB_FILE)))


def main(job_dir: Path) -> int:
    procenv.prepare()
    with stopping.handling():  # the terminal's Ctrl-C (or torchrun's copy of it) ends this rank interrupted
        return run_rank(load_job(job_dir / RANKS_DIR), job_dir)


def run_rank(job, job_dir: Path) -> int:
    """Train as rank $RANK of $WORLD_SIZE; 0 on success, 1 after writing this rank's error.json."""
    import torch.distributed as dist

    from .train_loop import train_and_evaluate

    ranks_dir = job_dir / RANKS_DIR
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rank_dir = ranks_dir / f"rank{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    res = results.Result.start([], "")
    try:
        train_and_evaluate(job, hardware.detect(job.hardware), rank_dir, res, run=None)
    except Exception as exc:  # noqa: BLE001 - the parent job reports it; torchrun stops the other ranks
        status, reason = outcome(exc)
        (rank_dir / "traceback.txt").write_text(traceback.format_exc())
        results.write(rank_dir / ERROR_FILE, {"rank": rank, "status": status, "reason": reason})
        if status != "interrupted":  # a stop is no error: the job's ending line says it
            traceback.print_exc()
        return 1
    mine = {"rank": rank, "host": socket.gethostname(), "train_loss": res.metrics.train_loss,
            "memory": asdict(res.memory), "optimizer_state_bytes": res.effective.get("optimizer_state_bytes"),
            "trainable_params_local": res.effective.get("trainable_params")}
    results.write(rank_dir / RANK_FILE, mine)  # what the job of this rank's node records (launch.record_own_ranks)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank == 0:
        # Each rank's loss is the mean over its own micro-batches; their mean is the global batch's.
        res.metrics.train_loss = fmean(r["train_loss"] for r in gathered)
        res.memory.per_rank = gathered
        res.effective.update(world_size=world, nodes=job.distributed.nodes, backend=dist.get_backend())
        results.write(ranks_dir / RESULT_FILE, res.to_dict())
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
