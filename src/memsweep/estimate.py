"""Predict a job's peak memory, FLOPs and step time without training it (mode=estimate, issue #5).

Two estimators, both reported:
- trace (the default where it runs): a warm-up and a measured training step of the job's real
  composed model — the same Plan, model class, technique transforms and optimizer class as a real
  job — on fake tensors (torch's FakeTensorMode: shapes and dtypes, no storage), measured by the
  same LedgerTracker (torch's MemTracker) as real jobs. No weights, no data, no GPU; on the CPU it
  reproduces the measured ledger.
- closed_form (estimate_formula.py): bytes per parameter and per activation from the architecture,
  used where the trace cannot run (bitsandbytes optimizers and quantized weights, DeepSpeed, FSDP,
  activation offload) and as a cross-check everywhere else.

FLOPs come from torch's FlopCounterMode on the traced step; time per step is FLOPs over the
profile's peak TFLOP/s for the compute dtype (a lower bound: real kernels run below peak).

`python -m memsweep.estimate [-m] <overrides>` estimates a job or a sweep grid offline and writes
estimate.json per job and estimate.md for the sweep.
"""
import contextlib
import dataclasses
import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from . import estimate_formula as formula
from . import rules, shapes
from .errors import ConfigError, Unsupported
from .schema import Config, HardwareConf, ModelConf, ModelSource, PrecisionName

ESTIMATE_FILE = "estimate.json"
SWEEP_TABLE = "estimate.md"
GIB = 2**30


class Untraceable(Exception):
    """The trace cannot run this job; the message is the reason given with `method: closed_form`."""


# --- the model, from its architecture alone ------------------------------------------------------

def num_labels(job: Config) -> int:
    # The real job counts the labels in its data; without the data, the config's label list (or a
    # binary task). The head is 2 x hidden values per label: negligible either way.
    return len(job.data.labels) if job.data.labels else 2


def model_config(cfg: ModelConf, labels: int):
    """(transformers config, where it came from). The real config.json where it is on disk (embedded
    model, local folder, Hugging Face cache); else the architecture keys of the model config."""
    from transformers import AutoConfig

    from .model import dropout_kwargs, embedded_minilm_path, tiny_config

    if cfg.source == ModelSource.tiny:
        return tiny_config(cfg, labels), "model config keys"
    folder = (cfg.path or embedded_minilm_path()) if cfg.source == ModelSource.embedded else cfg.path
    if folder:
        try:
            config = AutoConfig.from_pretrained(folder, num_labels=labels, local_files_only=True, **dropout_kwargs(cfg))
            return config, f"config.json of {folder}"
        except (OSError, ValueError):
            pass  # not on disk: size it from the keys
    return architecture_config(cfg, labels), "model config keys"


def architecture_config(cfg: ModelConf, labels: int):
    from transformers import DistilBertConfig

    from .model import dropout_kwargs, tiny_config

    if cfg.architecture == "bert":
        return tiny_config(cfg, labels)
    if cfg.architecture == "distilbert":
        return DistilBertConfig(vocab_size=cfg.vocab_size, dim=cfg.hidden_size, n_layers=cfg.num_layers,
                                n_heads=cfg.num_heads, hidden_dim=cfg.intermediate_size,
                                max_position_embeddings=cfg.max_position_embeddings, num_labels=labels,
                                **dropout_kwargs(cfg))
    raise ConfigError("model.architecture", f"{cfg.architecture!r}: the estimator can size bert and distilbert "
                                            "from their keys; for others give model.path a folder with config.json")


# --- the trace ------------------------------------------------------------------------------------

def untraceable_reason(job: Config, plan) -> Optional[str]:
    if job.lora.enabled and job.lora.quantize.value != "none":
        return "bitsandbytes-quantized weights (lora.quantize) cannot be built on fake tensors"
    if "bnb" in job.optim.hf_name.value or "8bit" in job.optim.hf_name.value:
        return "bitsandbytes optimizers read values in their step (fails on fake tensors)"
    if job.deepspeed.stage is not None:
        return "DeepSpeed's engine partitions and casts the model itself; it cannot run on fake tensors"
    if job.fsdp.strategy is not None:
        return "FSDP shards across processes; not traced"
    if job.offload.activations:
        return "save_on_cpu copies to pinned host memory, which a CPU-only torch cannot fake"
    return None


