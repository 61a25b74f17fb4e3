"""A job's estimate, as a recipe: setup -> model -> trace (or the nearest job's trace, adjusted) -> device
counters -> fit. The profile's CUDA context, the fit against its capacity, FLOPs and the predicted step
time (roofline.py)."""
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from ..config.schema import Config, HardwareConf
from ..measure import host_memory, shapes
from ..run import results, task
from ..run.setup import build_setup
from ..techniques import quantize, rules
from . import ESTIMATE_FILE, adjust, roofline, run_replay
from .meta import model_config, traced_model
from .result import Estimate, RunReserved
from .table import summary_line
from .trace import readable_on, trace
from .traced import AllocatorReading, Trace

GIB = 2**30
# what a trace keeps for the planner (planner/batch.py) and the step time, not for estimate.json (Trace.to_dict)
BULKY = ("total_params", "trainable_params", "roofline_ops", "roofline_sequence", "roofline_products", "events",
         "categories", "reductions", "cublas_keys", "gpu", "workspace", "readings", "derived_from")


def capacity_bytes(profile: HardwareConf) -> int | None:
    if profile.memory_gib is not None:
        return int(profile.memory_gib * GIB)
    if profile.device == "cpu":  # the host's memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def device_key(job: Config, profile: HardwareConf) -> str:
    """A job as its trace sees it: the trace reads only the profile's device (its kernels, the allocator
    model, foreach optimizers); capacity, CUDA context, rates and rules are applied after, and so is what
    depends on the GPU model (its kernels' scratch and cuBLAS workspace: trace.for_gpu), and the allocator's
    settings (expandable segments: run_replay.device_reading)."""
    return repr((dataclasses.replace(job, hardware=HardwareConf(), expandable_segments=False), profile.device))


def estimate_job(job: Config, profile: HardwareConf, memo: dict | None = None, over_run: bool = True) -> Estimate:
    """The estimate of one job on one hardware profile. `memo` (a dict the caller keeps): the same job on
    several profiles of one device is traced once. `over_run`: replay a GPU job's steps of varying length
    (run_replay.py, a second or two on a 7B decoder); False leaves it out (the one-step figures only)."""
    started = time.perf_counter()
    setup = build_setup(job, profile)
    key = device_key(job, profile)
    traced = None if memo is None else memo.get(key)
    if traced is None or not readable_on(traced, profile):  # an adjusted trace is made per GPU
        traced = traced_step(job, profile, setup)
        if memo is not None:
            memo[key] = traced
    return assemble(job, profile, setup, traced, started, over_run=over_run)


def traced_step(job: Config, profile: HardwareConf, setup) -> Trace:
    """The trace of the job, or of its nearest traceable job with the adjustment's arithmetic (adjust.py);
    with the model's parameter counts."""
    adjustment = adjust.adjustment_for(job, setup)
    traced_job, traced_setup = (job, setup)
    if adjustment is not None:
        traced_job, traced_setup = adjustment.nearest, build_setup(adjustment.nearest, profile)
    model = traced_model(traced_job, traced_setup)
    if adjustment is not None and adjustment.module_units:
        # ZeRO-3 gathers each module's own parameters before it runs and releases them after (stage3.py's
        # PartitionedParameterCoordinator, per submodule): an FSDP unit of every module that holds some
        traced_setup.args["fsdp_config"]["transformer_layer_cls_to_wrap"] = sorted(
            {type(m).__name__ for m in model.modules() if next(m.parameters(recurse=False), None) is not None})
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if adjustment is not None:  # its buffers are sized by the job's own setup: processes, stage, precision
        adjustment = adjust.sized(adjustment, setup, model)
    traced = trace(traced_job, profile, traced_setup, model, adjustment)
    quantized = quantize.audit(model, traced_setup.structure.layers) if setup.techniques.lora.quantize else None
    return dataclasses.replace(traced, total_params=total, trainable_params=trainable, quantization=quantized)


