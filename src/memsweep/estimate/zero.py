"""ZeRO stage 2's gradient path, for each rank, on the nearest job's recorded backward (adjust.py): each
gradient handled where DeepSpeed's hook runs (recorded "grad" events: `hooks`), bucketed, reduced and copied
into the rank's partition as stage_1_and_2.py does, with the job's own DeepSpeed sizes; and for stage 3,
traced as FSDP, the modules whose gathered weights DeepSpeed holds past their backward (`held_until_step`).
The walk, step by step with DeepSpeed's functions: docs/estimator/adjustments.md.
"""
import contextlib
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from .events import Event

# stage_1_and_2.py: nccl_start_alignment_factor, 4-byte alignment / sizeof(fp16)
ALIGNMENT = 2


@dataclass(frozen=True)
class Settings:
    """What the walk needs of the job's DeepSpeed config and model."""
    world: int
    bucket: int  # reduce_bucket_size, in elements
    buffers: int  # reduce buckets: 2 with overlap_comm (double buffering), else 1
    dtype_bytes: int  # the model's dtype: the bucket's and grads_in_partition's
    groups: tuple  # per optimizer param group: ((name, numel), ...) in the group's order


def settings(ds_config: dict, model, world: int, dtype_bytes: int) -> Settings | None:
    """The walk's settings from the job's DeepSpeed JSON (its "auto" sizes as transformers' HfTrainerDeepSpeedConfig
    fills them: reduce_bucket_size = hidden_size**2), read through DeepSpeed's own config class for its defaults;
    None where stage 2's contiguous-gradient path does not apply (another stage, no contiguous_gradients,
    optimizer offload, round_robin_gradients: those keep adjust.py's blocks)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    raw = dict(ds_config["zero_optimization"])
    if raw.get("reduce_bucket_size") == "auto":
        raw["reduce_bucket_size"] = hidden_size(model.config) ** 2
    raw = {k: v for k, v in raw.items() if v != "auto"}
    zero = DeepSpeedZeroConfig(**raw)
    if (int(zero.stage) != 2 or not zero.contiguous_gradients or zero.offload_optimizer is not None
            or zero.round_robin_gradients):
        return None
    return Settings(world=world, bucket=int(zero.reduce_bucket_size), buffers=2 if zero.overlap_comm else 1,
                    dtype_bytes=dtype_bytes, groups=param_groups(model))


def hidden_size(config) -> int:
    """The hidden size transformers' DeepSpeed integration sizes "auto" buckets by (its text config's for a
    multimodal model; the largest of `hidden_sizes`)."""
    config = config if hasattr(config, "hidden_size") or hasattr(config, "hidden_sizes") else config.text_config
    return config.hidden_size if hasattr(config, "hidden_size") else max(config.hidden_sizes)


def param_groups(model) -> tuple:
    """The trainable parameters as Trainer.create_optimizer groups them (decay, then no decay), in order."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    groups = ([(n, k) for n, k in named if n in decay], [(n, k) for n, k in named if n not in decay])
    return tuple(tuple(g) for g in groups if g)


class Slice(NamedTuple):
    """The part of a parameter's flattened values in one rank's partition."""
    rank: int
    numel: int


class Placement(NamedTuple):
    """Where a parameter's values lie: how many, and a slice for each partition it overlaps, in order."""
    numel: int
    slices: tuple[Slice, ...]


def ownership(s: Settings) -> tuple[dict[str, Placement], list[int]]:
    """Each parameter's Placement by name, and per rank the elements of its grads_in_partition (every parameter
    it overlaps, in full)."""
    placements, partition_numel = {}, [0] * s.world
    for group in s.groups:
        total = sum(numel for _, numel in group)
        size = math.ceil(total / (ALIGNMENT * s.world)) * ALIGNMENT
        start = 0
        for name, numel in group:
            slices = tuple(Slice(r, min(start + numel, (r + 1) * size) - max(start, r * size)) for r in range(s.world)
                           if start < (r + 1) * size and start + numel > r * size)
            placements[name] = Placement(numel, slices)
            for piece in slices:
                partition_numel[piece.rank] += numel
            start += numel
    return placements, partition_numel


def flat_copies(slices: list[Slice], bucket: int) -> list[int]:
    """The tensors `allreduce_bucket` makes while reducing `slices` (in bucket order), in elements:
    average_tensor merges consecutive slices of one rank, allreduce_and_scatter reduces them in groups that
    end once past reduce_bucket_size elements, and `_flatten_dense_tensors` copies a group of two or more
    into one new tensor (one tensor alone is only viewed)."""
    merged: list[Slice] = []
    for piece in slices:
        if merged and merged[-1].rank == piece.rank:
            merged[-1] = Slice(piece.rank, merged[-1].numel + piece.numel)
        else:
            merged.append(piece)
    copies, group = [], []
    for piece in merged:
        group.append(piece.numel)
        if sum(group) > bucket:
            copies.append(group)
            group = []
    copies += [group] if group else []
    return [sum(g) for g in copies if len(g) > 1]


class Pending(NamedTuple):
    """A gradient in the reduce bucket, waiting for its reduction: its parameter, and the key of its own block
    when it is too large for the bucket (None: copied into the bucket)."""
    name: str
    key: Hashable


