"""distributed.nproc=2: one job on two CPU processes started by torchrun (gloo), with DDP, with
DeepSpeed ZeRO-2/3 and with FSDP2 full_shard, against the same job on one process; and the same two
ranks as two "machines" (distributed.nodes=2), each its own train.py and torchrun, joined at a rendezvous.

Dropout off and unbucketed batches: the two ranks then see exactly the two halves of the one-process
batch, so the losses must match, and ZeRO must leave each rank half the optimizer state; the same ZeRO
jobs check the estimate of each rank's peak.
"""
import re

import pytest

from conftest import run_job

pytestmark = pytest.mark.slow  # every test starts ranks in fresh processes (torchrun or submitit)

BASE = ["model=tiny", "data.train_size=128", "data.eval_size=64", "logger=none", "threads=1", "max_steps=3",
        "model.dropout=0", "dataloader.group_by_length=false", "measure.estimate=false"]


# The two-node test compares with the same DDP job: both run on one worker (`make test`: --dist loadgroup)
ONE_NODE = pytest.mark.xdist_group("one_node_ddp")


@pytest.fixture(scope="module")
def one_node_ddp(tmp_path_factory):
    """The job on one node of two processes with DDP (deepspeed=none): the two-process test's first case and the
    two-node test's reference, run once for both."""
    return run_job(BASE + ["distributed.nproc=2"], tmp_path_factory.mktemp("one_node"))


# ZeRO-2 as Lightning's DeepSpeedStrategy runs it: two reduce buckets (overlap_comm), each here about half the
# model's gradients, which the estimate of each rank must count
ZERO2_TWO_BUCKETS = "deepspeed=zero2 deepspeed.overlap_comm=true deepspeed.reduce_bucket_size=1000000"


@pytest.mark.parametrize("sharding, shards_state", [pytest.param("deepspeed=none", False, marks=ONE_NODE),
                                                    (ZERO2_TWO_BUCKETS, True), ("deepspeed=zero3", True),
                                                    ("fsdp=full_shard", True)])
