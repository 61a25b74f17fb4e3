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
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from . import estimate_formula, rules
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
    folder = cfg.path or embedded_minilm_path() if cfg.source == ModelSource.embedded else cfg.path
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


def compute_dtype(plan) -> Optional[torch.dtype]:
    """The autocast dtype a real job runs under: the plan's own, or Accelerate's for bf16/fp16 args."""
    if plan.autocast_dtype is not None:
        return plan.autocast_dtype
    if plan.args.get("bf16"):
        return torch.bfloat16
    if plan.args.get("fp16"):
        return torch.float16
    return None


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


def build_model(job: Config, plan, config):
    """The job's model class from its config (no weights, no init) with the plan's transforms."""
    import transformers.initialization as hf_init
    from transformers import AutoModelForSequenceClassification

    kwargs = {k: plan.load_kwargs[k] for k in ("attn_implementation", "dtype") if k in plan.load_kwargs}
    with hf_init.no_init_weights():  # initial values do not matter to memory, and take seconds on fake tensors
        model = AutoModelForSequenceClassification.from_config(config, **kwargs)
    model = plan.transform(model)
    model.train()
    return model


def build_optimizer(plan, model, profile: HardwareConf):
    """The optimizer class and parameter groups Trainer.create_optimizer would build."""
    from transformers import Trainer, TrainingArguments

    keys = ("optim", "optim_args", "learning_rate", "weight_decay")
    args = TrainingArguments(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none",
                             **{k: plan.args[k] for k in keys if k in plan.args})
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
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
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def training_step(model, optimizer, batches, plan, max_grad_norm: float, accumulation: int) -> None:
    """What MemsweepTrainer does between on_step_begin and on_step_end for one optimizer step."""
    dtype = compute_dtype(plan)
    for batch in batches:
        with contextlib.ExitStack() as stack:
            if dtype is not None:
                stack.enter_context(torch.autocast("cpu", dtype=dtype))
            for make_context in plan.forward_contexts:
                stack.enter_context(make_context())
            loss = model(**batch).loss
        loss = loss / accumulation
        if dtype == torch.float16:
            loss = loss * 65536.0  # GradScaler's scaling (its bookkeeping tensors are a few bytes)
        loss.backward()
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


def trace(job: Config, profile: HardwareConf, plan=None) -> dict[str, Any]:
    """The ledger of one training step of the job on fake tensors (raises Untraceable)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from .measure import CATEGORIES, LedgerTracker
    from .train_loop import build_plan

    started = time.perf_counter()
    plan = plan or build_plan(job, profile)
    if (reason := untraceable_reason(job, plan)) is not None:
        raise Untraceable(reason)
    config, source = model_config(job.model, num_labels(job))
    kernels = cuda_kernels() if profile.device == "cuda" else contextlib.nullcontext()
    mb, acc = plan.micro_batch_size, plan.accumulation_steps
    with torch.random.fork_rng(), FakeTensorMode(), kernels:
        model = build_model(job, plan, config)
        optimizer = build_optimizer(plan, model, profile)
        max_norm = job.optim.max_grad_norm
        # Warm-up step (creates the optimizer state, as the real ledger's step 1 does), counting FLOPs.
        with FlopCounterMode(display=False) as flops:
            training_step(model, optimizer, [fake_batch(model, mb, job.max_seq_len)], plan, max_norm, acc)
        # The measured step. Micro-batches after the second repeat the second one exactly (all
        # gradients alive, the same activations), so two stand for any number.
        batches = [fake_batch(model, mb, job.max_seq_len) for _ in range(min(acc, 2))]
        tracker = LedgerTracker(root=model)
        tracker.track_external(model, optimizer)
        with tracker:
            training_step(model, optimizer, batches, plan, max_norm, acc)
        snaps = tracker.get_tracker_snapshot("peak")
        device = max(snaps, key=lambda d: snaps[d]["Total"])
        breakdown = {CATEGORIES[k]: v for k, v in snaps[device].items() if k in CATEGORIES}
        state = state_bytes(optimizer)
        # As the real ledger: what optimizer.step() allocates beyond its state is temporary.
        if breakdown.get("optimizer", 0) > state:
            breakdown["temp"] = breakdown.get("temp", 0) + breakdown["optimizer"] - state
            breakdown["optimizer"] = state
        params = list(model.parameters())
        return {
            "peak_bytes": snaps[device]["Total"],
            "breakdown": breakdown,
            "activations_bytes": tracker.saved_activations,
            "grads_bytes": tracker.category_max.get("Gradient", 0),
            "optimizer_bytes": state,
            "flops_per_step": flops.get_total_flops() * acc,
            "total_params": sum(p.numel() for p in params),
            "trainable_params": sum(p.numel() for p in params if p.requires_grad),
            "optimizer": type(optimizer).__name__,
            "architecture_source": source,
            "seconds": round(time.perf_counter() - started, 2),
        }
