"""The collectives of several processes: what each rank sends per optimizer step (by engine: DDP, FSDP2,
DeepSpeed ZeRO), over which link, and how long the step waits for them beyond the compute they overlap. The
engines' traffic and the links: docs/estimator/collectives.md."""
from dataclasses import dataclass

from .traced import Trace

GB = 1e9


@dataclass(frozen=True)
class Volume:
    """Bytes each rank sends per optimizer step: hidden under compute where overlapped, else after it."""
    overlapped: float = 0.0
    after_step: float = 0.0

    @property
    def total(self) -> float:
        return self.overlapped + self.after_step


@dataclass(frozen=True)
class Collectives:
    """A step's collectives (waited): the bytes each rank sends and, where the ring's slowest link is known, their
    seconds over it and what the step waits for them; else a note saying they are not timed (a lower bound)."""
    sent_bytes: float
    took_s: float | None = None  # None: not timed, no link known
    waited_s: float = 0.0  # beyond the compute they overlap, and all of what runs after the optimizer step
    link: str | None = None  # the link they are timed over
    note: str | None = None  # why they are not timed


def ring(elements: float, element_bytes: int, ranks: int, all_reduce: bool = False) -> float:
    """Bytes one rank sends in a ring all-gather or reduce-scatter of `elements` (all-reduce: twice)."""
    return (2 if all_reduce else 1) * (ranks - 1) / ranks * elements * element_bytes


def volume(setup, total_params: int, trainable_params: int) -> Volume:
    """What each rank of the setup's job sends per optimizer step (none for one process)."""
    n, t, micro = setup.world_size, setup.techniques, setup.accumulation_steps
    if n <= 1:
        return Volume()
    sharded, stage = t.precision.compute_bytes, t.deepspeed.stage
    # DeepSpeed reduces while backward runs only with overlap_comm; FSDP2 reduces on its own stream
    zero = setup.args.get("deepspeed", {}).get("zero_optimization", {})
    reduce_hidden = t.fsdp.on or bool(zero.get("overlap_comm"))
    if t.fsdp.on or stage == 3:
        gathers = micro * (2 if stage == 3 or t.fsdp.reshard_after_forward else 1) * ring(total_params, sharded, n)
        reductions = (micro if stage == 3 else 1) * ring(trainable_params, sharded, n)
        return Volume(overlapped=gathers + reductions * reduce_hidden, after_step=reductions * (not reduce_hidden))
    if stage in (1, 2):
        reductions = (micro if stage == 2 else 1) * ring(trainable_params, sharded, n)
        updated = ring(trainable_params, sharded, n)  # each rank's updated partition, to every rank
        return Volume(overlapped=reductions * reduce_hidden, after_step=updated + reductions * (not reduce_hidden))
    if stage == 0:  # DeepSpeed all-reduces the gradients once backward is done, in the compute dtype
        return Volume(after_step=ring(trainable_params, sharded, n, all_reduce=True))
    # DDP: the gradients all-reduced in the parameters' dtype, bucket by bucket as backward makes them
    return Volume(overlapped=ring(trainable_params, t.precision.param_bytes, n, all_reduce=True))


def link_gbs(profile, distributed) -> tuple[float | None, str]:
    """The slowest link of the job's ring, GB/s one direction per GPU, and where it comes from; None where a
    ring across nodes has no network bandwidth given, or the profile no link figure."""
    if distributed.nodes > 1:
        if distributed.network_gbs is None:
            return None, "across nodes: no distributed.network_gbs"
        inside = profile.interconnect_gbs or profile.host_link_gbs
        return min(distributed.network_gbs, inside or distributed.network_gbs), "the network (distributed.network_gbs)"
    if profile.interconnect_gbs:
        return profile.interconnect_gbs, f"{profile.name}'s interconnect_gbs"
    if profile.host_link_gbs:
        return profile.host_link_gbs, f"{profile.name}'s host link (PCIe)"
    return None, f"profile {profile.name} has no interconnect_gbs or host_link_gbs"


def waited_s(sent: Volume, bytes_s: float, hidden_under_s: float) -> tuple[float, float]:
    """(the transfers' seconds at `bytes_s`, what the step waits for them): the overlapped part beyond
    `hidden_under_s` of the device's compute, and all of what runs after the optimizer step."""
    overlapped, after = sent.overlapped / bytes_s, sent.after_step / bytes_s
    return overlapped + after, max(0.0, overlapped - hidden_under_s) + after


def waited(traced: Trace, setup, profile, distributed, compute_s: float) -> Collectives | None:
    """Several processes' collectives: the bytes each rank sends a step, their seconds over the ring's slowest
    link, and what the step waits for them beyond the `compute_s` they overlap; a note where no link is known
    (a CPU profile's processes, or nodes without a network bandwidth). None for one process."""
    sent = volume(setup, traced.total_params, traced.trainable_params)
    if not sent.total:
        return None
    gbs, link = link_gbs(profile, distributed) if distributed is not None and profile.device == "cuda" \
        else (None, "no link bandwidth for this device")
    if gbs is None:
        return Collectives(sent.total, note=f"the collectives of {setup.world_size} processes are not timed ({link}): "
                                            "a lower bound")
    took, waited_for = waited_s(sent, gbs * GB, compute_s)
    return Collectives(sent.total, took_s=took, waited_s=waited_for, link=link)