def test_two_processes_train_the_one_process_job_and_zero_halves_the_state(sharding, shards_state, tmp_path,
                                                                           request):
    one = run_job(BASE + sharding.split(), tmp_path / "one")
    zero = sharding.startswith("deepspeed=zero")  # its estimate is checked on this job, each rank (below)
    if sharding == "deepspeed=none":
        two = request.getfixturevalue("one_node_ddp")
    else:
        two = run_job(BASE + sharding.split() + ["distributed.nproc=2", f"measure.estimate={zero}"], tmp_path / "two")
    assert one["status"] == two["status"] == "ok", (one["reason"], two["reason"])
    assert (two["effective"]["world_size"], two["effective"]["backend"]) == (2, "gloo")
    assert two["effective"]["micro_batch_size"] == one["effective"]["micro_batch_size"] // 2
    assert two["time"]["optimizer_steps"] == one["time"]["optimizer_steps"] == 3
    assert two["metrics"]["train_loss"] == pytest.approx(one["metrics"]["train_loss"], rel=1e-4)

    ranks = two["memory"]["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    alone = one["effective"]["optimizer_state_bytes"]
    for r in ranks:
        assert r["memory"]["peak_bytes"] > 0 and r["memory"]["optimizer_bytes"] == r["optimizer_state_bytes"]
        if shards_state:  # ZeRO partitions the Adam state: each rank holds half
            assert r["optimizer_state_bytes"] == pytest.approx(alone / 2, rel=0.02)
        else:  # DDP replicates it
            assert r["optimizer_state_bytes"] == alone
    assert two["memory"]["peak_bytes"] == ranks[0]["memory"]["peak_bytes"]  # the job's figure is rank 0's
    if sharding.startswith("fsdp"):  # FSDP shards the weights too: each rank holds half of them
        assert two["effective"]["fsdp"]["local_numel"] * 2 == two["effective"]["fsdp"]["global_numel"]
        for r in ranks:
            # half the model's weights (+ a gathered unit when the rank peaks in forward)
            half = 4 * one["effective"]["total_params"] / 2
            assert half <= r["memory"]["params_bytes"] <= 1.05 * half
    if zero:
        each_rank_is_estimated(two)
    print(f"\n{sharding}: train loss 1 process {one['metrics']['train_loss']:.6f}, 2 processes "
          f"{two['metrics']['train_loss']:.6f}; optimizer state 1 process {alone:,} B, per rank "
          f"{[r['optimizer_state_bytes'] for r in ranks]}; peak per rank {[r['memory']['peak_bytes'] for r in ranks]}")


def each_rank_is_estimated(res):
    """ZeRO's estimate (adjust.py, zero.py) gives each rank's peak, each within 5 % of what that rank measured.
    Tiny BERT's word embeddings straddle the two ranks' ZeRO-2 partitions: both ranks hold it whole in
    their grads_in_partition, and they peak at different points of backward."""
    est, ranks = res["estimate"], res["memory"]["per_rank"]
    assert est["method"] == "adjusted trace" and "DeepSpeed" in est["method_reason"], est.get("error")
    assert [r["rank"] for r in est["per_rank"]] == [0, 1]
    assert est["peak_bytes"] == est["per_rank"][0]["peak_bytes"]  # the job's figure is rank 0's, as measured
    for predicted, measured in zip(est["per_rank"], ranks):
        assert predicted["peak_bytes"] == pytest.approx(measured["memory"]["peak_bytes"], rel=0.05)
    print(f"estimate per rank {[r['peak_bytes'] for r in est['per_rank']]}, "
          f"measured {[r['memory']['peak_bytes'] for r in ranks]}")


# A small decoder whose peak is in forward/backward, at a fixed length; one evaluation batch per rank (the
# evaluation is not what its tests check)
DECODER = ["task=causal_lm", "model=tiny-llama", "model.hidden_size=256", "model.intermediate_size=704",
           "model.num_layers=4", "model.num_heads=8", "batch_size=4", "max_seq_len=128", "data.train_size=64",
           "data.eval_size=8", "max_steps=3", "logger=none", "threads=1"]


@pytest.mark.parametrize("option", ["fsdp=full_shard", "fsdp=shard_grad_op"])
def test_the_estimate_of_fsdp_traces_rank_0_among_fake_ranks(option, tmp_path):
    res = run_job(DECODER + [option, "distributed.nproc=2"], tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    est, rank0 = res["estimate"], res["memory"]["per_rank"][0]
    assert est["method"] == "trace", est["method_reason"]
    # the same units gathered and freed, the same half of the state: rank 0's peak to 1 %, and far from a
    # whole model's
    assert est["peak_bytes"] == pytest.approx(rank0["memory"]["peak_bytes"], rel=0.01)
    assert est["optimizer_bytes"] == rank0["optimizer_state_bytes"]
    assert est["optimizer_bytes"] < 0.55 * res["effective"]["total_params"] * 8


def test_a_rank_that_runs_out_of_memory_makes_the_job_oom_with_its_reason(tmp_path):
    # 0.5 GiB more address space than each rank's built model (memcap.py); 64 x 512 tokens with eager
    # attention per rank needs several GiB
    res = run_job(BASE + ["distributed.nproc=2", "hardware=cpu", "hardware.memory_gib=0.5", "batch_size=128",
                          "max_seq_len=512", "attention=eager"], tmp_path / "job")
    # both ranks may run out; either reason is the cause (the one stopped by torchrun ends interrupted)
    assert res["status"] == "oom" and re.match(r"\w+: rank [01]: ", res["reason"]), res["reason"]
    assert (tmp_path / "job" / "results.json").exists()


def test_the_rank_that_failed_gives_the_jobs_status_not_the_ranks_torchrun_stopped_after_it(tmp_path, monkeypatch):
    # rank 1 runs out of memory; torchrun then stops rank 0, which ends interrupted: the job is oom for rank 1's reason
    from conftest import job_of
    from memsweep.run import launch, rank, results

    def ranks_end(job, job_dir):
        for num, status in ((0, "interrupted"), (1, "oom")):
            (job_dir / rank.RANKS_DIR / f"rank{num}").mkdir(parents=True)
            results.write(job_dir / rank.RANKS_DIR / f"rank{num}" / rank.ERROR_FILE,
                          {"rank": num, "status": status, "reason": f"{status} here"})
        return 1

    monkeypatch.setattr(launch, "run_torchrun", ranks_end)
    job, _ = job_of(BASE + ["distributed.nproc=2"])
    with pytest.raises(MemoryError, match="rank 1: oom here"):
        launch.run_ranks(job, tmp_path, results.Result.start([], ""))


def test_slurm_style_tasks_run_the_ranks_instead_of_torchrun(tmp_path):
    # submitit's local executor starts tasks_per_node processes as Slurm would (hydra/launcher=slurm sets
    # tasks_per_node to distributed.nproc); each joins the group as its task's rank, rank 0 writes results.
    import subprocess
    import sys

    from conftest import ROOT
    from memsweep.run import results

    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=local", "hydra.launcher.tasks_per_node=2",
                           "distributed.nproc=2", *BASE, f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    res = results.read(sweep / "0" / "results.json")
    assert res["status"] == "ok", res["reason"]
    assert res["effective"]["world_size"] == 2 and [r["rank"] for r in res["memory"]["per_rank"]] == [0, 1]
    assert not (sweep / "0" / "ranks" / "job.yaml").exists()  # no torchrun: the tasks were the ranks


@ONE_NODE
def test_two_nodes_joined_by_torchrun_train_the_two_process_job(tmp_path, one_node_ddp):
    # Two "machines" on this one: node 1 is its own `python train.py` (as a person types it on the second
    # machine), node 0 runs in this process; each starts one rank, and they meet at node 0's 127.0.0.1 port.
    import subprocess
    import sys

    from conftest import ROOT
    from memsweep.run import procenv, results

    nodes = ["distributed.nodes=2", "distributed.nproc=1", f"distributed.rdzv_endpoint=127.0.0.1:{procenv.free_port()}"]
    second = subprocess.Popen([sys.executable, "train.py", *BASE, *nodes, "distributed.node_rank=1",
                               f"hydra.run.dir={tmp_path / 'node1'}"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        first = run_job(BASE + nodes + ["distributed.node_rank=0"], tmp_path / "node0")
        printed = second.communicate(timeout=300)[0]
    finally:
        second.kill()
    assert second.returncode == 0, printed[-3000:]
    own = results.read(tmp_path / "node1" / "results.json")
    assert first["status"] == own["status"] == one_node_ddp["status"] == "ok", (first["reason"], own["reason"])
    assert (first["effective"]["world_size"], first["effective"]["nodes"]) == (2, 2)
    assert first["metrics"]["train_loss"] == pytest.approx(one_node_ddp["metrics"]["train_loss"], rel=1e-5)
    assert first["metrics"]["f1"] == pytest.approx(one_node_ddp["metrics"]["f1"])
    # global rank 0 is node 0's and gathered both; node 1's job holds its own rank, with its own loss
    assert [r["rank"] for r in first["memory"]["per_rank"]] == [0, 1] and own["metrics"]["train_loss"] is None
    assert [r["rank"] for r in own["memory"]["per_rank"]] == [1]
    assert own["memory"]["per_rank"][0]["train_loss"] == pytest.approx(
        one_node_ddp["memory"]["per_rank"][1]["train_loss"], rel=1e-5)
    print(f"\ntrain loss: 2 nodes x 1 process {first['metrics']['train_loss']:.6f}, 1 node x 2 processes "
          f"{one_node_ddp['metrics']['train_loss']:.6f}; per rank "
          f"{[r['train_loss'] for r in first['memory']['per_rank']]} "
          f"and {[r['train_loss'] for r in one_node_ddp['memory']['per_rank']]}")
