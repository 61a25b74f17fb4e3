"""The trace: one warm-up and one measured training step of the job's real composed model (the same
Setup, model class, technique transforms and optimizer class as a real job) on fake tensors (fake.py:
shapes and dtypes, no storage), measured by the same LedgerTracker (torch's MemTracker) as real jobs.
No weights, no data, no GPU; on the CPU it reproduces the measured ledger. FLOPs come from the warm-up
step's ops, each by torch.utils.flop_counter's formulas (op_record.py records them).

The measured step's allocations and frees are recorded beside the ledger (capture.py): read as the
ledger reads a step they give its peak (`recorded_peak_bytes`, a check); on a GPU profile they are
replayed through the model of the CUDA caching allocator (allocator.py); for a job traced as its nearest
job (adjust.py) they are adjusted by the job's arithmetic and are the reading.
"""
import contextlib
import time
from typing import Any

import torch

from ..config.schema import Config, HardwareConf
from ..measure.ledger import LedgerTracker, eager, ledger_reading
from ..measure.optimizer_state import inner_optimizer
from ..techniques import optim
from . import adjust, capture, fake, op_record, products, scratch, sharded, zero
from .step import (
    build_optimizer,
    fake_batch,
    flat_partition_ops,
    flat_partition_step,
    optimizer_spec,
    state_bytes,
    trainer_arguments,
    training_step,
)


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


def trace(job: Config, profile: HardwareConf, setup, model, adjustment: adjust.Adjustment | None = None,
          ) -> dict[str, Any]:
    """The ledger of one training step of `model` (meta.traced_model of `job`, the adjustment's nearest
    job where there is one) on fake tensors, as LedgerCallback takes it on a real job, and its FLOPs."""
    started = time.perf_counter()
    spec = optimizer_spec(setup, model)
    with fake_job(job, setup, profile, model) as model:
        optimizer = None if adjustment and adjustment.flat_numel else build_optimizer(setup, model, profile, spec)
        flops, ops, sequence, products, recomputed = warm_up(job, setup, model, optimizer,
                                                             on_cpu=profile.device == "cpu")
        # the step's allocations and frees, beside the ledger: for the allocator model, an adjustment, and
        # as a check of their own (read as the ledger reads a step, they give its peak)
        recorder = capture.Recorder(capture.alive_at_step(model, inner_optimizer(optimizer) if optimizer else None,
                                                          workspace=workspace_bytes(profile)))
        tracker = LedgerTracker(root=model)
        tracker.track_external(model, *([optimizer] if optimizer else []))
        forward = [lambda: fake.save_on_host(recorder)] if adjustment and adjustment.save_on_host else None
        # On a CPU the collated batch is the tensor the model reads, made before the step begins (outside
        # the real ledger); a GPU job copies it to the device inside the step.
        early = measured_batches(job, setup, model) if profile.device != "cuda" else None
        recorder.outside(early or [])
        walked = zero.hooks(model, recorder) if adjustment and adjustment.zero else contextlib.nullcontext()
        held = zero.held_until_step(model) if adjustment and adjustment.module_units else []
        with tracker, recorder, walked:
            batches = early or measured_batches(job, setup, model)
            training_step(model, optimizer, batches, setup, marks=zero.ReshardAfterBackward(recorder, held),
                          forward_contexts=forward)
        reading = {**ledger_reading(tracker, state_bytes(optimizer) if optimizer else 0),
                   "flops_per_step": flops * setup.accumulation_steps, "roofline_ops": ops,
                   "roofline_sequence": sequence, "roofline_products": products, "recomputed_ops": recomputed,
                   "modules": sum(1 for _ in model.modules()),  # what Trainer walks each micro-batch
                   "paged_in_bytes": capture.paged_in(recorder.events, len(batches)),
                   "optimizer": type(optimizer).__name__ if optimizer else spec[0].__name__,
                   "recorded_peak_bytes": capture.tensor_reading(recorder.events, recorder.categories)["peak_bytes"]}
    if adjustment is not None:
        reading.update(adjusted_reading(recorder, adjustment, profile, spec))  # with this GPU's scratch
        reading.update(flat_step_ops(reading, adjustment, spec, profile, model))
        reading.update(zip(("gpu", "workspace"), reading_key(profile)))
        if adjustment.save_on_host:  # what save_on_cpu copies to the host per micro-batch, and back in backward
            reading["offloaded_bytes_per_micro_batch"] = sum(
                e[2] for e in recorder.events if e[0] == "alloc" and recorder.categories.get(e[1]) == "host"
            ) // len(batches)
    elif profile.device == "cuda":
        # kept for the planner, which derives other micro-batches from them (planner/batch.py), and to read
        # the step on another GPU (for_gpu)
        reading.update(events=recorder.events, categories=recorder.categories, reductions=recorder.reductions,
                       cublas_keys=recorder.workspaces)
        reading.update(for_gpu(reading, profile))
    return {**reading, "seconds": round(time.perf_counter() - started, 2)}


# what a trace holds for one GPU only (for_gpu makes them per GPU): a trace without them is any GPU's
PER_GPU = ("allocator", "gpu", "workspace", "readings")


def reading_key(profile: HardwareConf) -> tuple:
    """What an allocator reading depends on besides the trace: the GPU's reduction split and its cuBLAS workspace."""
    return scratch.gpu_of(profile), workspace_bytes(profile)