def accelerate_dtype(plan) -> Optional[torch.dtype]:
    """The autocast dtype Accelerate applies for the bf16/fp16 TrainingArguments (wrapping model.forward)."""
    return torch.bfloat16 if plan.args.get("bf16") else torch.float16 if plan.args.get("fp16") else None


def autocast_like_accelerate(model, dtype: torch.dtype):
    """Wrap model.forward in autocast as Accelerate.prepare_model does (inside the module's hooks, so
    the weight casts it caches are dropped before the forward hooks run, as on a real job)."""
    from types import MethodType

    from accelerate.utils import convert_outputs_to_fp32

    forward = torch.autocast("cpu", dtype=dtype)(model.forward.__func__)
    model.forward = MethodType(convert_outputs_to_fp32(forward), model)
    return model


@contextlib.contextmanager
def cuda_kernels():
    """For a CUDA profile: run the kernels a GPU would, where they differ from the CPU's in memory.

    The trace runs on CPU fake tensors, so PyTorch would pick its CPU kernels: dropout keeping a
    float mask of the input's size (CUDA: a bool mask) and SDPA falling back to the math path when
    training with dropout (the full attention matrix; CUDA: the memory-efficient kernel keeps only
    its log-sum-exp). Both CUDA ops have shape functions, so they run on fake CPU tensors.
    """
    import torch.nn.functional as F

    dropout, sdpa = F.dropout, F.scaled_dot_product_attention

    def cuda_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return dropout(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]  # what at::dropout calls on CUDA

    def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if enable_gqa:
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:  # as ATen does before its CUDA kernels
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, float("-inf"))
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale)[0]

    F.dropout, F.scaled_dot_product_attention = cuda_dropout, cuda_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa


def meta_model(job: Config, plan, config):
    """The job's model class built from its config on the meta device (no memory, no weights, no
    init), with the plan's transforms: freezing, LoRA, checkpointing, bf16_true."""
    import transformers.initialization as hf_init
    from transformers import AutoModelForSequenceClassification

    kwargs = {k: plan.load_kwargs[k] for k in ("attn_implementation", "dtype") if k in plan.load_kwargs}
    with torch.device("meta"), hf_init.no_init_weights():
        return plan.transform(AutoModelForSequenceClassification.from_config(config, **kwargs))


def to_fake(model, fake_mode):
    """Swap every meta tensor of the model for a fake CPU tensor of the same shape, dtype and
    requires_grad; tied weights stay tied. (The transforms run on meta first because
    `Module.to(dtype)` cannot swap fake parameters.)"""
    converter, cpu, fakes, params = fake_mode.fake_tensor_converter, torch.device("cpu"), {}, {}

    def fake(t):
        if id(t) not in fakes:
            fakes[id(t)] = converter.from_meta_and_device(fake_mode, t.detach(), cpu)
        return fakes[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in params:
                    params[id(p)] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad)
                module._parameters[name] = params[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b)
    model.train()
    return model


def optimizer_spec(plan, model):
    """(optimizer class, its kwargs, the TrainingArguments) as Trainer would choose them."""
    from transformers import Trainer, TrainingArguments

    keys = ("optim", "optim_args", "learning_rate", "weight_decay")
    args = TrainingArguments(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none",
                             **{k: plan.args[k] for k in keys if k in plan.args})
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls, kwargs, args


def build_optimizer(plan, model, profile: HardwareConf):
    """The optimizer Trainer.create_optimizer would build: its class, kwargs and parameter groups."""
    from transformers import Trainer

    cls, kwargs, args = optimizer_spec(plan, model)
    decay = set(Trainer.get_decay_parameter_names(None, model))  # does not use `self`
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    # On a GPU torch's optimizers default to their foreach kernels, whose temporaries span a whole
    # parameter group (on the CPU: one tensor at a time). Ask for what the profile's device would do.
    if profile.device == "cuda" and "foreach" in inspect.signature(cls).parameters and "fused" not in kwargs:
        kwargs = {**kwargs, "foreach": True}
    return cls(groups, **kwargs)


