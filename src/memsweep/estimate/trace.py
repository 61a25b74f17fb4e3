"""The trace: one warm-up and one measured training step of the job's real composed model (the same
Plan, model class, technique transforms and optimizer class as a real job) on fake tensors (torch's
FakeTensorMode: shapes and dtypes, no storage), measured by the same LedgerTracker (torch's
MemTracker) as real jobs. No weights, no data, no GPU; on the CPU it reproduces the measured ledger.
FLOPs come from torch's FlopCounterMode on the same step.
"""
import contextlib
import dataclasses
import inspect
import tempfile
import time
from typing import Any, Optional

import torch

from ..config.schema import Config, HardwareConf
from ..measure.ledger import LedgerTracker, inner_optimizer, ledger_reading
from ..techniques import optim
from . import capture, sharded


class Untraceable(Exception):
    """The trace cannot run this job; the message is the reason given with `method: closed_form`."""


def untraceable_reason(job: Config, plan) -> Optional[str]:
    t = plan.techniques
    if t.lora.quantize == "int8" and plan.device == "cuda":
        # On a CPU bitsandbytes trains 8-bit layers by dequantizing the weight (MatMul8bitFp), which traces
        return "LLM.int8 on a GPU (MatMul8bitLt) splits out outlier columns found in the values: no fake kernel"
    if t.deepspeed.on:
        return "DeepSpeed's engine partitions and casts the model itself; it cannot run on fake tensors"
    if t.fsdp.offload:
        return "FSDP's CPU offload keeps parameters in host memory, which a trace on the CPU cannot tell apart"
    if t.fsdp.on and t.lora.quantize is not None:
        return "FSDP with bitsandbytes-quantized layers is not traced"
    if t.offload.activations:
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
        if torch.is_autocast_enabled("cpu"):  # autocast casts F.scaled_dot_product_attention's inputs, not the op's
            dtype = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(dtype) for t in (query, key, value))
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
                    params[id(p)].__dict__.update(p.__dict__)  # a bitsandbytes weight's quantization settings
                module._parameters[name] = params[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b)
    model.train()
    return model


