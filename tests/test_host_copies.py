"""Optimizer offload's copies over the host link: the bytes each engine copies per step and what the step waits
for them (estimate/host_copies.py, roofline.step_time)."""
from types import SimpleNamespace

import pytest

from conftest import job_of
from memsweep.estimate import host_copies
from memsweep.estimate.core import estimate_job
from memsweep.run.setup import build_setup

LLAMA = ["task=causal_lm", "model=tiny-llama", "batch_size=16", "max_seq_len=128", "hardware=a100_40gb"]
P, T = 1_000_000, 250_000  # parameters, trainable ones


def copied(*extra) -> tuple[host_copies.Volume, bool]:
    job, profile = job_of(LLAMA + list(extra))
    return host_copies.volume(build_setup(job, profile), P, T)


def test_each_offload_copies_what_its_engine_moves_per_step():
    assert copied("precision=bf16") == (host_copies.Volume(), False)  # nothing offloaded
    assert copied("precision=bf16", "offload=activations") == (host_copies.Volume(), False)  # the trace's own copies
    # torchao: every micro-batch's gradients to the host during backward, the updated values back after the step,
    # in the parameters' dtype (bf16_true: 2 bytes)
    assert copied("precision=bf16_true", "offload=optimizer", "accumulation=x4") == (
        host_copies.Volume(overlapped=4 * T * 2, after_step=T * 2), False)
    # ZeRO-Offload over 4 processes: each rank's partition, in the compute dtype; once a step at stage 1
    assert copied("precision=bf16", "deepspeed=zero2_offload", "distributed.nproc=4", "accumulation=x4") == (
        host_copies.Volume(overlapped=4 * T / 4 * 2, after_step=T / 4 * 2), False)
    one = copied("precision=bf16", "deepspeed=zero2_offload", "deepspeed.stage=1", "distributed.nproc=4",
                 "accumulation=x4")
    assert one == (host_copies.Volume(overlapped=T / 4 * 2, after_step=T / 4 * 2), False)
    # FSDP2 offload: each shard of the fp32 parameters in before forward and backward, each micro-batch, while the
    # gradients' shards go out: the longer direction, hidden under forward and backward
    assert copied("precision=bf16", "fsdp=full_shard_offload", "distributed.nproc=4", "accumulation=x4") == (
        host_copies.Volume(overlapped=4 * 2 * P / 4 * 4), True)
    cpu, _ = job_of(["task=causal_lm", "model=tiny-llama", "precision=bf16", "deepspeed=zero2_offload"])
    assert host_copies.volume(build_setup(cpu, _), P, T) == (host_copies.Volume(), False)  # the CPU is the host


def test_the_step_waits_for_the_copies_beyond_the_backward_they_overlap_and_for_those_after_it():
    job, profile = job_of(LLAMA + ["precision=bf16_true", "offload=optimizer", "accumulation=x4"])
    setup, link = build_setup(job, profile), 10.0  # bytes a second
    traced = SimpleNamespace(total_params=P, trainable_params=T)  # what the copies read of a trace
    hidden = host_copies.waited(traced, setup, link, forward_s=1e9, backward_s=4 * T * 2 / link)
    assert hidden == host_copies.HostCopies(5 * T * 2, took_s=5 * T * 2 / link, waited_s=T * 2 / link)  # only back
    longer = host_copies.waited(traced, setup, link, forward_s=1e9, backward_s=T * 2 / link)
    assert longer.waited_s == pytest.approx((3 + 1) * T * 2 / link)  # forward hides none of torchao's
    assert host_copies.waited(traced, setup, None, 0, 0) == host_copies.HostCopies(5 * T * 2)  # no link: bytes only


def test_an_offloaded_steps_copies_are_timed_and_its_host_step_is_said_to_be_left_out():
    job, profile = job_of(LLAMA + ["precision=bf16_true", "offload=optimizer", "accumulation=x4"])
    offloaded = estimate_job(job, profile)
    t, link = offloaded.step_time, profile.host_link_gbs * 1e9
    after = offloaded.trainable_params * 2 / link
    assert t.host_copies.took_s == pytest.approx(5 * after) and t.host_copies.waited_s >= after
    assert t.optimizer_s == 0  # no optimizer op on the device
    assert t.step_s == pytest.approx(t.device_s + t.idle_s + t.host_copies.waited_s)
    assert "that step is not timed (a lower bound" in t.note
    no_link = estimate_job(*job_of(LLAMA + ["precision=bf16_true", "offload=optimizer", "hardware.host_link_gbs=null"]))
    assert no_link.predicted_step_s is None and "host_link_gbs" in no_link.step_time.why_not