def fake_batch(model, micro_batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """A collated batch of seq_len tokens, as the ledger step gets (values do not matter on fake tensors)."""
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "labels": torch.zeros(micro_batch, dtype=torch.long)}
    if getattr(model.config, "type_vocab_size", 0):  # BERT tokenizers return token types, DistilBERT's none
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def training_step(model, optimizer, batches, plan, max_grad_norm: float, accumulation: int,
                  around_micro_batches=contextlib.nullcontext) -> None:
    """What MemsweepTrainer does between on_step_begin and on_step_end for one optimizer step (its own
    fp16 autocast on the CPU wraps the whole call, see trainer.py; Accelerate's is in model.forward)."""
    dtype = plan.autocast_dtype
    with around_micro_batches():
        for batch in batches:
            with contextlib.ExitStack() as stack:
                if dtype is not None:
                    stack.enter_context(torch.autocast("cpu", dtype=dtype))
                for make_context in plan.forward_contexts:
                    stack.enter_context(make_context())
                loss = model(**batch).loss
            loss = loss / accumulation
            if plan.grad_scaler or plan.args.get("fp16"):
                loss = loss * 65536.0  # GradScaler's scaling (its bookkeeping tensors are a few bytes)
            loss.backward()
    if optimizer is None:
        return
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    model.zero_grad()


def state_bytes(optimizer) -> int:
    """Bytes of optimizer state (measure.optimizer_state_bytes dedupes by data pointer, which is 0 for
    every fake tensor; torch and transformers optimizers never share state storage)."""
    from .measure import inner_optimizer

    return sum(v.untyped_storage().nbytes() for s in inner_optimizer(optimizer).state.values()
               for v in s.values() if torch.is_tensor(v))


def trace(job: Config, profile: HardwareConf, plan, model) -> dict[str, Any]:
    """The ledger of one training step of `model` (a meta model, see meta_model) on fake tensors,
    as LedgerCallback takes it on a real job, and its FLOPs. Raises Untraceable."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from .measure import CATEGORIES, LedgerTracker

    started = time.perf_counter()
    if (reason := untraceable_reason(job, plan)) is not None:
        raise Untraceable(reason)
    fake_mode = FakeTensorMode()
    model = to_fake(model, fake_mode)
    if (dtype := accelerate_dtype(plan)) is not None:
        model = autocast_like_accelerate(model, dtype)
    kernels = cuda_kernels() if profile.device == "cuda" else contextlib.nullcontext()
    mb, acc = plan.micro_batch_size, plan.accumulation_steps
    with torch.random.fork_rng(), fake_mode, kernels:
        optimizer = build_optimizer(plan, model, profile)
        # Warm-up, as the real ledger's step 1: one micro-batch and an optimizer step, which leaves the
        # optimizer state behind. Its FLOPs are counted here: FlopCounterMode must not run inside the
        # measured step (under checkpointing it keeps recomputed activations alive: a false peak).
        flops = FlopCounterMode(display=False)
        training_step(model, optimizer, [fake_batch(model, mb, job.max_seq_len)], plan, job.optim.max_grad_norm,
                      acc, lambda: flops)
        # The measured step. Micro-batches after the second repeat the second one exactly (all
        # gradients alive, the same activations), so two stand for any number.
        batches = [fake_batch(model, mb, job.max_seq_len) for _ in range(min(acc, 2))]
        tracker = LedgerTracker(root=model)
        tracker.track_external(model, optimizer)
        with tracker:
            training_step(model, optimizer, batches, plan, job.optim.max_grad_norm, acc)
        snaps = tracker.get_tracker_snapshot("peak")
        device = max(snaps, key=lambda d: snaps[d]["Total"])
        breakdown = {CATEGORIES[k]: v for k, v in snaps[device].items() if k in CATEGORIES}
        state = state_bytes(optimizer)
        # As the real ledger: what optimizer.step() allocates beyond its state is temporary.
        if breakdown.get("optimizer", 0) > state:
            breakdown["temp"] = breakdown.get("temp", 0) + breakdown["optimizer"] - state
            breakdown["optimizer"] = state
        return {
            "peak_bytes": snaps[device]["Total"],
            "breakdown": breakdown,
            "activations_bytes": tracker.saved_activations,
            "grads_bytes": tracker.category_max.get("Gradient", 0),
            "optimizer_bytes": state,
            "flops_per_step": flops.get_total_flops() * acc,
            "optimizer": type(optimizer).__name__,
            "seconds": round(time.perf_counter() - started, 2),
        }


def count_flops(job: Config, profile: HardwareConf, plan, model) -> int:
    """FLOPs of a training step's forward and backward (FlopCounterMode on fake tensors), for jobs
    whose memory cannot be traced: the model without quantization, DeepSpeed or offload."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    fake_mode = FakeTensorMode()
    model = to_fake(model, fake_mode)
    if (dtype := accelerate_dtype(plan)) is not None:
        model = autocast_like_accelerate(model, dtype)
    plan = dataclasses.replace(plan, forward_contexts=[])
    kernels = cuda_kernels() if profile.device == "cuda" else contextlib.nullcontext()
    with torch.random.fork_rng(), fake_mode, kernels:
        flops = FlopCounterMode(display=False)
        batch = fake_batch(model, plan.micro_batch_size, job.max_seq_len)
        training_step(model, None, [batch], plan, 0, 1, lambda: flops)
    return flops.get_total_flops() * plan.accumulation_steps


