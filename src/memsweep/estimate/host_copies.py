"""Optimizer offload's copies over the host link: what a GPU sends to and receives from host memory each
optimizer step (torchao's CPUOffloadOptimizer, DeepSpeed ZeRO-Offload, FSDP2's CPUOffloadPolicy), and how long
the step waits for them. The host's own optimizer step is not timed: a step with it is a lower bound. What each
engine copies and when: docs/estimator/host-copies.md."""
from dataclasses import dataclass

from .collectives import Volume, waited_s
from .traced import Trace


@dataclass(frozen=True)
class HostCopies:
    """A step's copies over the host link (waited): their bytes, and where the profile has a host link their
    seconds over it and what the step waits for them beyond the compute they overlap."""
    sent_bytes: float
    took_s: float | None = None  # None: the profile has no host link
    waited_s: float = 0.0


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


def waited(traced: Trace, setup, link_bytes_s, forward_s: float, backward_s: float) -> HostCopies | None:
    """The copies of a step: their bytes, seconds over the host link (`link_bytes_s`, None where the profile
    has none: then the bytes only) and what the step waits for them beyond the micro-batches' `forward_s` and
    `backward_s` they overlap; None where nothing is copied."""
    sent, under_forward = volume(setup, traced.total_params, traced.trainable_params)
    if not sent.total:
        return None
    if link_bytes_s is None:
        return HostCopies(sent.total)
    took, waited_for = waited_s(sent, link_bytes_s, backward_s + (forward_s if under_forward else 0.0))
    return HostCopies(sent.total, took_s=took, waited_s=waited_for)
