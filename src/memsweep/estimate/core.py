"""A job's estimate: both estimators on one hardware profile, the trace the answer where it runs, the
closed form where it cannot (and as a cross-check everywhere else); the profile's CUDA context, the
fit against its capacity, FLOPs and a lower bound on step time at its peak TFLOP/s."""
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Optional

from ..config import rules
from ..config.schema import Config, HardwareConf
from ..measure import shapes
from ..run import results
from ..run.plan import build_plan
from ..sweep.sweepdir import ESTIMATE_FILE
from ..techniques import precision
from ..techniques.optim import traits as optim_traits
from .activations import NoClosedForm
from .arch import meta_model, model_config
from .closed_form import closed_form
from .inventory import inventory
from .table import summary_line
from .trace import Untraceable, count_flops, optimizer_spec, trace

GIB = 2**30


def capacity_bytes(profile: HardwareConf) -> Optional[int]:
    if profile.memory_gib is not None:
        return int(profile.memory_gib * GIB)
    if profile.device == "cpu":  # the host's memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def device_key(job: Config, profile: HardwareConf) -> str:
    """A job as its trace and FLOP count see it: the trace reads only the profile's device (its kernels,
    the allocator model, foreach optimizers); capacity, CUDA context, rates and rules are applied after."""
    return repr((dataclasses.replace(job, hardware=HardwareConf()), profile.device))


def _once(memo: Optional[dict], key: tuple, compute):
    """compute(), or its earlier result for the same key when the caller keeps a memo."""
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def _trace_or_reason(job: Config, profile: HardwareConf, plan, model) -> tuple[Optional[dict], Optional[str]]:
    try:
        return trace(job, profile, plan, model), None
    except Untraceable as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - the closed form still answers; say why
        return None, f"the trace failed: {type(exc).__name__}: {str(exc)[:300]}"


def estimate_job(job: Config, profile: HardwareConf, trace_enabled: bool = True,
                 memo: Optional[dict] = None) -> dict[str, Any]:
    """Both estimators for one job on one hardware profile; the trace is the answer where it runs.
    `memo` (a dict the caller keeps): the same job on several profiles of one device is traced once."""
    started = time.perf_counter()
    plan = build_plan(job, profile)
    config, source = model_config(job)
    model = meta_model(job, plan, config)
    inv = inventory(model, job, plan.structure)
    _, optim_kwargs, _ = optimizer_spec(plan, model)
    closed, closed_reason = None, None
    try:
        closed = closed_form(inv, config, job, plan, profile, optim_kwargs)
    except NoClosedForm as exc:
        closed_reason = str(exc)
    key = device_key(job, profile) if memo is not None else None
    if trace_enabled:
        def traced_step():
            # the trace runs bitsandbytes' own layers: a model of its own where the plan quantizes
            quantized = "quantization_config" in plan.load_kwargs
            traced_model = meta_model(job, plan, config, quantized=True) if quantized else model
            return _trace_or_reason(job, profile, plan, traced_model)

        traced, reason = _once(memo, ("trace", key), traced_step)
    else:
        traced, reason = None, "trace disabled"
    chosen = traced or closed
    if chosen is None:
        raise NoClosedForm(f"{reason}; and {closed_reason}")
    flops, flops_source = chosen["flops_per_step"], "FlopCounterMode"
    if traced is None:
        try:
            flops = _once(memo, ("flops", key), lambda: count_flops(job, profile, plan, meta_model(job, plan, config)))
        except Exception:  # noqa: BLE001 - fall back to the matmul count of the closed form
            flops_source = "closed_form"

    overhead = int(profile.cuda_context_gib * GIB) if profile.device == "cuda" else 0
    device = device_counters(chosen, traced, overhead) if profile.device == "cuda" else {}
    total = device["device_used_bytes"] if device else chosen["peak_bytes"]
    capacity = capacity_bytes(profile)
    key = precision.traits(job.precision.name).compute
    tflops = profile.tflops.get(key) or (profile.tflops.get("fp32") if key == "tf32" else None)
    trainable = sum(t.numel for t in inv.params if t.trainable)
    breakdown = dict(chosen["breakdown"])
    breakdown["overhead"] = overhead
    estimate = {
        "method": "trace" if traced else "closed_form",
        "method_reason": reason,
        "hardware": profile.name,
        "device": profile.device,
        "micro_batch_size": plan.micro_batch_size,
        "accumulation_steps": plan.accumulation_steps,
        "seq_len": job.max_seq_len,
        "peak_bytes": chosen["peak_bytes"],  # tensor bytes at the peak, as results.json memory.peak_bytes
        "overhead_bytes": overhead,  # the profile's CUDA context
        **device,  # a GPU's three counters: peak allocated, peak reserved, device used
        "total_bytes": total,  # what must fit the capacity: device used on a GPU, the peak on a CPU
        "breakdown": breakdown,
        "activations_bytes": chosen["activations_bytes"],
        "grads_bytes": chosen["grads_bytes"],
        "optimizer_bytes": chosen["optimizer_bytes"],
        "capacity_bytes": capacity,
        "fits": None if capacity is None else total <= capacity,
        "margin_bytes": None if capacity is None else capacity - total,
        "flops_per_step": flops,
        "flops_source": flops_source,
        "compute_dtype": key,
        "peak_tflops": tflops,
        # FLOPs at the profile's peak matmul rate: a lower bound on the time of a step
        "step_time_s": flops / (tflops * 1e12) if tflops else None,
        "trace": traced,
        "closed_form": None if closed is None else {k: v for k, v in closed.items() if k != "activations_per_layer"},
        "closed_form_reason": closed_reason,
        "closed_form_vs_trace_pct": (None if traced is None or closed is None else
                                     round(100 * (closed["peak_bytes"] - traced["peak_bytes"]) / traced["peak_bytes"], 2)),
        "total_params": sum(t.numel for t in inv.params),
        "trainable_params": trainable,
        "architecture_source": source,
        "notes": (closed["notes"] if closed else []) + notes_for(job, plan, profile),
        "shape_advice": shapes.audit(profile, plan.micro_batch_size, config.vocab_size, job.data.pad_to_multiple_of),
        "seconds": round(time.perf_counter() - started, 2),
    }
    return estimate