# --- the estimate of a job ------------------------------------------------------------------------

DTYPE_KEYS = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "bf16_true": "bf16"}


def capacity_bytes(profile: HardwareConf) -> Optional[int]:
    if profile.memory_gib is not None:
        return int(profile.memory_gib * GIB)
    if profile.device == "cpu":  # the host's memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def estimate_job(job: Config, profile: HardwareConf, trace_enabled: bool = True) -> dict[str, Any]:
    """Both estimators for one job on one hardware profile; the trace is the answer where it runs."""
    from .plan import Plan
    from .techniques import apply_all

    started = time.perf_counter()
    shapes.check_padding(job.max_seq_len, job.data.pad_to_multiple_of)
    plan = Plan(device=profile.device)
    apply_all(job, plan, job)
    config, source = model_config(job.model, num_labels(job))
    model = meta_model(job, plan, config)
    inv = formula.inventory(model, job)
    _, optim_kwargs, _ = optimizer_spec(plan, model)
    closed = formula.closed_form(inv, config, job, profile, plan.micro_batch_size, plan.accumulation_steps,
                                 optim_kwargs)
    traced, reason = None, None
    if trace_enabled:
        try:
            traced = trace(job, profile, plan, model)
        except Untraceable as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - the closed form still answers; say why
            reason = f"the trace failed: {type(exc).__name__}: {str(exc)[:300]}"
    else:
        reason = "trace disabled"
    chosen = traced or closed
    flops, flops_source = chosen["flops_per_step"], "FlopCounterMode"
    if traced is None:
        try:
            flops = count_flops(job, profile, plan, meta_model(job, plan, config))
        except Exception:  # noqa: BLE001 - fall back to the matmul count of the closed form
            flops_source = "closed_form"

    overhead = int(profile.cuda_context_gib * GIB) if profile.device == "cuda" else 0
    total = chosen["peak_bytes"] + overhead
    capacity = capacity_bytes(profile)
    key = DTYPE_KEYS[PrecisionName(job.precision.name).value]
    tflops = profile.tflops.get(key) or (profile.tflops.get("fp32") if key == "tf32" else None)
    trainable = sum(t.numel for t in inv.params if t.trainable)
    breakdown = dict(chosen["breakdown"])
    breakdown["overhead"] = overhead
    return {
        "method": "trace" if traced else "closed_form",
        "method_reason": reason,
        "hardware": profile.name,
        "device": profile.device,
        "micro_batch_size": plan.micro_batch_size,
        "accumulation_steps": plan.accumulation_steps,
        "seq_len": job.max_seq_len,
        "peak_bytes": chosen["peak_bytes"],  # the device peak, as results.json memory.peak_bytes
        "overhead_bytes": overhead,  # the profile's CUDA context
        "total_bytes": total,
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
        "closed_form": {k: v for k, v in closed.items() if k != "activations_per_layer"},
        "closed_form_vs_trace_pct": (None if traced is None else
                                     round(100 * (closed["peak_bytes"] - traced["peak_bytes"]) / traced["peak_bytes"], 2)),
        "total_params": sum(t.numel for t in inv.params),
        "trainable_params": trainable,
        "architecture_source": source,
        "notes": closed["notes"] + notes_for(job, profile),
        "shape_advice": shapes.audit(profile, plan.micro_batch_size, config.vocab_size, job.data.pad_to_multiple_of),
        "seconds": round(time.perf_counter() - started, 2),
    }


