"""The collectives of several processes: what each rank sends per optimizer step, and how long the step waits
for them.

What each data-parallel engine moves (N ranks; P the model's parameters, T its trainable ones; each element
in the dtype it travels in):
- DDP (several processes, neither ZeRO nor FSDP): the trainable gradients all-reduced once a step (Trainer
  runs the earlier micro-batches under `no_sync`), in the parameters' dtype, bucketed while backward runs.
- FSDP2 (Accelerate: MixedPrecisionPolicy with the compute dtype as param and reduce dtype): every parameter
  all-gathered before each micro-batch's forward and, resharded after forward (full_shard), again before its
  backward; the trainable gradients reduce-scattered once a step (Trainer defers the reduction of the earlier
  micro-batches). Prefetching runs the gathers of the next unit while one computes.
- DeepSpeed ZeRO: stage 0 all-reduces the gradients each step once backward is done; stages 1 and 2
  reduce-scatter them (stage 1 once a step, stage 2 every micro-batch: its gradients are partitioned as they
  are made) and all-gather the updated trainable parameters after the optimizer step; stage 3 gathers the
  parameters as FSDP does, and reduce-scatters every micro-batch. DeepSpeed's module runs in the compute dtype.
A ring moves (N-1)/N of the buffer per rank for an all-gather or a reduce-scatter, twice that for an
all-reduce (NCCL's "bus bandwidth", nccl-tests' PERFORMANCE.md), each over the slowest link of the ring: the
GPU's link to its peers inside a node (profile `interconnect_gbs`, one direction, NVLink where the part has
it, else its PCIe host link), across nodes the network's (`distributed.network_gbs`, per GPU).

What the step waits for: the collectives that run while the device computes (the gathers, and the
reductions bucketed into backward; ZeRO stages 1-2 only with `overlap_comm`) wait beyond the device's forward
and backward only where they take longer; the ZeRO gather after the optimizer step runs after it. Not here:
the SMs NCCL's kernels take from the compute they overlap, the latency of small messages, the first unit's
gather and the last bucket's reduction that nothing hides.
"""
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Volume:
    """Bytes each rank sends per optimizer step: hidden under compute where overlapped, else after it."""
    overlapped: float = 0.0
    after_step: float = 0.0

    @property
    def total(self) -> float:
        return self.overlapped + self.after_step


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
