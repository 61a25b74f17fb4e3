"""The trace: one warm-up and one measured training step of the job's real composed model (the same
Setup, model class, technique transforms and optimizer class as a real job) on fake tensors (fake.py:
shapes and dtypes, no storage), measured by the same LedgerTracker (torch's MemTracker) as real jobs.
No weights, no data, no GPU; on the CPU it reproduces the measured ledger. FLOPs come from the warm-up
step's ops, each by torch.utils.flop_counter's formulas (op_record.py records them).

The measured step's allocations and frees are recorded beside the ledger (capture.py): read as the
ledger reads a step they give its peak (`recorded_peak_bytes`, a check); on a GPU profile they are
replayed through the model of the CUDA caching allocator (allocator.py); for a job traced as its nearest
job (adjust.py) they are adjusted by the job's arithmetic and are the reading. All of it is a Trace (traced.py).
"""
import contextlib
import dataclasses
import time

import torch

from ..config.schema import Config, HardwareConf
from ..measure.ledger import LedgerTracker, eager, ledger_reading
from ..measure.optimizer_state import inner_optimizer
from ..techniques import optim
from . import adjust, capture, fake, op_record, paged, products, scratch, sharded, zero
from .op_record import CountedOp, OpCost
from .products import CountedProduct
from .step import (
    RUN_MICRO_BATCHES,
    TrainerLoop,
    build_optimizer,
    fake_batch,
    flat_partition_ops,
    flat_partition_step,
    optimizer_spec,
    state_bytes,
    trainer_arguments,
    training_step,
)
from .traced import RankReading, Trace


@contextlib.contextmanager
def fake_job(job: Config, setup, profile: HardwareConf, model):
    """The model as the job runs it, on fake tensors: as rank 0 of the job's ranks (nodes x nproc) under FSDP,
    wrapped as Accelerate wraps the real job, with no bitsandbytes overrides left by earlier jobs, run eager."""
    with contextlib.ExitStack() as stack:
        if setup.techniques.fsdp.on:
            # TrainingArguments asked for outside the fake process group (inside, they warn it is not theirs)
            args = trainer_arguments(setup, ("fsdp", "fsdp_config", "bf16", "fp16"))
            stack.enter_context(sharded.fake_process_group(setup.world_size))
            model = sharded.shard(model, args.fsdp_plugin_args, fake.accelerate_dtype(setup))
        model = stack.enter_context(fake.on_fake_tensors(model, setup, profile))
        stack.enter_context(optim.own_bitsandbytes_overrides())
        stack.enter_context(eager())
        yield model


def workspace_bytes(profile: HardwareConf) -> int:
    """The cuBLAS workspace a GPU job's matmuls allocate (each handle's first); none on a CPU."""
    return capture.cublas_workspace_bytes(profile.compute_capability) if profile.device == "cuda" else 0