def notes_for(job: Config, profile: HardwareConf) -> list[str]:
    notes = []
    if job.compile.enabled:
        notes.append("compile=on is estimated as eager execution")
    if job.distributed.nproc > 1 and job.deepspeed.stage is None and job.fsdp.strategy is None:
        notes.append("per process; DDP's gradient buckets are not included")
    if profile.device == "cuda":
        notes.append("CUDA: traced with the GPU's dropout and memory-efficient SDPA kernels on the CPU; the "
                     "caching allocator's reserve above the allocated peak is not included")
    return notes


# --- what job.py, the sweep report and autofit call -------------------------------------------------

def check_rules(job: Config, profile: HardwareConf) -> None:
    """rules.check, except the one refusing a GPU profile on a machine without one: an estimate needs none."""
    for rule in rules.RULES:
        if rule.name != "no-gpu" and rule.refuses(job, profile):
            raise Unsupported(f"{rule.name}: {rule.reason}")


def for_job(job: Config, profile: HardwareConf) -> dict[str, Any]:
    """The estimate stored with a real job's results (res["estimate"]). Never raises: a job must
    not fail because its estimate did; the error is recorded instead."""
    try:
        return estimate_job(job, profile)
    except Exception as exc:  # noqa: BLE001
        return {"method": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}", "peak_bytes": None}


def run_estimate(cfg_or_job, profile: HardwareConf, job_dir: Path) -> dict[str, Any]:
    """mode=estimate for one job: check the rules (all but no-gpu), estimate, write estimate.json,
    print a summary line. Raises Unsupported as rules.check does."""
    from omegaconf import DictConfig, OmegaConf

    from . import distributed

    job = OmegaConf.to_object(cfg_or_job) if isinstance(cfg_or_job, DictConfig) else cfg_or_job
    check_rules(job, profile)
    try:
        est = estimate_job(job, profile)
    finally:  # DeepSpeed/FSDP made a one-process group (for TrainingArguments): none may outlive the job
        distributed.teardown()
    write_json(Path(job_dir) / ESTIMATE_FILE, est)
    print(summary_line(est), flush=True)
    return est


def autofit_budget(profile: HardwareConf, headroom: float) -> Optional[int]:
    """What autofit lets a job's estimated total reach: the profile's capacity less `headroom` (a fraction)."""
    capacity = capacity_bytes(profile)
    return None if capacity is None else int(capacity * (1 - headroom))


def autofit(job: Config, profile: HardwareConf, headroom: float = 0.0) -> tuple[int, int]:
    """The largest micro-batch whose estimated total fits the profile's capacity (less `headroom`, a
    fraction of it), with the accumulation steps that keep the effective batch_size.

    Micro-batches divide batch_size / nproc. Without accumulation no gradients are alive during the
    forward; with it they are (from the previous micro-batch), so the whole batch is tried first and
    the smaller micro-batches, whose memory grows with their size, by bisection.
    """
    capacity, budget = capacity_bytes(profile), autofit_budget(profile, headroom)
    per_process = job.batch_size // job.distributed.nproc
    if budget is None:
        return per_process, 1

    def fits(micro: int) -> bool:
        steps = per_process // micro
        trial = dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, steps=steps,
                                                                          name=f"x{steps}"))
        return estimate_job(trial, profile)["total_bytes"] <= budget

    if fits(per_process):
        return per_process, 1
    candidates = [m for m in range(1, per_process) if per_process % m == 0]
    if not candidates or not fits(candidates[0]):
        raise Unsupported(f"autofit: even micro-batch 1 does not fit {profile.name} "
                          f"({capacity / GIB:.2f} GiB, headroom {headroom:.0%})")
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # candidates[lo] fits
        mid = (lo + hi + 1) // 2
        if fits(candidates[mid]):
            lo = mid
        else:
            hi = mid - 1
    return candidates[lo], per_process // candidates[lo]


