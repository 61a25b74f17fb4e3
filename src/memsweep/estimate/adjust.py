"""Jobs the trace cannot run as they are: the trace of the nearest job it can run, and arithmetic on that
step's allocations for what the real job does differently. Each adjustment names its mechanism and
source; the allocations it leaves (capture.py's events, by category) are read as the ledger reads a
step and replayed through the allocator model, so reserved bytes are predicted for these jobs too.

- DeepSpeed ZeRO (stage s, N processes): its engine partitions and casts the model itself and cannot
  run on fake tensors. Traced: the job without DeepSpeed, its weights in the dtype DeepSpeed trains in
  (bf16 or fp16 with mixed precision: the engine casts the model, no autocast; fp16 traced as bf16,
  the same bytes) and no optimizer step; at stage 3 a model of more than stage3_max_live_parameters
  (1e9, DeepSpeed's default) as FSDP's full_shard over N (each module's parameters gathered for its
  forward and backward and freed after), a smaller one as it is: its parameters stay gathered once
  used (each one's 1/N partition, `ds_tensor`, is not counted; a real job's ledger does not show it
  either: cause not established). Added, per process, as DeepSpeed's stage_1_and_2.py / stage3.py keep them: the
  client optimizer stepping one flat fp32 partition of the trainable values (1/N from stage 1: its
  state and its step's temporaries, traced on that flat tensor), the fp32 master weights of that
  partition (single_partition_of_fp32_groups, a clone also in fp32) and, at the step, the partition's
  gradients flattened into fp32 (single_grad_partition); from stage 2 each gradient is copied into a
  flat partition of 1/N of them in the gradients' dtype once reduced (contiguous_gradients) and freed.
  With optimizer offload on a GPU the state, master weights and step are on the host; with parameter
  offload (stage 3) the weights. Checked against real CPU jobs of one and two processes
  (tests/test_deepspeed.py); DeepSpeed's reduce buckets and prefetch buffers are not modelled.
- FSDP with CPU offload (CPUOffloadPolicy; GPU only): the job traced without offload; the sharded
  parameters, their gradients and the optimizer's state and step live in host memory
  (torch.distributed.fsdp: offload_policy), so they come off the device. Each unit's shard copied to
  the device before its all-gather is not modelled.
- Activation offload (save_on_cpu; GPU only): the job traced with every tensor saved for backward
  copied to the host as save_on_cpu copies it (fake.save_on_host), and those copies off the device.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from ..config.schema import Config, DeepspeedConf, FsdpConf, FsdpStrategy, PrecisionConf, PrecisionName


@dataclass(frozen=True)
class Block:
    """A buffer the real job holds that its nearest job does not: `nbytes` from the first `start` mark (or
    the step's start) to the last `end` mark (or the step's end)."""
    name: str
    category: str
    nbytes: int
    start: Optional[str] = None
    end: Optional[str] = None


@dataclass(frozen=True)
class Adjustment:
    reason: str  # what cannot be traced as it is, and what stands in for it
    nearest: Config  # the job traced
    host: frozenset = frozenset()  # categories the job keeps in host memory: off the device
    grads_share: float = 1.0  # the share of each gradient a process keeps (ZeRO-2)
    blocks: list = field(default_factory=list)  # Block: what the engine adds
    flat_optimizer: bool = False  # the optimizer steps one flat fp32 partition (ZeRO), not the model's weights
    flat_numel: int = 0  # ...of this many values (set by `sized`)
    save_on_host: bool = False  # saved tensors copied to the host (fake.save_on_host)

    def note(self) -> str:
        return f"adjusted trace: {self.reason}"


def for_job(job: Config, plan) -> Optional[Adjustment]:
    """The adjustment a job needs, or None when the trace runs it as it is."""
    t = plan.techniques
    if t.deepspeed.on:
        return zero(job, plan)
    if t.fsdp.offload:
        return Adjustment("FSDP's CPU offload keeps the sharded parameters, their gradients and the optimizer's "
                          "state and step in host memory: traced without offload, those taken off the device",
                          dataclasses.replace(job, fsdp=dataclasses.replace(job.fsdp, offload=False)),
                          host=frozenset({"params", "grads", "optimizer", "temp"}))
    if t.offload.activations and plan.device == "cuda":
        return Adjustment("save_on_cpu copies every tensor saved for backward to pinned host memory: traced with "
                          "those copies made and taken off the device", job, host=frozenset({"host"}),
                          save_on_host=True)
    return None


# DeepSpeed's stage3_max_live_parameters and stage3_max_reuse_distance default to 1e9 (Trainer leaves
# them unset): a model of fewer parameters stays gathered once its modules have run, as without ZeRO-3
MAX_LIVE_PARAMETERS = 1e9


def parameters(job: Config) -> int:
    from ..run.model import meta_model
    from ..run.task import auto_class, num_labels

    return sum(p.numel() for p in meta_model(job.model, auto_class(job.task),
                                             num_labels(job.task, job.data.labels)).parameters())


def zero(job: Config, plan) -> Adjustment:
    """DeepSpeed ZeRO: the nearest traceable job and the per-process buffers of the engine (module docstring);
    the sizes that depend on the trainable values are completed by `sized` once the model is built."""
    t = plan.techniques
    stage, mixed = t.deepspeed.stage, t.precision.autocast
    nearest = dataclasses.replace(job, deepspeed=DeepspeedConf())
    if mixed:
        nearest = dataclasses.replace(nearest, precision=PrecisionConf(name=PrecisionName.bf16_true))
    if stage == 3 and parameters(job) > MAX_LIVE_PARAMETERS:
        nearest = dataclasses.replace(nearest, fsdp=FsdpConf(name="full_shard", strategy=FsdpStrategy.full_shard))
    if stage == 0 and not mixed:
        return Adjustment("ZeRO stage 0 in fp32 trains as plain PyTorch: traced without DeepSpeed", nearest)
    off_host = plan.device == "cuda"  # the CPU is the host: offloading to it changes nothing there
    host = frozenset({"params"} if t.deepspeed.offload_param and stage == 3 and off_host else ())
    return Adjustment(f"DeepSpeed ZeRO-{stage} partitions and casts the model itself: traced as the job without "
                      f"DeepSpeed{' in bf16 weights' if mixed else ''}{' sharded as FSDP full_shard' if stage == 3 else ''}, "
                      "with ZeRO's per-process optimizer partition, master weights and gradient buffers added",
                      nearest, host=host, grads_share=0.0 if stage >= 2 else 1.0,
                      flat_optimizer=not (t.deepspeed.offload_optimizer and off_host))


def sized(adjustment: Adjustment, plan, trainable: int) -> Adjustment:
    """ZeRO's buffers for the model's `trainable` values: 1/N of them per process from stage 1 for the
    optimizer's partition, from stage 2 for the gradients'."""
    t = plan.techniques
    if not t.deepspeed.on or (t.deepspeed.stage == 0 and not t.precision.autocast):
        return adjustment
    stage, n = t.deepspeed.stage, plan.world_size
    partition = trainable // (n if stage >= 1 else 1)
    grad_bytes = t.precision.compute_bytes if t.precision.autocast else 4
    blocks = []
    if adjustment.flat_optimizer:
        # the optimizer's own fp32 copy of its partition (a clone in fp32 too), and at the step the
        # partition's gradients flattened into fp32 for it (single_grad_partition)
        blocks += [Block("fp32 master weights", "optimizer", 4 * partition),
                   Block("fp32 gradient partition", "grads", 4 * partition, start="step", end="end")]
    if stage >= 2:  # contiguous gradients: each gradient copied into the process's flat partition once reduced
        blocks.append(Block("gradient partition", "grads", grad_bytes * (trainable // n), start="backward"))
    return dataclasses.replace(adjustment, blocks=blocks, flat_numel=partition if adjustment.flat_optimizer else 0)


def apply(events: list, categories: dict, adjustment: Adjustment, optimizer=None) -> tuple[list, dict]:
    """The nearest job's events as the real job makes them: host categories off the device, a process's
    share of each gradient, the engine's blocks, and `optimizer` (step.flat_partition_step's recorder)
    in place of the traced optimizer's state and step."""
    kept, categories = [], dict(categories)
    for event in events:
        category = categories.get(event[1]) if event[0] in ("alloc", "free") else None
        if category in adjustment.host:
            continue
        if event[0] == "alloc" and category == "grads" and adjustment.grads_share != 1.0:
            event = ("alloc", event[1], int(event[2] * adjustment.grads_share))
        kept.append(event)
    if optimizer is not None:  # first: the blocks inserted at the same marks below come before its step
        state, recorder = optimizer
        kept = insert(kept, None, [("alloc", "flat optimizer state", state)])
        categories["flat optimizer state"] = "optimizer"
        during = recorder.events[recorder.events.index(("mark", "step")) + 1:recorder.events.index(("mark", "end"))]
        kept = insert(kept, "step", [(e[0], ("flat", e[1]), *e[2:]) for e in during])
        categories.update({("flat", k): c for k, c in recorder.categories.items()})
    for block in adjustment.blocks:
        kept = insert(kept, block.start, [("alloc", block.name, block.nbytes)])
        kept = insert(kept, block.end, [("free", block.name)], last=True) if block.end else kept
        categories[block.name] = block.category
    return kept, categories


def insert(events: list, mark: Optional[str], new: list, last: bool = False) -> list:
    """`new` after the first (or `last`) ("mark", `mark`) event; before everything when `mark` is None."""
    if mark is None:
        return new + events
    positions = [i for i, e in enumerate(events) if e == ("mark", mark)]
    if not positions:
        return events + new
    at = (positions[-1] if last else positions[0]) + 1
    return events[:at] + new + events[at:]
