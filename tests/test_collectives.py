"""Several processes' collectives: the bytes each rank sends per step, the link they cross, and what the step
waits for them (estimate/collectives.py: volume, waited)."""
import pytest

from conftest import job_of
from memsweep.errors import ConfigError
from memsweep.estimate import collectives
from memsweep.estimate.core import estimate_job
from memsweep.run.setup import build_setup

LLAMA = ["task=causal_lm", "model=tiny-llama", "batch_size=16", "max_seq_len=128", "precision=bf16",
         "hardware=a100_40gb"]
P, T = 1_000_000, 250_000  # parameters, trainable ones


def sent(*extra) -> collectives.Volume:
    job, profile = job_of(LLAMA + list(extra))
    return collectives.volume(build_setup(job, profile), P, T)


def test_each_engine_sends_what_its_ring_collectives_move_per_step():
    assert sent().total == 0  # one process: none
    # DDP: the trainable gradients all-reduced once a step in the parameters' dtype (fp32 under bf16 autocast),
    # 2 (N-1)/N of them per rank, bucketed into backward
    assert sent("distributed.nproc=4") == collectives.Volume(overlapped=2 * 3 / 4 * T * 4)
    assert sent("distributed.nproc=4", "accumulation=x4") == sent("distributed.nproc=4")  # no_sync before the last
    # FSDP2 full_shard: every parameter gathered before forward and again before backward, each micro-batch, in
    # the compute dtype; the trainable gradients reduce-scattered once a step
    full = sent("distributed.nproc=4", "fsdp=full_shard", "accumulation=x4")
    assert full == collectives.Volume(overlapped=(4 * 2 * P + T) * 3 / 4 * 2)
    kept = sent("distributed.nproc=4", "fsdp=shard_grad_op", "accumulation=x4")  # gathered once a micro-batch
    assert kept == collectives.Volume(overlapped=(4 * P + T) * 3 / 4 * 2)
    # ZeRO-2: the gradients reduce-scattered every micro-batch, after backward without overlap_comm; the updated
    # parameters gathered after the optimizer step
    zero2 = sent("distributed.nproc=4", "deepspeed=zero2", "accumulation=x4")
    assert zero2 == collectives.Volume(after_step=(4 * T + T) * 3 / 4 * 2)
    overlapped = sent("distributed.nproc=4", "deepspeed=zero2", "accumulation=x4", "deepspeed.overlap_comm=true")
    assert overlapped == collectives.Volume(overlapped=4 * T * 3 / 4 * 2, after_step=T * 3 / 4 * 2)
    assert sent("distributed.nproc=4", "deepspeed=zero1", "accumulation=x4").after_step == 2 * T * 3 / 4 * 2  # once
    zero3 = sent("distributed.nproc=4", "deepspeed=zero3", "accumulation=x4")  # gathers as FSDP, reduces each one
    assert zero3.total == (4 * 2 * P + 4 * T) * 3 / 4 * 2


def test_the_ring_crosses_nvlink_the_pcie_link_or_the_network():
    def link(*extra):
        job, profile = job_of(LLAMA + ["distributed.nproc=4", "fsdp=full_shard"] + list(extra))
        gbs, _ = collectives.link_gbs(profile, job.distributed)
        return gbs
    assert link() == 300.0  # the A100's NVLink, one direction
    assert link("hardware=rtx4090") == 31.5  # no NVLink: its PCIe 4.0 x16 host link
    assert link("distributed.nodes=2") is None  # across nodes, no network given: not timed
    assert link("distributed.nodes=2", "distributed.network_gbs=50") == 50.0
    assert link("hardware.host_link_gbs=null", "hardware=t4") is None  # a card with no link figure: not timed


def test_a_step_waits_for_the_collectives_that_outlast_the_compute_they_overlap():
    fast = estimate_job(*job_of(LLAMA + ["distributed.nproc=4", "fsdp=full_shard"])).step_time
    assert fast.collectives.took_s > 0 and fast.collectives.waited_s == 0  # hidden under forward and backward
    slow = estimate_job(*job_of(LLAMA + ["distributed.nproc=4", "fsdp=full_shard",
                                         "hardware.interconnect_gbs=0.001"])).step_time
    compute = slow.accumulation_steps * (slow.forward_s + slow.backward_s)
    assert slow.collectives.took_s == pytest.approx(slow.collectives.sent_bytes / 1e6)  # 1 MB/s
    assert slow.collectives.took_s > compute
    assert slow.collectives.waited_s == pytest.approx(slow.collectives.took_s - compute)
    assert slow.step_s == pytest.approx(fast.step_s + slow.collectives.waited_s)
    # what runs after the optimizer step is waited for whole
    one_gbs = 1.0 * collectives.GB
    assert collectives.waited_s(collectives.Volume(overlapped=2e9, after_step=1e9), one_gbs, 1.5) == (3.0, 1.5)
    # nodes without a network bandwidth: the step is a lower bound, and says so
    multi = estimate_job(*job_of(LLAMA + ["distributed.nproc=4", "distributed.nodes=2", "fsdp=full_shard"])).step_time
    assert multi.collectives.took_s is None and "not timed" in multi.note


@pytest.mark.parametrize("key", ["distributed.network_gbs", "hardware.interconnect_gbs"])
def test_a_link_bandwidth_must_be_positive(key):
    from memsweep.config.validate import ranges

    job, _ = job_of(LLAMA + [f"{key}=0"])
    with pytest.raises(ConfigError, match=key):
        ranges(job)