def assemble(job: Config, profile: HardwareConf, setup, traced: Trace, started: float,
             over_run: bool = True) -> Estimate:
    """The estimate from the traced step: the counters of the profile's device, the fit, time and notes
    (`over_run`: as estimate_job's)."""
    overhead = int(profile.cuda_context_gib * GIB) if profile.device == "cuda" else 0
    reading = run_replay.device_reading(job, setup, traced, profile, over_run) if profile.device == "cuda" else None
    over = reading.over_run if reading else None
    device = device_counters(reading.allocator, overhead, over, traced.paged_state_bytes) if reading else {}
    # the safe side of what packing and a run of varying lengths may do: fits, the margin and autofit must not lean low
    total = device["device_used_upper_bytes"] if device else traced.peak_bytes
    capacity = capacity_bytes(profile)
    key = setup.techniques.precision.compute
    tflops = profile.tflops.get(key) or (profile.tflops.get("fp32") if key == "tf32" else None)
    config, source = model_config(job)
    adjusted = traced.adjustment
    # pages come anew only where freed host memory goes back to the OS: not under the job's malloc_reuse
    timing = roofline.step_time(traced, setup, profile, pages_anew=not (job.malloc_reuse or host_memory.in_effect()),
                                model_type=config.model_type, distributed=job.distributed)
    # an image counts no tokens (max_seq_len does not apply to it)
    tokens = None if task.images(job.task) else setup.micro_batch_size * setup.accumulation_steps * job.max_seq_len
    return Estimate(
        method="adjusted trace" if adjusted else "trace", method_reason=adjusted, hardware=profile.name,
        device=profile.device, micro_batch_size=setup.micro_batch_size, accumulation_steps=setup.accumulation_steps,
        seq_len=job.max_seq_len, peak_bytes=traced.peak_bytes, overhead_bytes=overhead, total_bytes=total,
        breakdown={**traced.breakdown, "overhead": overhead}, activations_bytes=traced.activations_bytes,
        grads_bytes=traced.grads_bytes, optimizer_bytes=traced.optimizer_bytes, capacity_bytes=capacity,
        fits=None if capacity is None else total <= capacity,
        margin_bytes=None if capacity is None else capacity - total,
        flops_per_step=traced.flops_per_step, flops_source="torch.utils.flop_counter, per op", compute_dtype=key,
        peak_tflops=tflops,
        step_time_s=traced.flops_per_step / (tflops * 1e12) if tflops else None,
        predicted_step_s=timing.step_s, tokens_per_s=tokens / timing.step_s if tokens and timing.step_s else None,
        step_time=timing,
        trace=traced.to_dict(left_out=BULKY),
        total_params=traced.total_params, trainable_params=traced.trainable_params, architecture_source=source,
        notes=notes_for(setup, profile, adjusted) + history_note(job, profile, over) + run_replay.advice(over),
        per_rank=None if traced.per_rank is None else [r.to_dict() for r in traced.per_rank],
        shape_advice=shapes.audit(profile, setup.micro_batch_size, getattr(config, "vocab_size", None),
                                 job.data.pad_to_multiple_of, images=task.images(job.task)),
        over_run=over, seconds=round(time.perf_counter() - started, 2), **device)


def device_counters(allocator: AllocatorReading, context: int, over: RunReserved | None = None,
                    paged: int = 0) -> dict[str, Any]:
    """The three figures a GPU shows for the step, each predicted as that counter is made: peak allocated
    (torch.cuda.max_memory_allocated: whole allocator blocks), peak reserved (max_memory_reserved: the
    caching allocator's segments, replayed in allocator.py) and device used (nvidia-smi: reserved plus
    the CUDA context and `paged`, bitsandbytes' paged optimizer state in unified memory outside the
    allocator); and reserved and device used on the safe side of packing (capture.packing_envelope:
    never below the point figures) and of a run of varying lengths (`over`: run_replay.py, under the
    allocator the job runs with)."""
    upper = max(allocator.reserved_upper_bytes, allocator.peak_reserved_bytes, over.job_reserved_bytes if over else 0)
    return {"peak_allocated_bytes": allocator.peak_allocated_bytes,
            "peak_reserved_bytes": allocator.peak_reserved_bytes,
            "device_used_bytes": allocator.peak_reserved_bytes + context + paged,
            "reserved_upper_bytes": upper, "device_used_upper_bytes": upper + context + paged}


def notes_for(setup, profile: HardwareConf, adjusted: str | None) -> list[str]:
    t, notes = setup.techniques, [f"adjusted trace: {adjusted}"] if adjusted else []
    if t.compile.on:
        notes.append("compile=on is estimated as eager execution")
    if setup.world_size > 1 and not setup.process_group:  # plain DDP
        notes.append("per process; DDP's gradient buckets are not included")
    if t.fsdp.on and not t.fsdp.offload:
        notes.append(f"FSDP: rank 0 of {setup.world_size} traced among fake ranks, wrapped as Accelerate wraps the "
                     "job; checked against real CPU ranks where the peak is in forward or backward. Not matched: at "
                     "the optimizer step a real rank still held a gradient of the largest unit in full, and with "
                     "accumulation the trace holds more than a real rank did")
    if profile.device == "cuda" and t.optim.paged:
        notes.append("paged optimizer state: bitsandbytes keeps the state of each parameter of 100,000 elements "
                     "or more in unified memory, outside PyTorch's allocator (not in peak allocated or reserved), "
                     "on the GPU until the GPU runs short (counted in device used and in fits)")
    if profile.device == "cuda" and t.lora.quantize == "int8":
        notes.append("LLM.int8 traced through MatMul8bitLt without outlier columns: each layer's outlier input "
                     "columns (found in the values) are not counted")
    if profile.device == "cuda":
        notes.append("CUDA: traced with the GPU's dropout and memory-efficient SDPA kernels on the CPU; reserved "
                     "replays the step's allocations through a model of the caching allocator; device used adds "
                     "the profile's CUDA context (cuDNN's workspaces are not included); total, fits and the margin "
                     "use the upper figure for reserved, the most the step reserves with its activations scaled "
                     "down (packing: a smaller step can reserve more)")
    return notes