def trace(job: Config, profile: HardwareConf, setup, model, adjustment: adjust.Adjustment | None = None) -> Trace:
    """The ledger of one training step of `model` (meta.traced_model of `job`, the adjustment's nearest
    job where there is one) on fake tensors, as LedgerCallback takes it on a real job, and its FLOPs."""
    started = time.perf_counter()
    spec = optimizer_spec(setup, model)
    with fake_job(job, setup, profile, model) as model:
        optimizer = None if adjustment and adjustment.flat_numel else build_optimizer(setup, model, profile, spec)
        loop = TrainerLoop()  # what Trainer keeps from the warm-up step (its first) into the measured one
        flops, ops, sequence, products, recomputed = warm_up(job, setup, model, optimizer,
                                                             on_cpu=profile.device == "cpu", loop=loop)
        recorder = step_recorder(model, optimizer, profile)
        tracker = LedgerTracker(root=model)
        tracker.track_external(model, *([optimizer] if optimizer else []))
        forward = [lambda: fake.save_on_host(recorder)] if adjustment and adjustment.save_on_host else None
        # On a CPU the collated batches are the tensors the model reads, every micro-batch's made before the step
        # begins (outside the real ledger; view_later_inputs); a GPU job copies each to the device inside the step.
        ran = min(setup.accumulation_steps, RUN_MICRO_BATCHES)
        early = measured_batches(job, setup, model, setup.accumulation_steps) if profile.device != "cuda" else None
        recorder.outside(early or [])
        walked = zero.hooks(model, recorder) if adjustment and adjustment.zero else contextlib.nullcontext()
        held = zero.held_until_step(model) if adjustment and adjustment.module_units else []
        with tracker, recorder, walked:
            batches = early or measured_batches(job, setup, model, ran)
            training_step(model, optimizer, batches, setup, marks=zero.ReshardAfterBackward(recorder, held),
                          forward_contexts=forward, loop=loop)
        recorder.events, paged_bytes = paged.off_allocator(recorder.events, recorder.categories)
        traced = Trace(
            **without_paged(ledger_reading(tracker, state_bytes(optimizer) if optimizer else 0), paged_bytes),
            paged_state_bytes=paged_bytes,
            flops_per_step=flops * setup.accumulation_steps, roofline_ops=ops, roofline_sequence=sequence,
            roofline_products=products, recomputed_ops=recomputed,
            modules=sum(1 for _ in model.modules()),  # what Trainer walks each micro-batch
            paged_in_bytes=capture.paged_in(recorder.events, ran),
            optimizer=type(optimizer).__name__ if optimizer else spec.cls.__name__,
            recorded_peak_bytes=capture.tensor_reading(recorder.events, recorder.categories).peak_bytes)
    if adjustment is not None:
        traced = adjusted_reading(traced, recorder, adjustment, profile, spec)  # with this GPU's scratch
        traced = flat_step_ops(traced, adjustment, spec, profile, model)
        traced.gpu, traced.workspace = reading_key(profile)
        if adjustment.save_on_host:  # what save_on_cpu copies to the host per micro-batch, and back in backward
            traced.offloaded_bytes_per_micro_batch = sum(
                e.nbytes for e in recorder.events if e.kind == "alloc" and recorder.categories.get(e.key) == "host"
            ) // ran
    elif profile.device == "cuda":
        # kept for the planner, which derives other micro-batches from them (planner/batch.py), and to read
        # the step on another GPU (for_gpu)
        traced.events, traced.categories = recorder.events, recorder.categories
        traced.reductions, traced.cublas_keys = recorder.reductions, recorder.workspaces
        traced = for_gpu(traced, profile)
    traced.seconds = round(time.perf_counter() - started, 2)
    return traced


def step_recorder(model, optimizer, profile: HardwareConf) -> capture.Recorder:
    """The step's allocations and frees, beside the ledger: for the allocator model, an adjustment, and as a
    check of their own (read as the ledger reads a step, they give its peak). On a GPU a paged bitsandbytes
    optimizer keeps its state in unified memory (paged.py)."""
    inner = inner_optimizer(optimizer) if optimizer else None
    pages_state = profile.device == "cuda" and getattr(inner, "is_paged", False)
    return capture.Recorder(capture.alive_at_step(model, inner, workspace=workspace_bytes(profile),
                                                  paged=pages_state))


def without_paged(reading, paged_bytes: int) -> dict:
    """The fake step's ledger as a GPU job's ledger reads it: bitsandbytes' paged state is a CPU tensor over
    unified memory (functional.get_paged), which the device's tally does not count. It is alive through the
    whole measured step, so it comes off the peak and its optimizer share alike."""
    out = dataclasses.asdict(reading)
    if paged_bytes:
        out["peak_bytes"] -= paged_bytes
        out["optimizer_bytes"] -= paged_bytes
        out["breakdown"] = {**out["breakdown"], "optimizer": out["breakdown"]["optimizer"] - paged_bytes}
    return out


def reading_key(profile: HardwareConf) -> tuple:
    """What an allocator reading depends on besides the trace: the GPU's reduction split and its cuBLAS workspace."""
    return scratch.gpu_of(profile), workspace_bytes(profile)


def made_for(traced: Trace, profile: HardwareConf) -> bool:
    """Whether the trace's allocator reading is already the one for `profile`'s GPU (always, off CUDA)."""
    return profile.device != "cuda" or (traced.gpu, traced.workspace) == reading_key(profile)


def readable_on(traced: Trace, profile: HardwareConf) -> bool:
    """Whether `for_gpu` can read the trace on `profile`'s GPU: made for it, or a plain trace (events kept).
    An adjusted job's trace (ZeRO, offload) made for another GPU must be traced again."""
    return made_for(traced, profile) or traced.events is not None