def device_counters(chosen: dict[str, Any], traced: Optional[dict[str, Any]], context: int) -> dict[str, Any]:
    """The three figures a GPU shows for the step, each predicted as that counter is made:
    peak allocated (torch.cuda.max_memory_allocated: whole allocator blocks), peak reserved
    (max_memory_reserved: the caching allocator's segments, replayed in allocator.py) and device used
    (nvidia-smi: reserved plus the CUDA context). The closed form has no allocation sequence to replay:
    there reserved is not predicted and used counts the tensor bytes."""
    allocator = (traced or {}).get("allocator")
    allocated = allocator["peak_allocated_bytes"] if allocator else chosen["peak_bytes"]
    reserved = allocator["peak_reserved_bytes"] if allocator else None
    return {"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved,
            "device_used_bytes": (reserved or allocated) + context}


def notes_for(job: Config, plan, profile: HardwareConf) -> list[str]:
    notes = []
    t = plan.techniques
    if t.compile.on:
        notes.append("compile=on is estimated as eager execution")
    if plan.nproc > 1 and not plan.process_group:  # plain DDP
        notes.append("per process; DDP's gradient buckets are not included")
    if t.fsdp.on and not t.fsdp.offload:
        notes.append(f"FSDP: rank 0 of {plan.nproc} traced among fake ranks, wrapped as Accelerate wraps the job; "
                     "checked against real CPU ranks where the peak is in forward or backward. Not matched: at the "
                     "optimizer step a real rank still held a gradient of the largest unit in full, and with "
                     "accumulation the trace holds more than a real rank did")
    if profile.device == "cuda" and t.optim.paged:
        notes.append("paged optimizer state counted as device memory: bitsandbytes keeps it in unified memory, "
                     "outside PyTorch's allocator, on the GPU until the GPU runs short")
    if profile.device == "cuda":
        notes.append("CUDA: traced with the GPU's dropout and memory-efficient SDPA kernels on the CPU; reserved "
                     "replays the step's allocations through a model of the caching allocator; device used adds "
                     "the profile's CUDA context (cuBLAS/cuDNN workspaces are not included)")
    return notes


def for_job(job: Config, profile: HardwareConf) -> dict[str, Any]:
    """The estimate stored with a real job's results (res["estimate"]). Never raises: a job must
    not fail because its estimate did; the error is recorded instead."""
    try:
        return estimate_job(job, profile)
    except Exception as exc:  # noqa: BLE001
        return {"method": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}", "peak_bytes": None}


def run_estimate(job: Config, profile: HardwareConf, job_dir: Path, memo: Optional[dict] = None) -> dict[str, Any]:
    """mode=estimate for one job: check the rules (all but no-gpu: an estimate needs no GPU), estimate,
    write estimate.json, print a summary line. Raises Unsupported as rules.check does."""
    rules.check(job, profile, skip=("no-gpu",))
    est = estimate_job(job, profile, memo=memo)
    results.write(Path(job_dir) / ESTIMATE_FILE, est)  # atomic, as results.json
    print(summary_line(est), flush=True)
    return est