def history_note(job: Config, profile: HardwareConf, over: RunReserved | None) -> list[str]:
    """What reserved stands for over a run whose batches are padded each to its longest example: blocks cached
    for a shorter step's sizes can stay reserved beside the longest step's. Replayed over the run's steps where
    the trace keeps its events (run_replay.py); else what the upper figure does not cover (benchmarks/GPU.md: on
    an H200 the runs' reserved bytes came 1.6-5.7 % above it, and within it once every batch was padded to
    max_seq_len)."""
    if profile.device != "cuda" or not run_replay.varying_lengths(job):
        return []
    if over is not None:
        source = {"data": "the job's data in its sampler's order",
                  "spread": "lengths 1 to max_seq_len equally likely (the data is not readable offline)"}
        return [f"reserved upper: for steps at max_seq_len; over the run, {over.steps} steps of {over.shortest}-"
                f"{over.longest} tokens ({source[over.lengths]}) replayed through the allocator model reserve "
                f"{over.reserved_bytes / GIB:.2f} GiB, {over.reserved_expandable_bytes / GIB:.2f} GiB with expandable "
                f"segments; the upper figure (total, fits, the margin) takes the run's under the allocator the "
                f"job runs with where it is larger"]
    return ["reserved upper: for steps at max_seq_len; the run's shorter batches (each padded to its longest) can "
            "leave more cached, measured up to 6 % above it; data.pad_to_multiple_of=max_seq_len makes every step "
            "the traced one"]


def estimate_beside_training(job: Config, profile: HardwareConf) -> dict[str, Any]:
    """The estimate stored with a real job's results (res["estimate"]). Never raises: a job must
    not fail because its estimate did; the error is recorded instead."""
    try:
        return estimate_job(job, profile).to_dict()
    except Exception as exc:  # noqa: BLE001
        return {"method": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}", "peak_bytes": None}


def at_data_length(job: Config, profile: HardwareConf, seq_len: int) -> dict[str, Any] | None:
    """The predicted step time where the job's batches are padded to `seq_len` (its data's typical padded
    length, run/lengths.typical_padded_length) instead of max_seq_len: the step the run mostly takes, where
    the estimate's own step is the longest it can take. None where nothing shorter is to predict, or where
    the estimate fails (a job must not fail because of it)."""
    if seq_len >= job.max_seq_len:
        return None
    try:
        est = estimate_job(dataclasses.replace(job, max_seq_len=seq_len), profile, over_run=False)  # its time only
    except Exception:  # noqa: BLE001
        return None
    return {"seq_len": seq_len, "step_s": est.predicted_step_s, "basis": "the data's typical padded length"}


def typical_step(job: Config, profile: HardwareConf) -> dict | None:
    """Before the job is built, the predicted step time where the batches are padded to the data's typical length
    (the estimate's own step is padded to max_seq_len, the longest a step can be): what the measured median is.
    None for images (every step the same). The tokenised data is kept for the job (data.load's cache)."""
    from ..measure.steptime import WARMUP_STEPS
    from ..run import lengths as run_lengths
    from ..run.train_loop import first_step_after_warmup, load_data, optimizer_steps

    if task.images(job.task):
        return None
    try:
        setup, (_, data) = build_setup(job, profile), load_data(job)
    except Exception as exc:  # noqa: BLE001 - building the job says what is wrong with its data, in its own words
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    lengths = [len(ids) for ids in data.train["input_ids"]]
    steps = optimizer_steps(len(lengths), setup.micro_batch_size, setup.accumulation_steps, setup.world_size,
                            job.epochs, job.max_steps)
    ledger = {first_step_after_warmup(job, steps)} if job.measure.ledger else set()
    typical = run_lengths.typical_padded_length(lengths, setup.micro_batch_size, setup.accumulation_steps,
                                             job.data.pad_to_multiple_of, setup.group_by_length, job.seed,
                                             steps=steps, left_out=frozenset(range(1, WARMUP_STEPS + 1)) | ledger)
    return at_data_length(job, profile, typical)


def run_estimate(job: Config, profile: HardwareConf, job_dir: Path, memo: dict | None = None) -> dict[str, Any]:
    """mode=estimate for one job: check the rules (all but no-gpu: an estimate needs no GPU), estimate,
    write estimate.json, print a summary line. Raises Unsupported as rules.refuse_unsupported does."""
    rules.refuse_unsupported(job, profile, skip=("no-gpu",))
    est = estimate_job(job, profile, memo=memo).to_dict()
    results.write(Path(job_dir) / ESTIMATE_FILE, est)  # atomic, as results.json
    print(summary_line(est, images=task.images(job.task)), flush=True)
    return est