def for_gpu(traced: Trace, profile: HardwareConf) -> Trace:
    """The trace's allocator reading on `profile`'s GPU: its reductions' scratch (scratch.py) and the cuBLAS
    workspaces sized for that GPU, read once per GPU (kept in the trace's `readings`). One plain trace
    serves GPUs of the same device this way."""
    if made_for(traced, profile):
        return traced
    gpu, workspace = reading_key(profile)
    if (gpu, workspace) not in traced.readings:
        cublas = set(traced.cublas_keys)
        events = [e._replace(nbytes=workspace) if e.kind == "alloc" and e.key in cublas else e
                  for e in scratch.sized(traced.events, traced.reductions, gpu)]
        traced.readings[(gpu, workspace)] = capture.allocator_reading(events, traced.categories)
    return dataclasses.replace(traced, allocator=traced.readings[(gpu, workspace)], gpu=gpu, workspace=workspace)


def warm_up(job: Config, setup, model, optimizer, on_cpu: bool = False, loop: TrainerLoop | None = None,
            ) -> tuple[int, list[CountedOp], list[OpCost], list[CountedProduct], int]:
    """The real ledger's step 1: one micro-batch and an optimizer step, which leaves the optimizer state
    behind. Its ops are recorded here (op_record.py): one micro-batch's forward and backward (and how many of the
    backward's ops recompute the forward: activation checkpointing), and the optimizer step; their FLOPs are the
    micro-batch's (torch.utils.flop_counter's formulas, op by op, as FlopCounterMode sums them). The measured
    step runs under the ledger and the recorder only: a counting mode there can keep what it sees alive
    (FlopCounterMode keeps checkpointing's recomputed activations: a false peak)."""
    batch = fake_batch(model, setup.micro_batch_size, job.max_seq_len, setup.task)
    with op_record.recording(on_cpu) as ops:
        training_step(model, optimizer, [batch], setup, marks=ops, loop=loop)
    record = op_record.reading(ops)
    return op_record.micro_batch_flops(record), record, ops.sequence, products.reading(ops), ops.recomputed


def measured_batches(job: Config, setup, model, count: int) -> list:
    """`count` micro-batches of the measured step (training_step runs the first RUN_MICRO_BATCHES)."""
    return [fake_batch(model, setup.micro_batch_size, job.max_seq_len, setup.task) for _ in range(count)]


def flat_step_ops(traced: Trace, adjustment: adjust.Adjustment, spec, profile: HardwareConf, model) -> Trace:
    """ZeRO's optimizer step on the process's flat partition (step.flat_partition_ops) added to the step's ops:
    the nearest job is traced without an optimizer. Its gradients and weights are the traced model's dtype
    (the one DeepSpeed trains in)."""
    if not adjustment.flat_numel:
        return traced
    dtype = next((p.dtype for p in model.parameters() if p.requires_grad), torch.float32)
    ops, sequence = flat_partition_ops(spec, adjustment.flat_numel, profile, dtype)
    return dataclasses.replace(traced, roofline_ops=traced.roofline_ops + ops,
                               roofline_sequence=list(traced.roofline_sequence) + sequence)


def adjusted_reading(traced: Trace, recorder, adjustment: adjust.Adjustment, profile: HardwareConf, spec) -> Trace:
    """The nearest job's recorded step with the adjustment's arithmetic, read as the ledger reads a step
    (and, on a GPU profile, through the allocator model), in place of the nearest job's own ledger: rank
    0's, and for a job of several processes each rank's in `per_rank`. Ranks differ where ZeRO-2's walk
    gives each its own partition (zero.py); ZeRO-3 pads every parameter's partition to 1/N on each rank
    (partition_parameters.py, _partition_param), so there every rank holds what rank 0 does."""
    flat = flat_partition_step(spec, adjustment.flat_numel, profile) if adjustment.flat_numel else None
    readings, sized = [], scratch.sized(recorder.events, recorder.reductions, scratch.gpu_of(profile))
    for rank in range(adjustment.zero.world if adjustment.zero else 1):
        events, categories = adjust.apply(sized, recorder.categories, adjustment, flat, rank)
        allocator = capture.allocator_reading(events, categories) if profile.device == "cuda" else None
        readings.append(dataclasses.replace(traced, **dataclasses.asdict(capture.tensor_reading(events, categories)),
                                            adjustment=adjustment.reason,
                                            optimizer_on_host="optimizer" in adjustment.host, allocator=allocator))
    if adjustment.ranks > 1:
        readings[0].per_rank = [RankReading(n, r.peak_bytes, r.breakdown, r.allocator)
                                for n, r in enumerate(readings[min(n, len(readings) - 1)]
                                                      for n in range(adjustment.ranks))]
    return readings[0]
