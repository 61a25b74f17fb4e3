"""Jobs the trace cannot run as they are: the trace of the nearest job it can run, and arithmetic on that
step's allocations for what the real job does differently. Each adjustment names its mechanism and
source; the allocations it leaves (capture.py's events, by category) are read as the ledger reads a
step and replayed through the allocator model, so reserved bytes are predicted for these jobs too.

- DeepSpeed ZeRO (stage s, N processes): its engine partitions and casts the model itself and cannot
  run on fake tensors. Traced: the job without DeepSpeed, its weights in the dtype DeepSpeed trains in
  (bf16 or fp16 with mixed precision: the engine casts the model, no autocast; fp16 traced as bf16,
  the same bytes) and no optimizer step. Stage 3 over N >= 2 processes is traced as FSDP full_shard
  over N with a unit for every module that holds parameters: stage3.py gathers each submodule's own
  parameters before it runs and releases them after (PartitionedParameterCoordinator); the FSDP shards
  stand for the 1/N partitions (ds_tensor). On one process stage 3 is traced as it is: a parameter is
  a view of its whole partition (partition_parameters.py, NoGatherHandle: nothing is gathered).
  Added, per process, as stage_1_and_2.py / stage3.py keep them: the client optimizer stepping one flat
  fp32 partition of the trainable values (1/N from stage 1: its state and its step's temporaries,
  traced on that flat tensor), the fp32 master weights of that partition (single_partition_of_fp32_groups,
  a clone also in fp32) and, at the step, the partition's gradients flattened into fp32
  (single_grad_partition). Stage 2: each rank's gradient path walked as DeepSpeed runs it (zero.py:
  reduce bucket, grads_in_partition made at its first reduced gradient, flat copies of the reductions),
  with the job's reduce_bucket_size; with offload or without contiguous_gradients a flat partition of
  1/N of the gradients from the start of backward instead. Stage 3: grad_partitions_flat_buffer, 1/N of
  each gradient padded as the parameter is (made with the engine, held throughout); the gradients
  FSDP's trace keeps are left out. With optimizer offload on a GPU the state, master weights and step are
  on the host; with parameter offload (stage 3) the weights. Checked against real CPU jobs of one and
  two processes, each rank (tests/test_deepspeed.py, tests/test_distributed.py). Not modelled: stage 3's
  reduce bucket (reduce_bucket_size, hidden_size**2 with "auto"), its prefetch of the next modules
  (stage3_prefetch_bucket_size) and its persistent small parameters (stage3_param_persistence_threshold),
  which FSDP's units gather and free like the others.
- FSDP with CPU offload (CPUOffloadPolicy; GPU only): the job traced without offload; the sharded
  parameters, their gradients and the optimizer's state and step live in host memory
  (torch.distributed.fsdp: offload_policy), so they come off the device. Each unit's shard copied to
  the device before its all-gather is not modelled.
- Optimizer offload on one GPU (torchao's CPUOffloadOptimizer; offload=optimizer): the job traced as it
  is; the optimizer's state and its step's temporaries come off the device (each trainable tensor's
  gradient is copied to a pinned host copy by a post-accumulate-grad hook, the host optimizer steps it and
  the weights are copied back, torchao/optim/cpu_offload.py). With offload_gradients (optimizer_and_grads)
  the gradients come off too. Not modelled: tensors under 4,096 values keep their state on the device
  (minimal_size: biases and norms, a few MB), and a gradient lives on the device from its accumulation
  until its copy has run on the side stream (record_stream).
- Activation offload (save_on_cpu; GPU only): the job traced with every tensor saved for backward
  copied to the host as save_on_cpu copies it (fake.save_on_host), and those copies off the device.
"""
import dataclasses
import math
from dataclasses import dataclass, field

from ..config.schema import Config, DeepspeedConf, FsdpConf, FsdpStrategy, PrecisionConf, PrecisionName
from . import zero as zero_walk
from .allocator import BLOCK_EVENTS


@dataclass(frozen=True)
class Block:
    """A buffer the real job holds that its nearest job does not: `nbytes` from the first `start` mark (or
    the step's start) to the last `end` mark (or the step's end)."""
    name: str
    category: str
    nbytes: int
    start: str | None = None
    end: str | None = None


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
    zero: zero_walk.Settings | None = None  # ZeRO-2's gradient path, walked for each rank (zero.py)
    ranks: int = 1  # the job's processes: each gets its own reading (trace.adjusted_reading)
    module_units: bool = False  # FSDP units of every module holding parameters (ZeRO-3's gathering), not blocks

    def note(self) -> str:
        return f"adjusted trace: {self.reason}"


def adjustment_for(job: Config, setup) -> Adjustment | None:
    """The adjustment a job needs, or None when the trace runs it as it is."""
    t = setup.techniques
    if t.deepspeed.on:
        return zero(job, setup)
    if t.fsdp.offload:
        return Adjustment("FSDP's CPU offload keeps the sharded parameters, their gradients and the optimizer's "
                          "state and step in host memory: traced without offload, those taken off the device",
                          dataclasses.replace(job, fsdp=dataclasses.replace(job.fsdp, offload=False)),
                          host=frozenset({"params", "grads", "optimizer", "temp"}))
    if t.offload.optimizer and setup.device == "cuda":
        grads = " and each gradient (freed on the device once copied)" if t.offload.grads else ""
        return Adjustment(f"torchao's CPUOffloadOptimizer keeps the optimizer's state and step{grads} in host "
                          "memory: traced as it is, those taken off the device", job,
                          host=frozenset({"optimizer", "temp"} | ({"grads"} if t.offload.grads else set())))
    if t.offload.activations and setup.device == "cuda":
        return Adjustment("save_on_cpu copies every tensor saved for backward to pinned host memory: traced with "
                          "those copies made and taken off the device", job, host=frozenset({"host"}),
                          save_on_host=True)
    return None