class Walk:
    """One rank's events: the recorded ones, with each gradient handled as stage_1_and_2.py handles it."""

    def __init__(self, s: Settings, rank: int):
        self.s, self.rank = s, rank
        self.placements, partition_numel = ownership(s)
        self.partition_bytes = partition_numel[rank] * s.dtype_bytes
        self.out: list[Event] = []
        self.categories: dict = {}
        self.pending: list[Pending] = []
        self.elements = 0
        self.bucket_made = False
        self.micro_batch = 0
        self.partition: tuple | None = None  # this micro-batch's grads_in_partition block

    def block(self, key, nbytes: int, category: str) -> None:
        self.out.append(Event.alloc(key, nbytes))
        self.categories[key] = category

    def gradient(self, name: str, key) -> None:
        """A parameter's gradient hook: bucket it, reducing the bucket first when it would overflow. `key`:
        the block of its gradient; None for a later micro-batch's, which the nearest job added into the
        accumulated one and freed (DeepSpeed cleared .grad at the epilogue: it is a fresh tensor)."""
        numel = self.placements[name].numel
        if not self.bucket_made:
            for n in range(self.s.buffers):
                self.block(("reduce bucket", self.micro_batch, n), self.s.bucket * self.s.dtype_bytes, "temp")
            self.bucket_made = True
        if self.elements + numel > self.s.bucket:
            self.reduce()
        if numel > self.s.bucket:  # its own tensor until reduced
            if key is None:
                key = ("gradient", name, self.micro_batch)
                self.block(key, numel * self.s.dtype_bytes, "temp")
            self.pending.append(Pending(name, key))
        else:
            self.pending.append(Pending(name, None))
            if key is not None:
                self.out.append(Event.free(key))  # copied into the bucket
        self.elements += numel

    def reduce(self) -> None:
        """reduce_ipg_grads: all-reduce the bucket (or the oversized gradient) through allreduce_bucket's
        flat copies, then copy this rank's gradients into its partition and free the others'."""
        if not self.pending:
            return
        slices = [piece for gradient in self.pending for piece in self.placements[gradient.name].slices]
        for numel in flat_copies(slices, self.s.bucket):
            flat = ("flat copy", len(self.out))
            self.block(flat, numel * self.s.dtype_bytes, "temp")
            self.out.append(Event.free(flat))
        for gradient in self.pending:
            owned = any(piece.rank == self.rank for piece in self.placements[gradient.name].slices)
            if owned and self.partition is None:
                self.partition = ("gradient partition", self.micro_batch)
                self.block(self.partition, self.partition_bytes, "grads")
            if gradient.key is not None:
                self.out.append(Event.free(gradient.key))
        self.pending, self.elements = [], 0

    def epilogue(self) -> None:
        """independent_gradient_partition_epilogue: the last bucket reduced, the buckets freed; a later
        micro-batch's partition added into the first's and freed."""
        self.reduce()
        if self.bucket_made:
            self.out += [Event.free(("reduce bucket", self.micro_batch, n)) for n in range(self.s.buffers)]
        if self.micro_batch > 0 and self.partition is not None:
            self.out.append(Event.free(self.partition))
        self.bucket_made, self.partition = False, None
        self.micro_batch += 1


def walk(events: list[Event], categories: dict, s: Settings, rank: int) -> tuple[list[Event], dict]:
    """`rank`'s events: the recorded step with stage 2's gradient path (module docstring) in place of the
    nearest job's whole gradients, which are freed here where DeepSpeed frees them. "grad" events (recorded
    by a post-accumulate-grad hook, where DeepSpeed's hook runs) say when each is made."""
    w, in_backward, handled = Walk(s, rank), False, set()
    w.categories = dict(categories)
    for event in events:
        if event.kind == "mark":
            if in_backward:
                w.epilogue()
            in_backward = event.name == "backward"
        if event.kind == "grad":
            if event.name in w.placements:
                w.gradient(event.name, None if event.key in handled else event.key)
                handled.add(event.key)
            continue
        if event.kind == "free" and event.key in handled:
            continue  # already freed where DeepSpeed frees it
        w.out.append(event)
    return w.out, w.categories


@contextlib.contextmanager
def hooks(model, recorder):
    """Record a "grad" event where DeepSpeed's gradient hook runs: after each trainable parameter's
    gradient is accumulated (register_post_accumulate_grad_hook)."""
    handles = [p.register_post_accumulate_grad_hook(lambda p, name=name: recorder.grad_made(name, p.grad))
               for name, p in model.named_parameters() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def held_until_step(model) -> list:
    """ZeRO-3's modules whose inputs need no gradient (embeddings: their input is token ids): DeepSpeed
    releases a module's parameters after its backward through a function applied to its inputs
    (parameter_offload.py, _post_backward_module_hook), which never runs for these, so their gathered
    weights are held until the optimizer step partitions every parameter (stage3.py step:
    _partition_all_parameters). In the trace: their FSDP units not resharded by FSDP's own post-backward,
    which comes before the gradient's reduce-scatter (ReshardAfterBackward does it after)."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule) and isinstance(m, torch.nn.Embedding)]
    for unit in units:
        unit.set_reshard_after_backward(False)
    return units


class ReshardAfterBackward:
    """The recorder's marks, which reshard `units` (held_until_step) once backward is done, before the
    gradients are tagged (a unit's sharded gradient is its sharded parameter's, in place again). DeepSpeed
    releases them at the optimizer step's start, or in the next micro-batch's forward, after its own
    use: nothing is allocated in between."""

    def __init__(self, marks, units: list):
        self.marks, self.units = marks, units

    def mark(self, name: str) -> None:
        self.marks.mark(name)

    def viewed(self, t) -> bool:
        return self.marks.viewed(t)

    def tag_grads(self, model) -> None:
        for unit in self.units:
            unit.reshard()
        self.marks.tag_grads(model)
