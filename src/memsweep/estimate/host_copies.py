"""Optimizer offload's copies over the host link: what a GPU sends to and receives from host memory each
optimizer step, and how long the step waits for them. The host's own optimizer step is not here: it runs on
the host's CPU and memory, which no profile describes, so a step with it is a lower bound.

What each engine copies (T trainable values, P all values, N processes; each in the dtype it travels in):
- torchao's CPUOffloadOptimizer (offload=optimizer, optimizer_and_grads; torchao/optim/cpu_offload.py): a
  post-accumulate-grad hook copies each trainable tensor's gradient to pinned host memory on a side stream as
  backward makes it, every micro-batch (accumulation copies it again over the last); the step waits for each
  copy, steps that tensor on the host and queues its updated values back to the device on the same stream,
  then waits for the stream. Per step: accumulation x T gradients to the host while backward runs, and T
  values back after it (alongside the host's steps: at least that long), in the parameters' dtype.
- DeepSpeed ZeRO-Offload (offload_optimizer; stage_1_and_2.py, stage3.py): each rank's reduced gradient
  partition copied to the host's fp32 buffer as backward reduces it (every micro-batch from stage 2, once at
  stage 1); after CPUAdam's step the updated partition copied back in the compute dtype, before the
  all-gather. Taken at the compute dtype both ways (the fewer bytes: a lower bound either way it is cast).
  Stage 3's parameter offload (offload_param: each partition copied in before its gather) is not here.
- FSDP2's CPUOffloadPolicy (fsdp=full_shard_offload): each unit's shard of the parameters, kept on the host
  in their own dtype, copied to the device before its all-gather (each micro-batch's forward and, resharded
  after it, its backward; prefetched while the unit before computes), and each reduced gradient shard to the
  host once a step while backward runs. The two directions run at once (PCIe is full duplex): the longer.

The link is the profile's host link (`host_link_gbs`, one direction). What the step waits for: the copies
that run while the device computes wait only beyond it (the gradients' beyond backward, FSDP2's beyond
forward and backward), the copies back after the step whole.
"""
from .collectives import Volume, waited_s


def volume(setup, total_params: int, trainable_params: int) -> tuple[Volume, bool]:
    """(the bytes each process copies per optimizer step, whether they hide under forward too (FSDP2's
    prefetched parameters) or only under backward); nothing without optimizer offload on a GPU."""
    t, micro, n = setup.techniques, setup.accumulation_steps, setup.world_size
    if setup.device != "cuda":
        return Volume(), False
    if t.offload.optimizer:
        each = trainable_params * t.precision.param_bytes
        return Volume(overlapped=micro * each, after_step=each), False
    if t.deepspeed.offload_optimizer:
        part = trainable_params / n * t.precision.compute_bytes
        return Volume(overlapped=(micro if t.deepspeed.stage >= 2 else 1) * part, after_step=part), False
    if t.fsdp.on and t.fsdp.offload:
        gathers = micro * (2 if t.fsdp.reshard_after_forward else 1) * total_params / n * t.precision.param_bytes
        return Volume(overlapped=max(gathers, trainable_params / n * t.precision.param_bytes)), True
    return Volume(), False


def waited(traced: dict, setup, link_bytes_s, forward_s: float, backward_s: float) -> dict:
    """The copies of a step: their bytes, seconds over the host link (`link_bytes_s`, None where the profile
    has none: then the bytes only) and what the step waits for them beyond the micro-batches' `forward_s` and
    `backward_s` they overlap; {} where nothing is copied."""
    sent, under_forward = volume(setup, traced.get("total_params", 0), traced.get("trainable_params", 0))
    if not sent.total or link_bytes_s is None:
        return {"host_copy_bytes": sent.total} if sent.total else {}
    took, waited_for = waited_s(sent, link_bytes_s, backward_s + (forward_s if under_forward else 0.0))
    return {"host_copy_bytes": sent.total, "host_copies_s": took, "host_copies_waited_s": waited_for}
