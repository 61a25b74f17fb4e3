"""How a job's ranks are started and joined (run/launch.py), without starting them: torchrun's command for
one node and for one machine of several, and the process group a Slurm task joins from the variables
Slurm sets (simulated here as sbatch would set them for a task)."""
import os

import pytest

from conftest import job_of
from memsweep.errors import ConfigError
from memsweep.run import launch

TORCH_GROUP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
               "CUDA_VISIBLE_DEVICES")


def dist_of(*overrides):
    return job_of(["model=tiny", *overrides])[0].distributed


@pytest.mark.fast
def test_one_node_keeps_a_standalone_rendezvous(tmp_path):
    cmd = launch.torchrun_command(dist_of("distributed.nproc=2"), tmp_path)
    assert "--standalone" in cmd and "--nproc-per-node=2" in cmd
    assert not any(a.startswith(("--nnodes", "--node-rank", "--rdzv")) for a in cmd)


def test_each_machine_of_several_joins_node_0s_rendezvous_as_its_node_rank(tmp_path):
    dist = dist_of("distributed.nodes=3", "distributed.nproc=2", "distributed.node_rank=1",
                   "distributed.rdzv_endpoint=10.0.0.1:29400")
    cmd = launch.torchrun_command(dist, tmp_path)
    assert "--standalone" not in cmd
    # static: node 1's ranks are 2 and 3, so global rank 0 (the job's results) stays on node 0
    assert {"--nnodes=3", "--node-rank=1", "--nproc-per-node=2", "--rdzv-backend=static",
            "--rdzv-endpoint=10.0.0.1:29400"} <= set(cmd)
    assert cmd[-3:] == ["-m", "memsweep.run.rank", str(tmp_path)]


def slurm_task(monkeypatch, procid: int, localid: int, nodeid: int, ntasks: int, nodes: int, nodelist: str):
    """The variables sbatch/srun give one task of a job (the ones submitit's SlurmJobEnvironment reads)."""
    # a copy for the test: export() writes the group's variables straight into os.environ, and a later job
    # of this process that found them would wait for a group of 4 that never forms
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in TORCH_GROUP})
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    for key, value in {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": ntasks, "SLURM_JOB_NUM_NODES": nodes,
                       "SLURM_NODEID": nodeid, "SLURM_JOB_NODELIST": nodelist, "SLURM_PROCID": procid,
                       "SLURM_LOCALID": localid}.items():
        monkeypatch.setenv(key, str(value))


def test_a_slurm_task_joins_as_its_global_rank_with_the_first_host_as_master(monkeypatch):
    # 2 nodes x 2 tasks: the 4th task is node 1's second, global rank 3
    slurm_task(monkeypatch, procid=3, localid=1, nodeid=1, ntasks=4, nodes=2, nodelist="gpu[07-08]")
    dist = dist_of("distributed.nodes=2", "distributed.nproc=2")
    assert launch.task_group() == (3, 4) and launch.is_secondary_task()
    assert launch.join_task_group(dist) == 3
    assert {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu07"}
    port = os.environ["MASTER_PORT"]  # derived from the job id: the same on every task of the job
    slurm_task(monkeypatch, procid=0, localid=0, nodeid=0, ntasks=4, nodes=2, nodelist="gpu[07-08]")
    assert launch.join_task_group(dist) == 0 and not launch.is_secondary_task()
    assert (os.environ["RANK"], os.environ["MASTER_PORT"]) == ("0", port)


def test_a_slurm_job_whose_tasks_are_not_nodes_x_nproc_is_refused(monkeypatch):
    slurm_task(monkeypatch, procid=0, localid=0, nodeid=0, ntasks=2, nodes=2, nodelist="n1,n2")
    with pytest.raises(ConfigError, match=r"distributed.nproc: x distributed.nodes is 2 x 2 .* started 2 tasks"):
        launch.join_task_group(dist_of("distributed.nodes=2", "distributed.nproc=2"))


def test_on_slurm_several_nodes_need_no_rendezvous(monkeypatch):
    from memsweep.run import inputs

    job = job_of(["model=tiny", "distributed.nodes=2"])[0]
    with pytest.raises(ConfigError, match="distributed.rdzv_endpoint"):
        inputs.rendezvous(job)
    slurm_task(monkeypatch, procid=0, localid=0, nodeid=0, ntasks=2, nodes=2, nodelist="n[1-2]")
    inputs.rendezvous(job)  # Slurm's node list names the master


@pytest.mark.fast
def test_each_rank_reads_back_the_job_torchrun_was_started_for(tmp_path, monkeypatch):
    # torchrun is stood in for: the node's job is written for its ranks (ranks/job.yaml) and torchrun is asked
    # to start them; what a rank loads (rank.load_job) is that job, every key and type intact
    import subprocess

    from memsweep.run import rank

    started = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: started.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    job = job_of(["model=tiny", "distributed.nproc=2", "optim=sgd", "lr=0.01", "freezing=embeddings"])[0]
    assert launch.run_torchrun(job, tmp_path) == 0
    assert started == [launch.torchrun_command(job.distributed, tmp_path)]
    assert rank.load_job(tmp_path / rank.RANKS_DIR) == job