def autofit_job(job: Config, profile: HardwareConf) -> tuple[Config, dict[str, Any]]:
    """`autofit=true`: the job with the micro-batch autofit chose, and the record of the choice."""
    micro, steps = autofit(job, profile, headroom=job.autofit_headroom)
    fitted = dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, name=f"autofit_x{steps}",
                                                                       steps=steps))
    return fitted, {"micro_batch_size": micro, "accumulation_steps": steps, "batch_size": job.batch_size,
                    "requested_accumulation_steps": job.accumulation.steps, "headroom": job.autofit_headroom,
                    "budget_bytes": autofit_budget(profile, job.autofit_headroom)}


# --- files and tables ---------------------------------------------------------------------------------

def write_json(path: Path, data: dict[str, Any]) -> None:
    from . import results

    results.write(path, data)  # atomic, as results.json


def _gib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def summary_line(est: dict[str, Any]) -> str:
    fits = {True: "fits", False: "DOES NOT FIT", None: "capacity unknown"}[est["fits"]]
    time_s = "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f} ms/step at peak"
    return "\n".join([f"[memsweep] estimate ({est['method']}) on {est['hardware']}: {_gib(est['total_bytes'])} GiB of "
                      f"{_gib(est['capacity_bytes'])} GiB, {fits}; {est['flops_per_step'] / 1e12:.2f} TFLOP/step, "
                      f"{time_s}", *shapes.lines(est.get("shape_advice"))])


TABLE_PARTS = ("params", "grads", "optimizer", "activations", "temp", "overhead")


def sweep_table(rows: list[tuple[list[str], Optional[dict[str, Any]], Optional[str]]]) -> str:
    """Markdown table of a sweep's estimates: (overrides, estimate or None, status/reason if none)."""
    split = [dict(o.split("=", 1) for o in overrides if "=" in o) for overrides, _, _ in rows]
    keys = [k for k in dict.fromkeys(k for d in split for k in d) if len({d.get(k) for d in split}) > 1 or len(rows) == 1]
    head = ["#", *keys, "method", "total GiB", *[f"{p}" for p in TABLE_PARTS], "capacity GiB", "fits", "margin GiB",
            "closed form GiB", "closed vs trace", "TFLOP/step", "ms/step at peak"]
    advices = [est.get("shape_advice") for _, est, _ in rows if est is not None]
    if any(advices):  # a GPU profile with a tensor-core rule
        head.append("not a tensor-core multiple")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, ((overrides, est, status), values) in enumerate(zip(rows, split)):
        cells = [str(n), *[values.get(k, "") for k in keys]]
        if est is None:
            cells += [" ".join((status or "missing").split())] + [""] * (len(head) - len(cells) - 1)
        else:
            bd = est["breakdown"]
            other = bd.get("temp", 0) + bd.get("buffers", 0) + bd.get("other", 0)
            parts = {**bd, "temp": other}
            diff = est.get("closed_form_vs_trace_pct")
            cells += [est["method"], _gib(est["total_bytes"]), *[_gib(parts.get(p, 0)) for p in TABLE_PARTS],
                      _gib(est["capacity_bytes"]),
                      {True: "yes", False: "**no**", None: "?"}[est["fits"]], _gib(est["margin_bytes"]),
                      _gib(est["closed_form"]["peak_bytes"] + est["overhead_bytes"]),
                      "-" if diff is None else f"{diff:+.1f}%", f"{est['flops_per_step'] / 1e12:.2f}",
                      "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f}"]
            if any(advices):
                cells.append(shapes.cell(est.get("shape_advice")))
        lines.append("| " + " | ".join(cells) + " |")
    notes = sorted({f"{est['method']}: {est['method_reason']}" for _, est, _ in rows
                    if est is not None and est["method_reason"]}) + shapes.table_notes(advices)
    return "\n".join(lines + [""] + [f"- {note}" for note in notes]) + "\n"