def made_for(traced: dict[str, Any], profile: HardwareConf) -> bool:
    """Whether the trace's allocator reading is already the one for `profile`'s GPU (always, off CUDA)."""
    return profile.device != "cuda" or (traced.get("gpu"), traced.get("workspace")) == reading_key(profile)


def readable_on(traced: dict[str, Any], profile: HardwareConf) -> bool:
    """Whether `for_gpu` can read the trace on `profile`'s GPU: made for it, or a plain trace (events kept).
    An adjusted job's trace (ZeRO, offload) made for another GPU must be traced again."""
    return made_for(traced, profile) or "events" in traced


def for_gpu(traced: dict[str, Any], profile: HardwareConf) -> dict[str, Any]:
    """The trace's allocator reading on `profile`'s GPU: its reductions' scratch (scratch.py) and the cuBLAS
    workspaces sized for that GPU, read once per GPU (kept in the trace's `readings`). One plain trace
    serves GPUs of the same device this way."""
    if made_for(traced, profile):
        return traced
    gpu, workspace = reading_key(profile)
    readings = traced.setdefault("readings", {})
    if (gpu, workspace) not in readings:
        cublas = set(traced["cublas_keys"])
        events = [("alloc", e[1], workspace) if e[0] == "alloc" and e[1] in cublas else e
                  for e in scratch.sized(traced["events"], traced.get("reductions", {}), gpu)]
        readings[(gpu, workspace)] = capture.allocator_reading(events, traced["categories"])
    return {**traced, "allocator": readings[(gpu, workspace)], "gpu": gpu, "workspace": workspace}


def warm_up(job: Config, setup, model, optimizer, on_cpu: bool = False) -> tuple[int, list, list, list, int]:
    """The real ledger's step 1: one micro-batch and an optimizer step, which leaves the optimizer state
    behind. Its ops are recorded here (op_record.py): one micro-batch's forward and backward (and how many of the
    backward's ops recompute the forward: activation checkpointing), and the optimizer step; their FLOPs are the
    micro-batch's (torch.utils.flop_counter's formulas, op by op, as FlopCounterMode sums them). The measured
    step runs under the ledger and the recorder only: a counting mode there can keep what it sees alive
    (FlopCounterMode keeps checkpointing's recomputed activations: a false peak)."""
    batch = fake_batch(model, setup.micro_batch_size, job.max_seq_len, setup.task)
    with op_record.recording(on_cpu) as ops:
        training_step(model, optimizer, [batch], setup, marks=ops)
    record = op_record.reading(ops)
    return op_record.micro_batch_flops(record), record, ops.sequence, products.reading(ops), ops.recomputed


def measured_batches(job: Config, setup, model) -> list:
    """The measured step's micro-batches. Those after the second repeat the second one exactly (all
    gradients alive, the same activations), so two stand for any number."""
    return [fake_batch(model, setup.micro_batch_size, job.max_seq_len, setup.task)
            for _ in range(min(setup.accumulation_steps, 2))]


def flat_step_ops(reading: dict, adjustment: adjust.Adjustment, spec, profile: HardwareConf, model) -> dict:
    """ZeRO's optimizer step on the process's flat partition (step.flat_partition_ops) added to the step's ops:
    the nearest job is traced without an optimizer. Its gradients and weights are the traced model's dtype
    (the one DeepSpeed trains in)."""
    if not adjustment.flat_numel:
        return {}
    dtype = next((p.dtype for p in model.parameters() if p.requires_grad), torch.float32)
    ops, sequence = flat_partition_ops(spec, adjustment.flat_numel, profile, dtype)
    return {"roofline_ops": reading["roofline_ops"] + ops,
            "roofline_sequence": list(reading["roofline_sequence"]) + sequence}


def adjusted_reading(recorder, adjustment: adjust.Adjustment, profile: HardwareConf, spec) -> dict[str, Any]:
    """The nearest job's recorded step with the adjustment's arithmetic, read as the ledger reads a step
    (and, on a GPU profile, through the allocator model), in place of the nearest job's own ledger: rank
    0's, and for a job of several processes each rank's in `per_rank`. Ranks differ where ZeRO-2's walk
    gives each its own partition (zero.py); ZeRO-3 pads every parameter's partition to 1/N on each rank
    (partition_parameters.py, _partition_param), so there every rank holds what rank 0 does."""
    flat = flat_partition_step(spec, adjustment.flat_numel, profile) if adjustment.flat_numel else None
    readings, sized = [], scratch.sized(recorder.events, recorder.reductions, scratch.gpu_of(profile))
    for rank in range(adjustment.zero.world if adjustment.zero else 1):
        events, categories = adjust.apply(sized, recorder.categories, adjustment, flat, rank)
        reading = {**capture.tensor_reading(events, categories), "adjustment": adjustment.reason,
                   "optimizer_on_host": "optimizer" in adjustment.host}
        if profile.device == "cuda":
            reading["allocator"] = capture.allocator_reading(events, categories)
        readings.append(reading)
    if adjustment.ranks > 1:
        readings[0]["per_rank"] = [
            {"rank": n, **{k: r[k] for k in ("peak_bytes", "breakdown", "allocator") if k in r}}
            for n, r in enumerate(readings[min(n, len(readings) - 1)] for n in range(adjustment.ranks))]
    return readings[0]
