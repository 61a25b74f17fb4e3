"""Jobs the trace cannot run as they are: the trace of the nearest job it can run, and arithmetic on that
step's allocations for what the real job does differently (DeepSpeed ZeRO, FSDP's CPU offload, optimizer
offload, activation offload). Each adjustment names its mechanism and source; the events it leaves
(capture.py's, by category) are read as the ledger reads a step and replayed through the allocator model,
so reserved bytes are predicted for these jobs too. Each mechanism, its sources and what is not modelled:
docs/estimator/adjustments.md.
"""
import dataclasses
import math
from dataclasses import dataclass, field

from ..config.schema import Config, DeepspeedConf, FsdpConf, FsdpStrategy, PrecisionConf, PrecisionName
from . import zero as zero_walk
from .events import Event


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
    cast, sharded = " in bf16 weights" if mixed else "", " sharded as FSDP full_shard" if stage == 3 else ""
    return Adjustment(f"DeepSpeed ZeRO-{stage} partitions and casts the model itself: traced as the job without "
                      f"DeepSpeed{cast}{sharded}, "
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


def apply(events: list[Event], categories: dict, adjustment: Adjustment, optimizer=None,
          rank: int = 0) -> tuple[list[Event], dict]:
    """The nearest job's events as `rank` of the real job makes them: host categories off the device, a
    process's share of each gradient or ZeRO-2's gradient path (zero.walk), the engine's blocks, and
    `optimizer` (step.flat_partition_step's recorder) in place of the traced optimizer's state and step."""
    kept, categories = [], dict(categories)
    if adjustment.zero is not None:
        events, categories = zero_walk.walk(events, categories, adjustment.zero, rank)
    for event in events:
        category = categories.get(event.key) if event.is_block() else None
        if category in adjustment.host:
            continue
        if event.kind == "alloc" and category == "grads" and adjustment.grads_share != 1.0:
            event = event._replace(nbytes=int(event.nbytes * adjustment.grads_share))
        kept.append(event)
    if optimizer is not None:  # first: the blocks inserted at the same marks below come before its step
        state, recorder = optimizer
        kept = insert(kept, None, [Event.alloc("flat optimizer state", state)])
        categories["flat optimizer state"] = "optimizer"
        step, end = recorder.events.index(Event.mark("step")), recorder.events.index(Event.mark("end"))
        kept = insert(kept, "step", [e._replace(key=("flat", e.key)) for e in recorder.events[step + 1:end]])
        categories.update({("flat", k): c for k, c in recorder.categories.items()})
    for block in adjustment.blocks:
        kept = insert(kept, block.start, [Event.alloc(block.name, block.nbytes)])
        kept = insert(kept, block.end, [Event.free(block.name)], last=True) if block.end else kept
        categories[block.name] = block.category
    return kept, categories


def insert(events: list[Event], mark: str | None, new: list[Event], last: bool = False) -> list[Event]:
    """`new` after the first (or `last`) mark named `mark`; before everything when `mark` is None."""
    if mark is None:
        return new + events
    positions = [i for i, e in enumerate(events) if e.is_mark(mark)]
    if not positions:
        return events + new
    at = (positions[-1] if last else positions[0]) + 1
    return events[:at] + new + events[at:]