def write_sweep_table(sweep_dir: Path) -> Path:
    """estimate.md of a sweep dir, from its jobs' estimate.json (or results.json with an estimate)."""
    from . import results

    sweep_dir = Path(sweep_dir)
    rows = []
    for job_dir in sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)):
        res = results.read(job_dir / results.RESULTS_FILE)
        est_file = job_dir / ESTIMATE_FILE
        est = json.loads(est_file.read_text()) if est_file.exists() else (res or {}).get("estimate")
        overrides = (res or {}).get("overrides") or _overrides_of(job_dir)
        outcome = res or (json.loads((job_dir / "status.json").read_text()) if (job_dir / "status.json").exists()
                          else None)  # status.json: a job the CLI could not estimate
        status = None if est else (f"{outcome['status']}: {outcome['reason']}" if outcome else "missing")
        rows.append((overrides, est if est and est.get("method") else None, status))
    path = sweep_dir / SWEEP_TABLE
    path.write_text(f"# Estimates: {sweep_dir}\n\n" + sweep_table(rows))
    return path


def _overrides_of(job_dir: Path) -> list[str]:
    overrides = job_dir / ".hydra" / "overrides.yaml"
    if overrides.exists():
        from omegaconf import OmegaConf

        return list(OmegaConf.load(overrides))
    note = job_dir / "overrides.json"
    return json.loads(note.read_text()) if note.exists() else []


# --- CLI ---------------------------------------------------------------------------------------------

def expand(overrides: list[str]) -> list[list[str]]:
    """A sweep's jobs from its overrides, by Hydra's own basic sweeper (`a=1,2 b=x,y`: 4 jobs)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def compose(overrides: list[str]) -> Config:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from .schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    return OmegaConf.to_object(cfg)


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    from . import hardware

    parser = argparse.ArgumentParser(prog="python -m memsweep.estimate",
                                     description="Estimate the peak memory, FLOPs and step time of a job or a "
                                                 "sweep grid offline (no training, no weights, no GPU).")
    parser.add_argument("-m", "--multirun", action="store_true", help="accepted for symmetry with train.py; "
                        "comma-separated values always make a grid")
    parser.add_argument("--out", type=Path, default=None, help="sweep dir (default outputs/estimate/<date>/<time>)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sizes come from config files and keys, never the hub
    out = args.out or Path("outputs/estimate") / time.strftime("%Y-%m-%d/%H-%M-%S")
    started = time.perf_counter()
    jobs = expand(args.overrides)
    failed = 0
    for n, overrides in enumerate(jobs):
        job_dir = out / str(n)
        job_dir.mkdir(parents=True, exist_ok=True)
        for stale in (ESTIMATE_FILE, "status.json"):  # from an earlier run into the same dir
            (job_dir / stale).unlink(missing_ok=True)
        (job_dir / "overrides.json").write_text(json.dumps(overrides))
        print(f"[memsweep] #{n} {' '.join(overrides)}", flush=True)
        try:
            job = compose(overrides)
            run_estimate(job, hardware.detect(job.hardware), job_dir)
        except Exception as exc:  # noqa: BLE001 - one job's bad input or error must not lose the sweep
            status = "unsupported" if isinstance(exc, Unsupported) else "failed"
            failed += status == "failed"
            (job_dir / "status.json").write_text(json.dumps({"status": status, "reason": str(exc)[:500]}))
            print(f"[memsweep] {status}: {exc}", flush=True)
    table = write_sweep_table(out)
    print("\n" + table.read_text(), flush=True)
    print(f"[memsweep] {len(jobs)} estimate(s) in {time.perf_counter() - started:.1f} s: {table}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