def training_arguments(plan, keys: tuple[str, ...]):
    """TrainingArguments of the plan's `keys`, on the CPU: what Trainer derives from them."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none",
                             **{k: plan.args[k] for k in keys if k in plan.args})


def optimizer_spec(plan, model):
    """(optimizer class, its kwargs, the TrainingArguments) as Trainer would choose them."""
    from transformers import Trainer

    args = training_arguments(plan, ("optim", "optim_args", "learning_rate", "weight_decay"))
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls, kwargs, args


def build_optimizer(plan, model, profile: HardwareConf, spec):
    """The optimizer Trainer.create_optimizer would build: its class, kwargs and parameter groups
    (`spec`: optimizer_spec's answer, asked before the model is sharded)."""
    from transformers import Trainer

    cls, kwargs, args = spec
    decay = set(Trainer.get_decay_parameter_names(None, model))  # does not use `self`
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    # On a GPU torch's optimizers default to their foreach kernels, whose temporaries span a whole
    # parameter group (on the CPU: one tensor at a time). Ask for what the profile's device would do.
    if profile.device == "cuda" and "foreach" in inspect.signature(cls).parameters and "fused" not in kwargs:
        kwargs = {**kwargs, "foreach": True}
    if not cls.__module__.startswith("bitsandbytes"):
        return cls(groups, **kwargs)
    return bitsandbytes_optimizer(cls, groups, kwargs, model)


def bitsandbytes_optimizer(cls, groups, kwargs, model):
    """A bitsandbytes optimizer on fake parameters, as Trainer.create_optimizer builds it. Its step runs
    on fake tensors (every bitsandbytes op has a fake kernel); only its constructor computes values, the
    two 256-entry quantization maps, so it runs outside fake mode and the maps become fake tensors."""
    from bitsandbytes.optim import GlobalOptimManager
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    fake_mode = next(model.parameters()).fake_mode
    with unset_fake_temporarily():
        optimizer = cls(groups, **kwargs)
    optimizer.name2qmap = {k: fake_mode.from_tensor(v) for k, v in optimizer.name2qmap.items()}
    if kwargs.get("optim_bits") == 8:  # Trainer keeps every embedding's state in 32 bits
        manager = GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return optimizer


def fake_batch(model, micro_batch: int, seq_len: int, task: str) -> dict[str, torch.Tensor]:
    """A collated batch of seq_len tokens, as the ledger step gets (values do not matter on fake tensors):
    a label per sequence (classification) or per token (causal_lm)."""
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long)
    labels = torch.zeros_like(ids) if task == "causal_lm" else torch.zeros(micro_batch, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    if task != "causal_lm" and getattr(model.config, "type_vocab_size", 0):  # BERT tokenizers return token types, DistilBERT's none
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def training_step(model, optimizer, batches, plan, max_grad_norm: float, accumulation: int,
                  around_micro_batches=contextlib.nullcontext) -> None:
    """What MemsweepTrainer does between on_step_begin and on_step_end for one optimizer step (its own
    fp16 autocast on the CPU wraps the whole call, see trainer.py; Accelerate's is in model.forward)."""
    dtype = plan.autocast_dtype
    with around_micro_batches():
        for n, batch in enumerate(batches):
            with sharded.no_sync(model, sync=n == len(batches) - 1):
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
    """Bytes of optimizer state, each tensor once (measure.optimizer_state_bytes dedupes by data pointer,
    which is 0 for every fake tensor; bitsandbytes gives every parameter's state the same two maps)."""
    unique = {id(v): sharded.local(v) for s in inner_optimizer(optimizer).state.values() for v in s.values()
              if torch.is_tensor(v)}  # FSDP's: this rank's shard
    return sum(v.untyped_storage().nbytes() for v in unique.values())


@contextlib.contextmanager
def on_fake_tensors(model, plan, profile: HardwareConf):
    """The meta model on fake CPU tensors, autocast as Accelerate applies it, and for a CUDA profile
    the GPU's kernels: what the trace and the FLOP count both run under."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    # FSDP's sharded parameters (DTensors on meta) are made fake by to_empty, which reads the meta ones
    is_sharded = any(isinstance(p, DTensor) for p in model.parameters())
    fake_mode = FakeTensorMode(allow_non_fake_inputs=is_sharded)
    if not is_sharded:
        model = to_fake(model, fake_mode)
    if (dtype := accelerate_dtype(plan)) is not None:
        model = autocast_like_accelerate(model, dtype)
    kernels = cuda_kernels() if profile.device == "cuda" else contextlib.nullcontext()
    with torch.random.fork_rng(), fake_mode, kernels:
        if is_sharded:
            model.to_empty(device="cpu").train()
        quantize_bitsandbytes(model)
        yield model


def quantize_bitsandbytes(model) -> None:
    """Quantize each bitsandbytes layer's fake weight as Params4bit / Int8Params do when moved to a
    device (their _quantize), with bitsandbytes' own ops, whose fake kernels give the packed shapes. A
    tensor subclass cannot wrap a fake tensor, so the weight becomes a frozen Parameter carrying what
    the layer's forward reads: quant_state (4-bit); CB and SCB (8-bit)."""
    import sys

    if "bitsandbytes" not in sys.modules:  # nothing of it in the model
        return
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(module, bnb.nn.Linear4bit):
            packed, state = F.quantize_4bit(w, blocksize=w.blocksize, compress_statistics=w.compress_statistics,
                                            quant_type=w.quant_type, quant_storage=w.quant_storage)
            module.weight = torch.nn.Parameter(packed, requires_grad=False)
            module.weight.quant_state = module.quant_state = state
        elif isinstance(module, bnb.nn.Linear8bitLt):
            CB, SCB, _ = F.int8_vectorwise_quant(w.to(torch.float16))
            module.weight = torch.nn.Parameter(CB, requires_grad=False)
            module.weight.__dict__.update(CB=CB, SCB=SCB, has_fp16_weights=False)


def trace(job: Config, profile: HardwareConf, plan, model) -> dict[str, Any]:
    """The ledger of one training step of `model` (a meta model, see arch.meta_model) on fake tensors,
    as LedgerCallback takes it on a real job, and its FLOPs. Raises Untraceable."""
    from torch.utils.flop_counter import FlopCounterMode

    started = time.perf_counter()
    if (reason := untraceable_reason(job, plan)) is not None:
        raise Untraceable(reason)
    mb, acc = plan.micro_batch_size, plan.accumulation_steps
    # TrainingArguments asked for outside the fake process group (inside, they warn it is not theirs)
    spec = optimizer_spec(plan, model)
    with contextlib.ExitStack() as stack:
        if plan.techniques.fsdp.on:  # rank 0 of nproc, wrapped as Accelerate wraps the real job
            args = training_arguments(plan, ("fsdp", "fsdp_config", "bf16", "fp16"))
            stack.enter_context(sharded.fake_process_group(plan.nproc))
            model = sharded.shard(model, args.fsdp_plugin_args, accelerate_dtype(plan))
        model = stack.enter_context(on_fake_tensors(model, plan, profile))
        stack.enter_context(optim.own_bitsandbytes_overrides())
        optimizer = build_optimizer(plan, model, profile, spec)
        # Warm-up, as the real ledger's step 1: one micro-batch and an optimizer step, which leaves the
        # optimizer state behind. Its FLOPs are counted here: FlopCounterMode must not run inside the
        # measured step (under checkpointing it keeps recomputed activations alive: a false peak).
        flops = FlopCounterMode(display=False)
        training_step(model, optimizer, [fake_batch(model, mb, job.max_seq_len, plan.task)], plan, job.optim.max_grad_norm,
                      acc, lambda: flops)
        # The measured step. Micro-batches after the second repeat the second one exactly (all
        # gradients alive, the same activations), so two stand for any number.
        batches = [fake_batch(model, mb, job.max_seq_len, plan.task) for _ in range(min(acc, 2))]
        tracker = LedgerTracker(root=model)
        tracker.track_external(model, optimizer)
        # On a GPU profile the same step's allocations and frees also go through the model of the
        # CUDA caching allocator: what the GPU reserves for them (capture.py, allocator.py).
        recorder = (capture.Recorder(capture.alive_at_step(model, inner_optimizer(optimizer)))
                    if profile.device == "cuda" else contextlib.nullcontext())
        with tracker, recorder:
            training_step(model, optimizer, batches, plan, job.optim.max_grad_norm, acc)
        reading = {
            **ledger_reading(tracker, state_bytes(optimizer)),
            "flops_per_step": flops.get_total_flops() * acc,
            "optimizer": type(optimizer).__name__,
        }
        if profile.device == "cuda":
            reading["allocator"] = capture.allocator_reading(recorder.events)
        return {**reading, "seconds": round(time.perf_counter() - started, 2)}


def count_flops(job: Config, profile: HardwareConf, plan, model) -> int:
    """FLOPs of a training step's forward and backward (FlopCounterMode on fake tensors), for jobs
    whose memory cannot be traced: the model without quantization, DeepSpeed or offload."""
    from torch.utils.flop_counter import FlopCounterMode

    plan = dataclasses.replace(plan, forward_contexts=[])
    with on_fake_tensors(model, plan, profile) as model:
        flops = FlopCounterMode(display=False)
        batch = fake_batch(model, plan.micro_batch_size, job.max_seq_len, plan.task)
        training_step(model, None, [batch], plan, 0, 1, lambda: flops)
    return flops.get_total_flops() * plan.accumulation_steps