def zero(job: Config, setup) -> Adjustment:
    """DeepSpeed ZeRO: the nearest traceable job and the per-process buffers of the engine (module docstring);
    the sizes that depend on the trainable values are completed by `sized` once the model is built."""
    t = setup.techniques
    stage, mixed = t.deepspeed.stage, t.precision.autocast
    nearest = dataclasses.replace(job, deepspeed=DeepspeedConf())
    if mixed:
        nearest = dataclasses.replace(nearest, precision=PrecisionConf(name=PrecisionName.bf16_true))
    if stage == 3 and setup.world_size > 1:  # each module's parameters gathered for its use and released after
        nearest = dataclasses.replace(nearest, fsdp=FsdpConf(name="full_shard", strategy=FsdpStrategy.full_shard))
    if stage == 0 and not mixed:
        return Adjustment("ZeRO stage 0 in fp32 trains as plain PyTorch: traced without DeepSpeed", nearest)
    off_host = setup.device == "cuda"  # the CPU is the host: offloading to it changes nothing there
    # offloaded, the optimizer's state and step are CPUAdam's on the host (the traced optimizer's come off)
    host = frozenset(({"params"} if t.deepspeed.offload_param and stage == 3 and off_host else set())
                     | ({"optimizer", "temp"} if t.deepspeed.offload_optimizer and off_host else set()))
    return Adjustment(f"DeepSpeed ZeRO-{stage} partitions and casts the model itself: traced as the job without "
                      f"DeepSpeed{' in bf16 weights' if mixed else ''}{' sharded as FSDP full_shard' if stage == 3 else ''}, "
                      "with ZeRO's per-process optimizer partition, master weights and gradient buffers added",
                      nearest, host=host, grads_share=0.0 if stage >= 2 else 1.0,
                      flat_optimizer=not (t.deepspeed.offload_optimizer and off_host),
                      module_units=stage == 3 and setup.world_size > 1, ranks=setup.world_size)


def sized(adjustment: Adjustment, setup, model) -> Adjustment:
    """ZeRO's buffers for the (traced) model's trainable values: 1/N of them per process from stage 1 for the
    optimizer's partition; from stage 2 the gradients' path, walked per rank where zero.py models it (the
    contiguous-gradient path without offload), else a flat partition from the start of backward."""
    t = setup.techniques
    if not t.deepspeed.on or (t.deepspeed.stage == 0 and not t.precision.autocast):
        return adjustment
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    stage, n = t.deepspeed.stage, setup.world_size
    partition = trainable // (n if stage >= 1 else 1)
    grad_bytes = t.precision.compute_bytes if t.precision.autocast else 4
    walked = zero_walk.settings(setup.args["deepspeed"], model, n, grad_bytes)
    blocks = []
    if adjustment.flat_optimizer:
        # the optimizer's own fp32 copy of its partition (a clone in fp32 too), and at the step the
        # partition's gradients flattened into fp32 for it (single_grad_partition)
        blocks += [Block("fp32 master weights", "optimizer", 4 * partition),
                   Block("fp32 gradient partition", "grads", 4 * partition, start="step", end="end")]
    if stage == 3:  # grad_partitions_flat_buffer: 1/N of every gradient, made with the engine (stage3.py __init__)
        padded = sum(math.ceil(p.numel() / n) for p in model.parameters() if p.requires_grad)  # _aligned_size
        blocks.append(Block("gradient partition", "grads", grad_bytes * padded))
    elif stage == 2 and walked is None:  # contiguous gradients: each copied into the process's flat partition
        blocks.append(Block("gradient partition", "grads", grad_bytes * (trainable // n), start="backward"))
    return dataclasses.replace(adjustment, blocks=blocks, flat_numel=partition if adjustment.flat_optimizer else 0,
                               zero=walked, grads_share=1.0 if walked else adjustment.grads_share)


def apply(events: list, categories: dict, adjustment: Adjustment, optimizer=None, rank: int = 0) -> tuple[list, dict]:
    """The nearest job's events as `rank` of the real job makes them: host categories off the device, a
    process's share of each gradient or ZeRO-2's gradient path (zero.walk), the engine's blocks, and
    `optimizer` (step.flat_partition_step's recorder) in place of the traced optimizer's state and step."""
    kept, categories = [], dict(categories)
    if adjustment.zero is not None:
        events, categories = zero_walk.walk(events, categories, adjustment.zero, rank)
    for event in events:
        category = categories.get(event[1]) if event[0] in BLOCK_EVENTS else None
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


def insert(events: list, mark: str | None, new: list, last: bool = False) -> list:
    """`new` after the first (or `last`) ("mark", `mark`) event; before everything when `mark` is None."""
    if mark is None:
        return new + events
    positions = [i for i, e in enumerate(events) if e == ("mark", mark)]
    if not positions:
        return events + new
    at = (positions[-1] if last else positions[0]) + 1
    return events[:at] + new + events[at:]
